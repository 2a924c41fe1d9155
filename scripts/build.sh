#!/usr/bin/env bash
# Configures and builds vramscope (Release) in build/: the CLI (build/cli/vramscope),
# the tests, and the Python package's engine module (build/python/vramscope/, so that
# PYTHONPATH=build/python imports `vramscope`). The module needs the Python headers and
# pybind11 (python3-dev, pybind11-dev: scripts/deps.sh); without them it is left out, with
# a note, and the tests of the Python package skip. VRAMSCOPE_PYTHON=ON or OFF decides.
# The web page (VRAMSCOPE_WEB: build-web/web/, docs/web.md) is built too when emscripten is
# installed; VRAMSCOPE_WEB=ON or OFF decides (ON without emscripten is an error).
set -euo pipefail
cd "$(dirname "$0")/.."
python=${VRAMSCOPE_PYTHON:-}
if [ -z "$python" ]; then
  if [ -d /usr/lib/cmake/pybind11 ] && [ -f "$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["include"])')/Python.h" ]; then
    python=ON
  else
    python=OFF
    echo "build.sh: no pybind11-dev / python3-dev (scripts/deps.sh): the Python module is left out" >&2
  fi
fi
web=${VRAMSCOPE_WEB:-}
if [ -z "$web" ]; then
  if command -v emcmake >/dev/null; then
    web=ON
  else
    web=OFF
    echo "build.sh: no emscripten (scripts/deps.sh): the web page is left out" >&2
  fi
fi
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DVRAMSCOPE_UNITY=ON \
  -DVRAMSCOPE_PYTHON="$python" -DVRAMSCOPE_WEB="$web" >/dev/null
cmake --build build -j "$(nproc)"
