#!/usr/bin/env bash
# The prepared script for the next GPU lease (issue 45): what only a GPU can show, in
# priority order, within one time budget (default 480 s), in ONE device call.
#
#   tools/groundtruth/carry_bitsandbytes.sh && tools/groundtruth/carry_deepspeed.sh   # here, once
#   device run: command "tools/groundtruth/next_lease.sh", timeout_s 560, carry [".bnb", ".ds"]
#   tools/groundtruth/next_lease.sh --dry-run        # any machine: every part's plans and
#                                                    # `vramscope estimate` commands (CI runs it)
#
# Parts (grids/*.toml; each a JSONL file that `vramscope validate` reads, appended as it
# goes, so a run cut off keeps what it measured):
#   1 cuda-rules  the CUDA-only rules without GPU evidence that the harness can drive: LoRA
#                 dropout (grids/cuda-rules.toml). TODO, not drivable by the harness yet:
#                 the SD-1.5-shaped UNet with group_norm under autocast and a FLUX block
#                 (diffusers models), T5 with half-precision cross-entropy (seq2seq),
#                 TRL's fused loss at several tiles (trl / liger-kernel), torchtune's
#                 rms_norm (torchtune's modules).
#   2 dist-ws1    DeepSpeed ZeRO-1/2/3 (± offload, ± zero.Init), FSDP1/FSDP2 (full, LoRA),
#                 DDP with world size 1 (grids/dist-ws1.toml; its knobs are not yet read by
#                 `vramscope validate`, hence a file of its own)
#   3 sdpa        SDPA at head dims 64/96/128/256, fp32/bf16, with and without GQA and dropout
#   4 bert        BERT-family training with dropout, eager and SDPA
#   5 gaps        the open gaps of docs/groundtruth.md, with snapshots of steps 1-2, then
#                 QLoRA's load-time peak with a snapshot from the setup (gaps-setup.toml)
# Each part has a cap (seconds); time a part leaves unused goes to the parts after it, and
# no configuration starts once the whole budget is spent.
#
# Options and environment:
#   --dry-run | NL_DRY_RUN=1   print the plan of every part and exit (no GPU, nothing written)
#   OUTDIR (argument)          default $OUT (the device tool's folder) or ./next-lease-out
#   NL_BUDGET_S                total seconds (default 480)
#   NL_TIMEOUT_S               per-configuration timeout (default 150)
#   NL_PARTS                   comma-separated part names to run (default all, in order)
#   NL_PREVIOUS                a folder with an earlier run's *.jsonl: copied in first, and
#                              the ids already there are skipped (a rerun after a cut-off)
#   PYTHON                     interpreter with torch (default python3)
# .ds (deepspeed) and .bnb (bitsandbytes) beside the repository's root go on PYTHONPATH.
#
# Writes at most 7 files (the device tool returns 8): log.txt (with the summary at its
# end), cuda-rules.jsonl, dist-ws1.jsonl, sdpa.jsonl, bert.jsonl, gaps.jsonl and
# snapshots.tar.gz (every snapshot pickle, the largest left out until it is under 15 MiB).
set -u

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
dry="${NL_DRY_RUN:-0}"
out=""
for arg in "$@"; do
  case "$arg" in
    --dry-run) dry=1 ;;
    -h|--help) sed -n '2,/^set -u/p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) out="$arg" ;;
  esac
done
out="${out:-${OUT:-$PWD/next-lease-out}}"
budget="${NL_BUDGET_S:-480}"
timeout="${NL_TIMEOUT_S:-150}"
python="${PYTHON:-python3}"
cd "$repo" || exit 2
for lib in .bnb .ds; do
  [ -d "$repo/$lib" ] && PYTHONPATH="$repo/$lib${PYTHONPATH:+:$PYTHONPATH}"
done
export PYTHONPATH="${PYTHONPATH:-}" PYTHONUNBUFFERED=1
snap_dir="${TMPDIR:-/tmp}/next-lease-snapshots.$$"

# name | grid | cap (s) | output | extra measure.py arguments
PARTS=(
  "cuda-rules|cuda-rules|60|cuda-rules|"
  "dist-ws1|dist-ws1|270|dist-ws1|"
  "sdpa|sdpa|130|sdpa|"
  "bert|bert|55|bert|"
  "gaps|gaps|70|gaps|--snapshot $snap_dir --snapshot-from-step 1 --snapshot-max-entries 60000"
  "gaps-setup|gaps-setup|60|gaps|--snapshot $snap_dir --snapshot-from-step 0 --snapshot-max-entries 60000"
)

wanted() {  # wanted NAME: whether NL_PARTS selects the part
  [ -z "${NL_PARTS:-}" ] && return 0
  case ",$NL_PARTS," in *",$1,"*) return 0 ;; esac
  [ "$1" = gaps-setup ] && case ",$NL_PARTS," in *",gaps,"*) return 0 ;; esac
  return 1
}

if [ "$dry" = 1 ]; then
  echo "next_lease.sh --dry-run: budget ${budget}s, per-configuration timeout ${timeout}s"
  status=0
  for part in "${PARTS[@]}"; do
    IFS='|' read -r name grid cap file extra <<<"$part"
    wanted "$name" || continue
    echo "== part $name: grids/$grid.toml -> $file.jsonl, cap ${cap}s ${extra:+($extra)}"
    "$python" "$here/measure.py" --grid "$here/grids/$grid.toml" --dry-run || status=1
  done
  exit "$status"
fi

mkdir -p "$out"
log="$out/log.txt"
start=$(date +%s)
elapsed() { echo $(( $(date +%s) - start )); }
{
  echo "== $(date -u +%Y-%m-%dT%H:%M:%SZ) next_lease.sh, budget ${budget}s, commit $(git -C "$repo" rev-parse --short HEAD 2>/dev/null)"
  nvidia-smi 2>&1 || echo "(no nvidia-smi)"
  command -v nvcc >/dev/null && nvcc --version | tail -1 || echo "(no nvcc)"
  "$python" -c 'import sys, torch; print("python", sys.version.split()[0], "torch", torch.__version__, "cuda", torch.version.cuda, torch.cuda.is_available())' 2>&1
  "$python" -c 'import importlib.metadata as m
for n in ("transformers", "peft", "accelerate", "deepspeed", "bitsandbytes", "pydantic"):
    try: print(n, m.version(n))
    except Exception as e: print(n, "missing")' 2>&1
  echo "PYTHONPATH=$PYTHONPATH"
} >>"$log"
if [ -n "${NL_PREVIOUS:-}" ]; then
  for f in "$NL_PREVIOUS"/*.jsonl; do [ -e "$f" ] && cp "$f" "$out/"; done
  echo "== resuming from $NL_PREVIOUS: $(cat "$out"/*.jsonl 2>/dev/null | wc -l) records already there" >>"$log"
fi

bank=0
first=1
status=0
for part in "${PARTS[@]}"; do
  IFS='|' read -r name grid cap file extra <<<"$part"
  wanted "$name" || continue
  left=$(( budget - $(elapsed) ))
  part_budget=$(( cap + bank ))
  [ "$part_budget" -gt "$left" ] && part_budget=$left
  if [ "$part_budget" -lt 30 ]; then
    echo "== part $name skipped: ${part_budget}s left for it" | tee -a "$log"
    continue
  fi
  echo "== part $name: grids/$grid.toml, ${part_budget}s (cap ${cap}s, $(elapsed)s elapsed)" | tee -a "$log"
  preflight=(--no-preflight)
  [ "$first" = 1 ] && preflight=()
  t0=$(date +%s)
  # shellcheck disable=SC2086  # $extra holds several arguments
  "$python" "$here/measure.py" --grid "$here/grids/$grid.toml" --out "$out/$file.jsonl" \
      --resume --overlap --timeout-per-config "$timeout" --time-budget "$part_budget" \
      "${preflight[@]}" $extra 2>&1 | tee -a "$log"
  rc=${PIPESTATUS[0]}
  used=$(( $(date +%s) - t0 ))
  bank=$(( part_budget - used ))
  [ "$bank" -lt 0 ] && bank=0
  if [ "$rc" -ne 0 ]; then
    echo "== part $name: measure.py exited $rc" | tee -a "$log"
    status=1
    if [ "$first" = 1 ] && [ "$rc" = 2 ]; then
      echo "== no usable GPU or harness: the other parts are not started" | tee -a "$log"
      break
    fi
  fi
  first=0
done

if [ -d "$snap_dir" ]; then
  # One archive under the device tool's 16 MiB per file: the largest pickles go first.
  while :; do
    tar -C "$snap_dir" -czf "$out/snapshots.tar.gz" . 2>>"$log"
    [ "$(stat -c %s "$out/snapshots.tar.gz")" -le $((15 * 1024 * 1024)) ] && break
    biggest=$(ls -S "$snap_dir" | head -1)
    [ -z "$biggest" ] && break
    echo "== snapshot $biggest left out (the archive was over 15 MiB)" | tee -a "$log"
    rm -f "$snap_dir/$biggest"
  done
  rm -rf "$snap_dir"
fi

files=()
for f in "$out"/*.jsonl; do [ -e "$f" ] && files+=("$f"); done
if [ "${#files[@]}" -gt 0 ]; then
  "$python" "$here/measure.py" --summarize "${files[@]}" 2>&1 | tee -a "$log"
fi
echo "== finished in $(elapsed)s; results in $out" | tee -a "$log"
exit "$status"
