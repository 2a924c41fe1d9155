#!/usr/bin/env bash
# CI step "wheel": builds the Python package's wheel (`pip wheel .`: scikit-build-core
# over the same CMakeLists.txt, build folder build-wheel/ kept between runs), installs it
# into a fresh virtual environment under a temporary folder, and smoke-tests it there,
# outside the checkout: the `vramscope` console script against build/cli/vramscope (same
# output, same exit codes), the API (estimate equals `estimate --json`, a bad knob is a
# ValueError), and the trace recorder (vramscope.trace records a step that the CLI
# simulates; vramscope_trace is its alias). The environment sees the system's
# site-packages for torch (python3-torch, scripts/deps.sh); pip installs nothing else.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
PYTHON=${PYTHON:-/usr/bin/python3}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

"$PYTHON" -m venv --system-site-packages "$tmp/venv"
py=$tmp/venv/bin/python
"$py" -m pip wheel -q --disable-pip-version-check --no-deps . -w "$tmp/wheel" 2>&1 \
  | { grep -v "^WARNING: Location" || true; }
"$py" -m pip install -q --disable-pip-version-check --no-deps "$tmp"/wheel/vramscope-*.whl 2>&1 \
  | { grep -v "^WARNING: Location" || true; }
cd "$tmp"

# The CLI: the same bytes and exit codes as the executable built by scripts/build.sh.
cli=$root/build/cli/vramscope
for args in "estimate llama-3-8b --batch 2 --json" "fit llama-3.2-1b --json" "models"; do
  # shellcheck disable=SC2086
  cmp <("$tmp/venv/bin/vramscope" $args) <("$cli" $args)
done
set +e
"$tmp/venv/bin/vramscope" estimate llama-3-8b --precision fp8 2>/dev/null
code=$?
set -e
[ "$code" -eq 2 ] || { echo "wheel: a bad knob exited $code, not 2" >&2; exit 1; }
"$cli" estimate llama-3-8b --batch 2 --json > cli.json

# The API and the recorder, from the installed package (not the checkout).
"$py" - <<'PY'
import json, os, sys
import vramscope
assert os.path.dirname(vramscope.__file__).startswith(sys.prefix), vramscope.__file__
report = vramscope.estimate("llama-3-8b", batch=2)
assert report.data == json.load(open("cli.json")), "API != estimate --json"
try:
    vramscope.estimate("llama-3-8b", precision="fp8")
    raise SystemExit("a bad knob did not raise")
except ValueError as e:
    assert "--precision" in str(e), e
import torch
import vramscope.trace, vramscope_trace
assert vramscope_trace is vramscope.trace
model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
with vramscope.trace.record("step.events", model=model, optimizer=opt):
    for _ in range(2):
        opt.zero_grad(set_to_none=True)
        model(torch.randn(4, 64)).sum().backward()
        opt.step()
sim = vramscope.simulate("step.events")
assert sim.peak_allocated_bytes > 0
print(f"wheel: CLI, API and recorder pass from {os.path.dirname(vramscope.__file__)}")
PY
"$tmp/venv/bin/vramscope" simulate step.events --json > /dev/null
