#!/usr/bin/env bash
# Builds the web page (web/, docs/web.md) in build-web/: the engine compiled to
# WebAssembly with Debian's emscripten (scripts/deps.sh installs it), and the
# page's files beside it. Open build-web/web/index.html in a browser (file://
# is fine: no server, no network). scripts/build.sh builds the same folder
# through the native build (cmake/web_page.cmake); this script is the page
# alone. Without emscripten it says so and exits 0; VRAMSCOPE_WEB=ON makes
# that an error.
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v emcmake >/dev/null; then
  echo "build_web.sh: no emscripten (apt-get install emscripten): the web page is left out" >&2
  [ "${VRAMSCOPE_WEB:-}" != "ON" ] || exit 1
  exit 0
fi
# Debian's emscripten runs its JavaScript tools (acorn) with `node`; a Node.js
# that is not Debian's (NodeSource) does not look in Debian's module folder.
export NODE_PATH=/usr/share/nodejs${NODE_PATH:+:$NODE_PATH}
emcmake cmake -S . -B build-web -G Ninja -DCMAKE_BUILD_TYPE=Release -DVRAMSCOPE_WASM=ON \
  -DVRAMSCOPE_UNITY=ON >/dev/null
cmake --build build-web -j "$(nproc)"
echo "build_web.sh: open build-web/web/index.html"
