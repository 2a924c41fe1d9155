#!/usr/bin/env bash
# Quick start, step 2: every test. Installs and builds first if needed, then
# runs the C++ suite (ctest) and the Python suites (pytest, real PyTorch on CPU).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/deps.sh
scripts/build.sh
ctest --test-dir build --output-on-failure -j "$(nproc)"
/usr/bin/python3 -m pytest -q python/tests tools/groundtruth/tests
