#!/usr/bin/env bash
# Configures and builds vramscope (Release) in build/: the CLI (build/cli/vramscope),
# the tests, and the Python package's engine module (build/python/vramscope/, so
# that PYTHONPATH=build/python imports `vramscope`; python3-dev and pybind11-dev,
# scripts/deps.sh). VRAMSCOPE_PYTHON=OFF scripts/build.sh leaves the module out.
set -euo pipefail
cd "$(dirname "$0")/.."
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DVRAMSCOPE_UNITY=ON \
  -DVRAMSCOPE_PYTHON="${VRAMSCOPE_PYTHON:-ON}" >/dev/null
cmake --build build -j "$(nproc)"
