#!/usr/bin/env bash
# Configures and builds vramscope (Release) in build/.
set -euo pipefail
cd "$(dirname "$0")/.."
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DVRAMSCOPE_UNITY=ON >/dev/null
cmake --build build -j "$(nproc)"
