# The WebAssembly build of the engine for the web page (web/, docs/web.md):
# configured by scripts/build_web.sh with Debian's emscripten (emcmake) in
# build-web/, never by the native build. Only the shell-independent stages
# and the CLI's command declarations are compiled; the disk stays native in
# spirit (the page hands its files in memory) and libcurl is left out (the
# browser fetches from the Hub itself).
#
# Why imported targets by hand: emscripten's toolchain file confines
# find_package to its own sysroot, where Debian's CMake packages of
# nlohmann_json, fmt and CLI11 are not. All three are used as headers only
# (fmt through FMT_HEADER_ONLY), so a folder of links to exactly those header
# directories is enough, without putting the host's /usr/include (glibc's
# headers) on the wasm compiler's path.
set(vs_wasm_include ${PROJECT_BINARY_DIR}/host-include)
file(MAKE_DIRECTORY ${vs_wasm_include})
foreach(dir nlohmann fmt CLI)
  if(NOT EXISTS /usr/include/${dir})
    message(FATAL_ERROR "vramscope (wasm): /usr/include/${dir} is missing (scripts/deps.sh)")
  endif()
  file(CREATE_LINK /usr/include/${dir} ${vs_wasm_include}/${dir} SYMBOLIC)
endforeach()
foreach(target nlohmann_json::nlohmann_json fmt::fmt CLI11::CLI11 Threads::Threads)
  add_library(${target} INTERFACE IMPORTED GLOBAL)
endforeach()
foreach(target nlohmann_json::nlohmann_json fmt::fmt CLI11::CLI11)
  set_target_properties(${target} PROPERTIES INTERFACE_INCLUDE_DIRECTORIES ${vs_wasm_include})
endforeach()
set_target_properties(fmt::fmt PROPERTIES INTERFACE_COMPILE_DEFINITIONS FMT_HEADER_ONLY=1)
# Threads::Threads stays empty: without -pthread (which needs
# SharedArrayBuffer, and so cross-origin isolation a file:// page cannot
# have) std::thread is served by web/engine/no_threads.cc.
# libc++ 13 (emscripten 3.1.6) lacks floating-point std::from_chars and
# std::make_unique_for_overwrite: web/engine/libcxx13_compat.h supplies them.
add_compile_options(-include ${PROJECT_SOURCE_DIR}/web/engine/libcxx13_compat.h)
# Exceptions are linked in (the link of web/CMakeLists.txt passes
# -fexceptions): CLI11 and nlohmann_json report bad input by throwing, and the
# CLI's commands, the ingest readers and the snapshot readers catch.
# emscripten's exceptions are JavaScript-based here (the prebuilt libc++ of
# Debian's emscripten has no wasm-exceptions variant, and its cache is
# frozen), which costs every call that may throw in a TU compiled with
# -fexceptions a trip through JavaScript (a Llama-3-70B estimate took 120 ms
# with every target so compiled, 44 ms without). So only the targets that
# catch compile with it
# (web/CMakeLists.txt); the hot stages (events, alloc, sim, device, report,
# lower) catch nothing, and an exception thrown through them still reaches
# the catching caller (without running their destructors: a leak, on a path
# that is already a failure).
# libc++ 13 has no <memory_resource> (std::pmr came with libc++ 16): the
# subset src/alloc uses, with the standard's names (web/engine/compat/).
include_directories(BEFORE SYSTEM ${PROJECT_SOURCE_DIR}/web/engine/compat)
