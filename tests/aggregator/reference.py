"""Reference tables: the project's own (``docs/reference/``, computed by
``docs/gen_reference.py``) and the independent ones next to the repository
(``../shared/reference``, computed by a separate implementation), read as rows.

The independent tables are not part of a clone (``COCO_REFERENCE_DIR`` says where they are
if not in a ``shared/reference`` beside the repository or a directory above it). A test that
compares against them skips, with the reason, where they are absent; under ``CI=true`` it
fails instead, with a message that says where they are expected, so CI never passes without
the comparison silently.
"""

from __future__ import annotations

import csv
import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS_REFERENCE_DIR = ROOT / "docs" / "reference"


def _reference_dir() -> Path:
    """``$COCO_REFERENCE_DIR``, else ``shared/reference`` beside the repository or beside any
    directory above it (a git worktree lives deeper than the checkout it belongs to)."""
    if os.environ.get("COCO_REFERENCE_DIR"):
        return Path(os.environ["COCO_REFERENCE_DIR"])
    for parent in ROOT.parents:
        candidate = parent / "shared" / "reference"
        if candidate.is_dir():
            return candidate
    return ROOT.parent / "shared" / "reference"


REFERENCE_DIR = _reference_dir()


def _read(path: Path) -> list[dict[str, str]]:
    with path.open(newline="") as fh:
        return list(csv.DictReader(fh, delimiter="\t"))


def require_reference(name: str) -> Path:
    """The path of the independent table ``name``; skips the test (fails it under
    ``CI=true``) when it is absent."""
    path = REFERENCE_DIR / name
    if not path.is_file():
        message = (
            f"independent reference table {path} not found: it is kept next to the repository "
            f"(../shared/reference/{name}), not in it; the project's own values are in "
            f"docs/reference/{name}; set COCO_REFERENCE_DIR if the tables are elsewhere"
        )
        if os.environ.get("CI") == "true":
            pytest.fail(f"{message} (CI=true: the comparison must run)", pytrace=False)
        pytest.skip(message)
    return path


def reference_rows(name: str) -> list[dict[str, str]]:
    """Rows of the independent table ``name`` (tab-separated): :func:`require_reference`."""
    return _read(require_reference(name))


def docs_rows(name: str) -> list[dict[str, str]]:
    """Rows of the project's own table ``docs/reference/name`` (always in the repository)."""
    return _read(DOCS_REFERENCE_DIR / name)
