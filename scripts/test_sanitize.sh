#!/usr/bin/env bash
# The C++ suite and the end-to-end tests (ctest: GoogleTest binaries plus
# the cli_* tests, one per tests/*_test.py, run against the binary) under
# AddressSanitizer + UndefinedBehaviorSanitizer, in build-asan/. Any finding
# (memory error, leak, undefined behaviour) fails the test that hit it.
# Run by scripts/test.sh after the normal suite; docs/hardening.md.
#
# The build is clang's, with the fuzz targets on (VRAMSCOPE_FUZZ): their
# libraries are the same ASan + UBSan objects, so scripts/test.sh runs the
# fuzzers from this build (FUZZ_BUILD_DIR=build-asan) instead of compiling
# everything a third time. The coverage hooks that adds are no-ops here.
set -euo pipefail
cd "$(dirname "$0")/.."
# -O1 everywhere: reports stay readable, the tests run 2-3 times faster than
# at -O0 and the build takes 1.5 times as long. (Not -O0 for the test drivers
# alone: the linker keeps their unoptimized copy of each inline function,
# std::sort's say, for the libraries as well, and the tests run no faster.)
# Line tables for the stack traces; no -DNDEBUG, so assert()s (nlohmann_json's
# among them) are live. -no-pie: position-dependent executables start
# without processing ~600 000 relocations (sanitizer metadata), about 0.1 s
# less per run of vramscope, which the end-to-end tests start 2000 times.
start=$SECONDS
CC=clang CXX=clang++ cmake -S . -B build-asan -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O1 -gline-tables-only" -DCMAKE_EXE_LINKER_FLAGS=-no-pie \
  -DVRAMSCOPE_SANITIZE=ON -DVRAMSCOPE_FUZZ=ON -DVRAMSCOPE_BENCH=OFF -DVRAMSCOPE_UNITY=ON >/dev/null
cmake --build build-asan -j "$(nproc)"
echo "test_sanitize.sh: build: $((SECONDS - start)) s"
# Leaks fail like any other finding; UBSan stops at the first report (the
# build also passes -fno-sanitize-recover=undefined). No core dumps: a
# finding is a report on stderr, not a core of the whole shadow memory.
export ASAN_OPTIONS="detect_leaks=1:strict_string_checks=1:check_initialization_order=1:strict_init_order=1:detect_stack_use_after_return=1:disable_coredump=1${ASAN_OPTIONS:+:$ASAN_OPTIONS}"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1${UBSAN_OPTIONS:+:$UBSAN_OPTIONS}"
# tests/hostile_test.py: 5 s per hostile input becomes 15 s under ASan.
export VRAMSCOPE_TEST_TIME_FACTOR=3
scripts/seed_ctest_costs.sh build-asan  # the end-to-end tests first
start=$SECONDS
ctest --test-dir build-asan --output-on-failure -j "$(nproc)"
echo "test_sanitize.sh: ctest: $((SECONDS - start)) s"
