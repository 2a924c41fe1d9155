# vs_check_build_deps(): for `pip install .` (scikit-build-core sets SKBUILD), the
# Debian packages the build needs, checked before the find_package calls fail one by
# one with CMake's generic message. Missing ones are named with the command that
# installs them; with VRAMSCOPE_INSTALL_DEPS=1 in the environment they are installed
# (scripts/deps.sh --build) and the check runs again.
function(vs_missing_build_deps out)
  set(missing "")
  # package to look for -> Debian package
  foreach(pair "nlohmann_json:nlohmann-json3-dev" "fmt:libfmt-dev" "CLI11:libcli11-dev"
               "CURL:libcurl4-openssl-dev")
    string(REPLACE ":" ";" pair "${pair}")
    list(GET pair 0 cmake_name)
    list(GET pair 1 debian_name)
    find_package(${cmake_name} QUIET)
    if(NOT ${cmake_name}_FOUND)
      list(APPEND missing ${debian_name})
    endif()
  endforeach()
  if(VRAMSCOPE_PYTHON)
    find_package(Python 3.8 COMPONENTS Interpreter Development.Module QUIET)
    if(NOT Python_Development.Module_FOUND)
      list(APPEND missing python3-dev)
    endif()
  endif()
  set(${out} "${missing}" PARENT_SCOPE)
endfunction()

function(vs_check_build_deps)
  if(NOT SKBUILD)
    return()  # scripts/build.sh: scripts/deps.sh ran first
  endif()
  vs_missing_build_deps(missing)
  if(NOT missing)
    return()
  endif()
  list(JOIN missing " " names)
  if(NOT "$ENV{VRAMSCOPE_INSTALL_DEPS}" STREQUAL "1")
    message(FATAL_ERROR
            "vramscope: the build needs these Debian packages: ${names}. Install them with "
            "scripts/deps.sh --build (or sudo apt-get install ${names}), or run "
            "VRAMSCOPE_INSTALL_DEPS=1 pip install . to have pip's build install them.")
  endif()
  message(STATUS "vramscope: installing ${names} (VRAMSCOPE_INSTALL_DEPS=1)")
  execute_process(COMMAND ${PROJECT_SOURCE_DIR}/scripts/deps.sh --build RESULT_VARIABLE code)
  vs_missing_build_deps(still_missing)
  if(NOT code EQUAL 0 OR still_missing)
    message(FATAL_ERROR "vramscope: after scripts/deps.sh --build (exit ${code}) CMake still "
                        "does not find: ${still_missing}")
  endif()
endfunction()
