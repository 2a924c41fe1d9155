# The web page (web/, docs/web.md) as part of the native build
# (VRAMSCOPE_WEB): a second CMake build of this project under emscripten
# (VRAMSCOPE_WASM, cmake/wasm.cmake), configured with emcmake in build-web/,
# the folder scripts/build_web.sh uses too, so the page has one place however
# it was built. scripts/build.sh turns the option on when emscripten is
# installed. It starts once the vramscope executable is linked, so the two
# builds do not both fill the machine from the start.
find_program(VS_EMCMAKE emcmake)
if(NOT VS_EMCMAKE)
  message(FATAL_ERROR "VRAMSCOPE_WEB needs emscripten (apt-get install emscripten, scripts/deps.sh)")
endif()
include(ExternalProject)
# Debian's emscripten runs its JavaScript tools with `node`; a Node.js that is
# not Debian's (NodeSource) does not look in Debian's module folder.
set(vs_web_env ${CMAKE_COMMAND} -E env NODE_PATH=/usr/share/nodejs)
ExternalProject_Add(web_page_wasm
  SOURCE_DIR ${PROJECT_SOURCE_DIR}
  BINARY_DIR ${PROJECT_SOURCE_DIR}/build-web
  CONFIGURE_COMMAND ${vs_web_env} ${VS_EMCMAKE} ${CMAKE_COMMAND} -S <SOURCE_DIR> -B <BINARY_DIR>
                    -G Ninja -DCMAKE_BUILD_TYPE=Release -DVRAMSCOPE_WASM=ON
                    -DVRAMSCOPE_UNITY=${VRAMSCOPE_UNITY}
  BUILD_COMMAND ${vs_web_env} ${CMAKE_COMMAND} --build <BINARY_DIR>
  INSTALL_COMMAND ""
  BUILD_ALWAYS ON
  DEPENDS vramscope)
