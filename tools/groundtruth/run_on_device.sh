#!/usr/bin/env bash
# Runs the smoke grid, then the main grid, within one global time budget,
# and prints a summary. Meant for a GPU box with torch + transformers + peft
# installed and no network; run from anywhere:
#
#   tools/groundtruth/run_on_device.sh [OUTDIR]
#
# OUTDIR defaults to $OUT (the device tool's result folder) or ./groundtruth-out.
# Environment knobs:
#   GT_GRID       the main grid's name in grids/ (default "default"; "quick" for
#                 a short lease)
#   GT_BUDGET_S   total seconds for both grids (default 1320 = 22 min)
#   GT_TIMEOUT_S  per-configuration timeout (default 300)
#   GT_SNAPSHOTS  globs (comma-separated) of main-grid configurations whose step-2
#                 memory snapshot is kept (default: the smoke grid's three; "none"
#                 for no snapshots; at most 3 come back, the device tool's file limit)
#   GT_SNAPSHOT_FROM_STEP  1: snapshots record steps 1 and 2 (how step 1 laid out the
#                 cache that step 2 reuses); 0: from before the setup; default: step 2 only
# For the next lease's prepared grids, see next_lease.sh instead.
#   GT_OVERLAP    1 (default): start each worker while the previous one measures,
#                 so imports overlap GPU work (measure.py --overlap); 0: one at a time
#   PYTHON        interpreter with torch (default python3)
#
# Writes at most 7 files (the device tool returns 8): log.txt, smoke.jsonl,
# <grid>.jsonl, summary.txt and up to 3 snapshot pickles (gzipped when larger
# than 15 MiB). A configuration that fails, OOMs or times out is a result, so
# the script goes on; it exits non-zero only if a grid could not run at all, or
# when no smoke configuration measured (then the main grid is not started: the
# log says why, and the lease is not spent on a broken harness).
set -u

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
out="${1:-${OUT:-$PWD/groundtruth-out}}"
budget="${GT_BUDGET_S:-1320}"
timeout="${GT_TIMEOUT_S:-300}"
python="${PYTHON:-python3}"
grid="${GT_GRID:-default}"
overlap_args=(--overlap)
[ "${GT_OVERLAP:-1}" = "0" ] && overlap_args=()
snap_dir="$out/snapshots"
mkdir -p "$out"
log="$out/log.txt"
start=$(date +%s)
export PYTHONUNBUFFERED=1

remaining() { echo $(( budget - ($(date +%s) - start) )); }

{
  echo "== $(date -u +%Y-%m-%dT%H:%M:%SZ) vramscope ground truth, budget ${budget}s"
  nvidia-smi 2>&1 || echo "(no nvidia-smi)"
  "$python" -c 'import sys, torch; print("python", sys.version.split()[0], "torch", torch.__version__, "cuda", torch.version.cuda, torch.cuda.is_available())' 2>&1
} >>"$log"

snap_args=()
if [ "${GT_SNAPSHOTS:-}" != "none" ]; then
  snap_args=(--snapshot "$snap_dir" --snapshot-max-entries 20000)
  [ -n "${GT_SNAPSHOT_FROM_STEP:-}" ] && snap_args+=(--snapshot-from-step "$GT_SNAPSHOT_FROM_STEP")
fi

status=0
run_grid() {  # name, extra args...
  local name="$1"; shift
  local left; left=$(remaining)
  if [ "$left" -lt 60 ]; then
    echo "== skipping $name grid: ${left}s left" | tee -a "$log"
    return
  fi
  echo "== $name grid, ${left}s left" | tee -a "$log"
  "$python" "$here/measure.py" --grid "$here/grids/$name.toml" --out "$out/$name.jsonl" \
      --resume --timeout-per-config "$timeout" --time-budget "$left" "${overlap_args[@]}" "$@" \
      2>&1 | tee -a "$log"
  local rc=${PIPESTATUS[0]}
  if [ "$rc" -ne 0 ]; then
    echo "== $name grid: measure.py exited $rc" | tee -a "$log"
    status=1
  fi
}

smoke_measured() {  # at least one smoke configuration ended "ok" or "oom"
  grep -qE '"status": "(ok|oom)"' "$out/smoke.jsonl" 2>/dev/null
}

if [ "${GT_SNAPSHOTS:-}" = "none" ] || [ -n "${GT_SNAPSHOTS:-}" ]; then
  run_grid smoke
else
  run_grid smoke "${snap_args[@]}"
fi
if ! smoke_measured; then
  echo "== no smoke configuration measured: the $grid grid is not started" | tee -a "$log"
  status=1
elif [ "${GT_SNAPSHOTS:-}" = "none" ] || [ -z "${GT_SNAPSHOTS:-}" ]; then
  run_grid "$grid"
else
  only_args=()
  IFS=',' read -r -a snap_globs <<<"$GT_SNAPSHOTS"
  for g in "${snap_globs[@]}"; do only_args+=(--snapshot-only "$g"); done
  run_grid "$grid" "${snap_args[@]}" "${only_args[@]}"
fi

# Keep every returned file under the device tool's 16 MiB limit.
if [ -d "$snap_dir" ]; then
  for f in "$snap_dir"/*.pickle; do
    [ -e "$f" ] || continue
    if [ "$(stat -c %s "$f")" -gt $((15 * 1024 * 1024)) ]; then gzip -9 "$f"; fi
  done
fi

files=()
for f in "$out/smoke.jsonl" "$out/$grid.jsonl"; do [ -e "$f" ] && files+=("$f"); done
if [ "${#files[@]}" -gt 0 ]; then
  "$python" "$here/measure.py" --summarize "${files[@]}" | tee "$out/summary.txt"
fi
echo "== finished in $(( $(date +%s) - start ))s; results in $out" | tee -a "$log"
exit "$status"
