#!/usr/bin/env bash
# Quick start, step 1: install what is missing, build, and run the main job on
# a built-in example (Llama-3-8B LoRA fine-tune on one H100, bf16 mixed precision).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/deps.sh
scripts/python_env.sh
scripts/build.sh
echo
build/cli/vramscope estimate llama-3-8b --finetune lora --batch 1 --seq 2048 --grad-ckpt full --explain
