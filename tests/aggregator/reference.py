"""The reference tables of ``../shared/reference`` (next to the repository), read as rows."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest


def _reference_dir() -> Path:
    """``shared/reference`` beside the repository, or beside any directory above it (a git
    worktree lives deeper than the checkout it belongs to)."""
    root = Path(__file__).resolve().parents[2]
    for parent in root.parents:
        candidate = parent / "shared" / "reference"
        if candidate.is_dir():
            return candidate
    return root.parent / "shared" / "reference"


REFERENCE_DIR = _reference_dir()


def reference_rows(name: str) -> list[dict[str, str]]:
    """Rows of ``REFERENCE_DIR / name`` (tab-separated); skips the test if it is absent."""
    path = REFERENCE_DIR / name
    if not path.is_file():
        pytest.skip(f"reference file {path} not found")
    with path.open(newline="") as fh:
        return list(csv.DictReader(fh, delimiter="\t"))
