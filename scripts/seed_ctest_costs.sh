#!/usr/bin/env bash
# scripts/seed_ctest_costs.sh BUILD_DIR: in a build directory where ctest
# has not run yet, tell it that the end-to-end tests (cli_*: pytest over
# tests/*_test.py, minutes each on one core) are the costliest, so that
# `ctest -j N` starts them first and runs the short GoogleTest cases beside
# them, instead of starting them last with the other cores idle. Once ctest
# has run, it keeps its own measured costs (Testing/Temporary/CTestCostData.txt)
# and this does nothing.
set -euo pipefail
build=$1
cost="$build/Testing/Temporary/CTestCostData.txt"
[ ! -s "$cost" ] || exit 0
mkdir -p "$(dirname "$cost")"
{
  ctest --test-dir "$build" -N | sed -n 's/^ *Test *#[0-9]*: \(cli_[^ ]*\)$/\1 1 300/p'
  echo ---
} >"$cost"
