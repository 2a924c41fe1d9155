#!/usr/bin/env bash
# Prepares bitsandbytes for a GPU machine that lacks it and cannot reach the network:
# downloads its manylinux wheel for the device's Python (3.12 by default) here, and
# unpacks it into DIR (default .bnb, which the repository's .git/info/exclude should list)
# without the CUDA 11/12, ROCm and XPU libraries, so that it fits the device tool's
# 64 MiB working-tree limit (about 8 MB instead of 43 MB). On the device:
#
#   export PYTHONPATH=$PWD/.bnb          # and carry: [".bnb"] in the device call
#   GT_GRID=round2 tools/groundtruth/run_on_device.sh
#
# bitsandbytes picks libbitsandbytes_cuda<major><minor>.so from torch.version.cuda; the
# kept libraries cover CUDA 13.x (13.0 here) and the CPU backend. Another torch CUDA
# version needs its library kept: set BNB_KEEP (a glob), e.g. BNB_KEEP='*cuda128*'.
set -euo pipefail
version="${BNB_VERSION:-0.50.2}"
dir="${1:-.bnb}"
pyver="${BNB_PYTHON_VERSION:-3.12}"
keep="${BNB_KEEP:-*cuda13*}"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
python3 -m pip download -q --no-deps --only-binary=:all: --python-version "$pyver" \
  --implementation cp --platform manylinux_2_24_x86_64 --platform manylinux_2_28_x86_64 \
  --platform manylinux_2_17_x86_64 -d "$tmp" "bitsandbytes==$version"
rm -rf "$dir"
mkdir -p "$dir"
(cd "$dir" && python3 -m zipfile -e "$tmp"/bitsandbytes-*.whl .)
for lib in "$dir"/bitsandbytes/libbitsandbytes_*.so; do
  case "$(basename "$lib")" in
    libbitsandbytes_cpu.so) ;;
    $keep) ;;
    *) rm -f "$lib" ;;
  esac
done
echo "carry_bitsandbytes.sh: bitsandbytes $version in $dir ($(du -sh "$dir" | cut -f1)):"
ls "$dir"/bitsandbytes/*.so
