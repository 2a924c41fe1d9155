#!/usr/bin/env python3
"""Entry point of the fidelity check (docs/fidelity.md): see vsref/fidelity.py."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from vsref.fidelity import main  # noqa: E402

sys.exit(main())
