#!/usr/bin/env bash
# Quick start, step 2: every test. Installs and builds first if needed, then
# runs the C++ suite (ctest, with the Python package's tests), the Python suites (pytest,
# real PyTorch on CPU), the wheel's smoke test in a fresh virtual environment and the
# fidelity grid (real transformers / PEFT training steps on CPU
# against the lowering, docs/fidelity.md); then the same C++ and end-to-end suite under AddressSanitizer +
# UndefinedBehaviorSanitizer (build-asan/), and every libFuzzer target for 60 s
# from that same build (docs/hardening.md). Any failure, sanitizer finding or
# fuzz crash fails the run. Each step prints how long it took.
set -euo pipefail
cd "$(dirname "$0")/.."

step() {
  local name=$1 start=$SECONDS
  shift
  "$@"
  echo "test.sh: $name: $((SECONDS - start)) s"
}

step deps scripts/deps.sh
# deps.sh installed emscripten: the web page must build and its test must run, not skip
# (scripts/build_web.sh, tests/web_test.py).
export VRAMSCOPE_WEB=ON
step format scripts/format.sh --check  # .clang-format
step python-env scripts/python_env.sh  # .venv/tf5, .venv/tf4: torch 2.13 (CPU), transformers, PEFT
step build scripts/build.sh
scripts/seed_ctest_costs.sh build  # the end-to-end tests first
step ctest ctest --test-dir build --output-on-failure -j "$(nproc)"
step pytest /usr/bin/python3 -m pytest -q python/tests tools/groundtruth/tests
step wheel scripts/wheel_smoke.sh  # pip wheel . -> a fresh venv: CLI, API, recorder
step fidelity .venv/tf5/bin/python -m pytest -q -p no:cacheprovider tools/reference/tests  # docs/fidelity.md
# The ground-truth harness's whole worker path with the real torch / transformers / PEFT /
# bitsandbytes on CPU (the pytest step's Debian Python lacks them and skips these).
step harness-cpu .venv/tf5/bin/python -m pytest -q -p no:cacheprovider tools/groundtruth/tests/test_worker_cpu.py
step sanitize scripts/test_sanitize.sh
step fuzz env FUZZ_BUILD_DIR=build-asan FUZZ_SECONDS=60 scripts/fuzz.sh
echo "test.sh: all passed in $SECONDS s"
