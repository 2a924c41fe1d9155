#!/usr/bin/env bash
# Installs the Debian 12 packages vramscope needs to build and test, if any is
# missing. Every dependency comes from Debian; nothing is downloaded elsewhere.
#   scripts/deps.sh           everything: build, tests, sanitizers, fuzzers
#   scripts/deps.sh --build   only what `pip install .` needs (the compiler, the C++
#                             libraries, the Python headers); pip's build runs this itself
#                             with VRAMSCOPE_INSTALL_DEPS=1 (cmake/build_deps.cmake)
set -euo pipefail
build_packages=(
  g++ nlohmann-json3-dev libcli11-dev libfmt-dev libcurl4-openssl-dev libyaml-dev python3-dev
)
packages=(
  cmake ninja-build g++ pkg-config
  clang libclang-rt-14-dev  # libFuzzer and the sanitizer runtimes (a Recommends of clang)
  clang-format-14  # scripts/format.sh: the C++ sources follow .clang-format
  nlohmann-json3-dev libcli11-dev libfmt-dev libcurl4-openssl-dev
  libyaml-dev  # --from reads accelerate's config YAML (optional: cli/CMakeLists.txt)
  libgtest-dev libgmock-dev libbenchmark-dev
  python3 python3-pytest python3-torch python3-torchvision
  python3-dev pybind11-dev  # the Python package's engine module (python/core/)
  python3-venv  # the wheel's smoke test installs it into a fresh virtual environment
  chromium  # headless browser: tests/html_test.py renders the HTML reports offline
  emscripten  # the web page's engine in WebAssembly (optional: scripts/build_web.sh, web/)
)
if [ "${1:-}" = "--build" ]; then
  packages=("${build_packages[@]}")
fi
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "Installing: ${missing[*]}"
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
