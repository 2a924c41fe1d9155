"""Makes gtlib importable and provides fixture model configs (tests/data/models)."""

import sys
from pathlib import Path

import pytest

TOOL_DIR = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(TOOL_DIR))

DATA = Path(__file__).resolve().parent / "data"


@pytest.fixture
def model_dirs():
    return (DATA / "models",)
