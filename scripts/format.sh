#!/usr/bin/env bash
# The C++ sources (src/, cli/, include/, fuzz/, bench/, python/core/, web/) follow .clang-format.
#   scripts/format.sh           rewrites the files that do not
#   scripts/format.sh --check   lists them and fails (scripts/test.sh runs this)
set -euo pipefail
cd "$(dirname "$0")/.."
format=$(command -v clang-format-14 || command -v clang-format || true)
if [ -z "$format" ]; then
  echo "format.sh: clang-format-14 is missing: run scripts/deps.sh" >&2
  exit 1
fi
mapfile -t files < <(git ls-files '*.cc' '*.h' | grep -E '^(src|cli|include|fuzz|bench|python/core|web)/')
if [ "${1:-}" = "--check" ]; then
  bad=()
  for f in "${files[@]}"; do
    if ! "$format" --dry-run --Werror "$f" >/dev/null 2>&1; then bad+=("$f"); fi
  done
  if [ "${#bad[@]}" -gt 0 ]; then
    printf 'format.sh: not formatted (run scripts/format.sh): %s\n' "${bad[@]}" >&2
    exit 1
  fi
  echo "format.sh: ${#files[@]} files follow .clang-format"
else
  "$format" -i "${files[@]}"
fi
