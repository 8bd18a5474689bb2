"""The reference tables of ``../shared/reference`` (next to the repository), read as rows."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

REFERENCE_DIR = Path(__file__).resolve().parents[2].parent / "shared" / "reference"


def reference_rows(name: str) -> list[dict[str, str]]:
    """Rows of ``REFERENCE_DIR / name`` (tab-separated); skips the test if it is absent."""
    path = REFERENCE_DIR / name
    if not path.is_file():
        pytest.skip(f"reference file {path} not found")
    with path.open(newline="") as fh:
        return list(csv.DictReader(fh, delimiter="\t"))
