#!/usr/bin/env bash
# Regenerates README.md's accuracy table from the committed measurements:
# the output of `vramscope validate data/groundtruth --markdown` between the
# accuracy markers. tests/accuracy_test.py fails when the README is stale.
set -euo pipefail
cd "$(dirname "$0")/.."
bin="${VRAMSCOPE_BIN:-build/cli/vramscope}"
table="$("$bin" validate data/groundtruth --markdown)"
/usr/bin/python3 - "$table" <<'PY'
import re, sys
table = sys.argv[1].rstrip("\n")
text = open("README.md").read()
new = re.sub(r"(<!-- accuracy:begin -->\n).*?(<!-- accuracy:end -->)",
             lambda m: m.group(1) + table + "\n" + m.group(2), text, flags=re.S)
open("README.md", "w").write(new)
PY
