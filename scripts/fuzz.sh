#!/usr/bin/env bash
# Builds every libFuzzer target (each fuzz_* target of a VRAMSCOPE_FUZZ build)
# with clang in build-fuzz/ and runs each for FUZZ_SECONDS on a temporary copy
# of its seed corpus, so the committed corpus is never modified. Fails when a
# target crashes, leaks, exceeds its memory limit or hangs on an input, and
# prints where that input was saved and how to replay it.
#
#   scripts/fuzz.sh                                    # every target, 60 s each
#   scripts/fuzz.sh fuzz_groundtruth fuzz_cli_flags    # only these
#   FUZZ_SECONDS=3600 FUZZ_KEEP_CORPUS=1 scripts/fuzz.sh fuzz_event_reader
#   scripts/fuzz.sh --long                             # the long run, below
#
# --long: every target (or those named) for an hour each (FUZZ_SECONDS
# 3600), two at a time (FUZZ_JOBS 2: this project's machine has two cores),
# grown corpora kept; at the end a summary for docs/hardening.md ("Last long
# run": date, inputs executed, coverage, findings) is printed and written to
# $FUZZ_BUILD_DIR/fuzz-long-summary.md. With 8 targets that is about 4 hours.
#
# Environment (defaults): FUZZ_SECONDS (60) per target; FUZZ_JOBS (nproc)
# targets at once; FUZZ_RSS_MB (2048) memory limit per target; FUZZ_TIMEOUT
# (20) seconds one input may take; FUZZ_BUILD_DIR (build-fuzz);
# FUZZ_KEEP_CORPUS=1 keeps the grown corpora (path printed) instead of
# deleting them. Longer runs and triage: docs/hardening.md.
set -euo pipefail
cd "$(dirname "$0")/.."

long=0
if [ "${1:-}" = --long ]; then
  shift
  long=1
  FUZZ_SECONDS=${FUZZ_SECONDS:-3600}
  FUZZ_JOBS=${FUZZ_JOBS:-2}
  FUZZ_KEEP_CORPUS=${FUZZ_KEEP_CORPUS:-1}
fi
seconds=${FUZZ_SECONDS:-60}
jobs=${FUZZ_JOBS:-$(nproc)}
rss_mb=${FUZZ_RSS_MB:-2048}
timeout_s=${FUZZ_TIMEOUT:-20}
build=${FUZZ_BUILD_DIR:-build-fuzz}

# Seed corpus and dictionary of target fuzz_NAME: fuzz/corpus/NAME and
# fuzz/NAME.dict, else the same without a trailing "_reader".
seed_dir() {
  local base=${1#fuzz_}
  for d in "fuzz/corpus/$base" "fuzz/corpus/${base%_reader}"; do
    if [ -d "$d" ]; then echo "$d"; return 0; fi
  done
  return 0
}
dict_file() {
  local base=${1#fuzz_}
  for f in "fuzz/$base.dict" "fuzz/${base%_reader}.dict"; do
    if [ -f "$f" ]; then echo "$f"; return 0; fi
  done
  return 0
}
# Longest input worth trying, per reader: a few records, a config, a header.
max_len() {
  case $1 in
    fuzz_cli_flags | fuzz_grid) echo 512 ;;
    fuzz_python_api) echo 1024 ;;
    fuzz_groundtruth) echo 8192 ;;
    fuzz_event_reader | fuzz_model_config | fuzz_safetensors | fuzz_diffusion_config) echo 16384 ;;
    *) echo 65536 ;;
  esac
}

# A build dir already configured for fuzzing (build-asan from
# scripts/test_sanitize.sh, in CI) is used as it is; otherwise configure one
# with only what the fuzz targets need.
if ! grep -qs '^VRAMSCOPE_FUZZ:BOOL=ON$' "$build/CMakeCache.txt"; then
  CC=clang CXX=clang++ cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O1 -g" -DVRAMSCOPE_FUZZ=ON \
    -DVRAMSCOPE_TESTS=OFF -DVRAMSCOPE_BENCH=OFF -DVRAMSCOPE_UNITY=ON >/dev/null
fi
mapfile -t all_targets < <(ninja -C "$build" -t targets all |
  sed -n 's/^\(fuzz_[A-Za-z0-9_]*\): phony$/\1/p' | sort -u)
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=("${all_targets[@]}")
if [ ${#targets[@]} -eq 0 ]; then
  echo "fuzz.sh: no fuzz_* targets in $build" >&2
  exit 1
fi
for t in "${targets[@]}"; do
  if ! printf '%s\n' "${all_targets[@]}" | grep -qx "$t"; then
    echo "fuzz.sh: no target $t (have: ${all_targets[*]})" >&2
    exit 1
  fi
done
cmake --build "$build" -j "$(nproc)" --target "${targets[@]}"

work=$(mktemp -d "${TMPDIR:-/tmp}/vramscope-fuzz.XXXXXX")
if [ "${FUZZ_KEEP_CORPUS:-0}" != 1 ]; then trap 'rm -rf "$work"' EXIT; fi
artifacts="$PWD/$build/fuzz-artifacts"
mkdir -p "$artifacts"

run_one() {
  local t=$1 bin seeds dict corpus log
  bin=$(find "$build" -type f -name "$t" -perm -u+x | head -n 1)
  seeds=$(seed_dir "$t")
  dict=$(dict_file "$t")
  corpus="$work/$t"
  log="$work/$t.log"
  rm -rf "${artifacts:?}/$t"
  mkdir -p "$corpus" "$artifacts/$t"
  if [ -n "$seeds" ]; then cp -R "$seeds/." "$corpus/"; fi
  local args=(-max_total_time="$seconds" -timeout="$timeout_s" -rss_limit_mb="$rss_mb"
              -max_len="$(max_len "$t")" -print_final_stats=1
              -artifact_prefix="$artifacts/$t/")
  [ -z "$dict" ] || args+=(-dict="$dict")
  local rc=0
  "$bin" "${args[@]}" "$corpus" >"$log" 2>&1 || rc=$?
  echo "$rc" >"$work/$t.rc"
}

# Up to $jobs targets at once.
for t in "${targets[@]}"; do
  while [ "$(jobs -rp | wc -l)" -ge "$jobs" ]; do wait -n || true; done
  echo "fuzz.sh: $t for ${seconds}s (seeds: $(seed_dir "$t"))"
  run_one "$t" &
done
wait

failed=0
summary="$build/fuzz-long-summary.md"
if [ "$long" = 1 ]; then
  {
    echo "Long fuzz run of $(date -u +%Y-%m-%d) (commit $(git rev-parse --short HEAD 2>/dev/null || echo ?)),"
    echo "${seconds} s per target, ${jobs} at a time, on $(nproc) cores:"
    echo
    echo "| target | inputs executed | coverage (libFuzzer cov / ft) | findings |"
    echo "|---|---|---|---|"
  } >"$summary"
fi
for t in "${targets[@]}"; do
  rc=$(cat "$work/$t.rc")
  log="$work/$t.log"
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -n 1)
  speed=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" | tail -n 1)
  # The last status line libFuzzer printed: "#N DONE cov: C ft: F corp: ...".
  cov=$(grep -Eo 'cov: [0-9]+ ft: [0-9]+' "$log" | tail -n 1 || true)
  if [ "$long" = 1 ]; then
    findings=none
    [ "$rc" = 0 ] || findings="exit $rc, see $artifacts/$t"
    echo "| \`$t\` | ${execs:-?} | ${cov:-?} | $findings |" >>"$summary"
  fi
  if [ "$rc" = 0 ]; then
    echo "fuzz.sh: $t: ok, ${execs:-?} inputs (${speed:-?}/s), ${cov:-coverage ?}"
    continue
  fi
  failed=1
  echo "fuzz.sh: $t: FAILED (exit $rc) after ${execs:-?} inputs; the end of its log:" >&2
  tail -n 60 "$log" >&2
  bin=$(find "$build" -type f -name "$t" -perm -u+x | head -n 1)
  for f in "$artifacts/$t"/*; do
    [ -e "$f" ] || continue
    echo "fuzz.sh: $t: input saved at $f; replay: $bin $f" >&2
  done
done
if [ "${FUZZ_KEEP_CORPUS:-0}" = 1 ]; then echo "fuzz.sh: grown corpora and logs kept in $work"; fi
if [ "$long" = 1 ]; then
  cat "$summary"
  echo "fuzz.sh: summary written to $summary (copy it into docs/hardening.md, \"Last long run\")"
fi
exit "$failed"
