#!/usr/bin/env bash
# Creates the project's Python environments (virtual environments under .venv/):
#   .venv/tf5  torch 2.13.0 (CPU) + transformers 5.x + peft + accelerate: the test Python
#   .venv/tf4  the same with transformers 4.57.x, for version-dependent lowering rules
# from the locked requirements in requirements/*.txt, and installs the trace
# recorder (python/) into both. An environment whose lock file has not changed
# since it was made is left as it is. `--lock` re-resolves requirements/*.in
# into the lock files instead (run by hand when a pin changes).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}

make_env() {  # make_env NAME LOCKFILE
  local dir=.venv/$1 lock=$2
  local stamp=$dir/.vramscope-lock
  # requirements/reference-NAME-nodeps.txt: pins installed without their dependencies.
  local nodeps=requirements/reference-$1-nodeps.txt
  local wanted
  if [ -f "$nodeps" ]; then wanted=$(cat "$lock" "$nodeps"); else wanted=$(cat "$lock"); fi
  if [ -x "$dir/bin/python" ] && [ "$wanted" = "$(cat "$stamp" 2>/dev/null)" ]; then
    install_recorder "$dir"
    return 0
  fi
  echo "python_env.sh: creating $dir from $lock"
  rm -rf "$dir"
  "$PYTHON" -m venv "$dir"
  # pip's local-disk index serves torch 2.13.0 (CPU); everything else comes from PyPI.
  "$dir/bin/python" -m pip install -q --disable-pip-version-check -r "$lock" 2>&1 \
    | { grep -v "^WARNING: Location" || true; }
  if [ -f "$nodeps" ]; then
    "$dir/bin/python" -m pip install -q --disable-pip-version-check --no-deps --no-build-isolation \
      -r "$nodeps" 2>&1 \
      | { grep -v "^WARNING: Location" || true; }
  fi
  rm -f "$dir/.vramscope-python"
  install_recorder "$dir"
  printf '%s' "$wanted" > "$stamp"
}

# The trace recorder (python/) into environment DIR, again whenever its sources
# changed since it was last installed there (a stamp of their hash).
install_recorder() {
  local dir=$1 stamp=$1/.vramscope-python hash
  hash=$(find python -name '*.py' -not -path '*/build/*' -not -path '*.egg-info/*' | sort \
    | xargs cat python/pyproject.toml | sha256sum)
  if [ "$hash" = "$(cat "$stamp" 2>/dev/null)" ]; then return 0; fi
  "$dir/bin/python" -m pip install -q --disable-pip-version-check --no-deps \
    --no-build-isolation ./python 2>&1 | { grep -v "^WARNING: Location" || true; }
  printf '%s' "$hash" > "$stamp"
}

lock_env() {  # lock_env NAME: resolve requirements/reference-NAME.in into its .txt
  local tmp
  tmp=$(mktemp -d)
  "$PYTHON" -m venv "$tmp/v"
  "$tmp/v/bin/python" -m pip install -q -r "requirements/reference-$1.in" 2>&1 \
    | { grep -v "^WARNING: Location" || true; }
  { echo "# Generated from reference-$1.in by scripts/python_env.sh --lock (pip freeze); edit the .in file."
    "$tmp/v/bin/python" -m pip freeze | sed 's/+cpu$//'; } > "requirements/reference-$1.txt"
  rm -rf "$tmp"
}

if [ "${1:-}" = "--lock" ]; then
  lock_env tf5
  lock_env tf4
  exit 0
fi
# torchtune's and LitGPT's import-time libraries, kept out of .venv/tf5 (the files say why).
extra_env() {  # extra_env DIR LIST
  local dir=$1 list=$2 stamp=$1/.vramscope-lock
  if [ -d "$dir" ] && [ "$(cat "$list")" = "$(cat "$stamp" 2>/dev/null)" ]; then return 0; fi
  echo "python_env.sh: creating $dir from $list"
  rm -rf "$dir"
  .venv/tf5/bin/python -m pip install -q --disable-pip-version-check --no-deps --target "$dir" \
    -r "$list" 2>&1 | { grep -v "^WARNING: Location" || true; }
  cat "$list" > "$stamp"
}

make_env tf5 requirements/reference-tf5.txt
make_env tf4 requirements/reference-tf4.txt
extra_env .venv/tf5-torchtune requirements/reference-tf5-torchtune.txt
extra_env .venv/litgpt requirements/reference-litgpt.txt
