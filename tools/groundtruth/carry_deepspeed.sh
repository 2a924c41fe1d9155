#!/usr/bin/env bash
# Prepares DeepSpeed for the GPU machine, which lacks it and cannot reach the network
# (shared/…/device KINDS.md: its image has torch 2.11, transformers 5.17, peft, accelerate
# 1.15.0, einops, msgpack, ninja, py-cpuinfo, psutil, nvidia-ml-py, but not deepspeed,
# hjson or pydantic). Puts into DIR (default .ds, ignored by .gitignore), importable with
# PYTHONPATH=DIR on the device's Python 3.12:
#   * deepspeed 0.19.8 and hjson 3.1.0, copied from .venv/tf5 (scripts/python_env.sh
#     builds DeepSpeed there from its sdist with no ops: pure Python, any CPython 3);
#   * pydantic 2.14.4 with its compiled pydantic-core 2.50.5, annotated-types,
#     typing-inspection and typing_extensions: the cp312 manylinux wheels of the versions
#     requirements/reference-tf5.txt pins, unpacked.
# About 25 MB; with .bnb (carry_bitsandbytes.sh) well under the device tool's 64 MiB.
#
#   tools/groundtruth/carry_deepspeed.sh          # here, once
#   export PYTHONPATH=$PWD/.ds                    # on the device; carry: [".ds"]
#
# DeepSpeed's own CUDA ops (FusedAdam, CPUAdam) are JIT-built on first use; the harness
# never asks for them (its DeepSpeed config sets "torch_adam": true: gtlib/dist_plan.py).
set -euo pipefail
cd "$(dirname "$0")/../.."
dir="${1:-.ds}"
pyver="${DS_PYTHON_VERSION:-3.12}"
venv_site=$(.venv/tf5/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
pin() { grep -iE "^$1==" requirements/reference-tf5.txt requirements/reference-tf5-nodeps.txt \
          | head -1 | cut -d: -f2; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
python3 -m pip download -q --no-deps --only-binary=:all: --python-version "$pyver" \
  --implementation cp --platform manylinux_2_17_x86_64 --platform manylinux_2_28_x86_64 \
  --platform manylinux2014_x86_64 -d "$tmp" \
  "$(pin pydantic)" "$(pin pydantic_core)" "$(pin annotated-types)" \
  "$(pin typing-inspection)" "$(pin typing_extensions)"
rm -rf "$dir"
mkdir -p "$dir"
for whl in "$tmp"/*.whl; do (cd "$dir" && python3 -m zipfile -e "$whl" .); done
for name in deepspeed hjson; do
  cp -r "$venv_site/$name" "$dir/"
  cp -r "$venv_site"/"$name"-*.dist-info "$dir/"
done
find "$dir" -name __pycache__ -type d -prune -exec rm -rf {} +
version=$(sed -n 's/^Version: //p' "$dir"/deepspeed-*.dist-info/METADATA)
[ "$version" = "0.19.8" ] || { echo "carry_deepspeed.sh: .venv/tf5 has deepspeed $version" >&2; exit 1; }
echo "carry_deepspeed.sh: deepspeed $version and its missing requirements in $dir ($(du -sh "$dir" | cut -f1))"
