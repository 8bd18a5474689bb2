"""The repository's documentation stands alone: no Markdown file points outside the
repository (the paper, its errata, the design note and the reference tables that live next to
a clone are written into docs/), and every relative link and anchor resolves.

Every tracked ``.md`` file (``git ls-files``; a walk of the tree where git is not available)
is read; fenced code blocks are left out, since they hold commands and output, not links.
"""

from __future__ import annotations

import re
import subprocess
from functools import cache
from pathlib import Path
from urllib.parse import unquote

import pytest

ROOT = Path(__file__).resolve().parents[1]
LINK = re.compile(r"!?\[(?:[^\]\[]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
OUTSIDE = ("../shared", "ERRATA.md", "blanket-amplification.md", "coco-collision-shuffle-paper")
"""Strings that name what a clone does not have."""


def markdown_files() -> list[Path]:
    try:
        listed = subprocess.run(
            ["git", "ls-files", "-z", "--", "*.md"],
            cwd=ROOT,
            capture_output=True,
            check=True,
            timeout=60,
        ).stdout.decode()
        files = [ROOT / name for name in listed.split("\0") if name]
    except (OSError, subprocess.SubprocessError):
        skip = {".git", ".venv", ".cache", "node_modules"}
        files = [p for p in ROOT.rglob("*.md") if not skip & set(p.relative_to(ROOT).parts)]
    return sorted(p for p in files if p.is_file())


def prose(path: Path) -> str:
    """The file without its fenced code blocks (lines kept, so line numbers stay right)."""
    out, fenced = [], False
    for line in path.read_text().splitlines():
        if line.lstrip().startswith("```"):
            fenced = not fenced
            out.append("")
            continue
        out.append("" if fenced else line)
    return "\n".join(out)


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: link text kept, punctuation dropped, spaces to '-'."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading.strip()).lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


@cache
def anchors(path: Path) -> frozenset[str]:
    seen: dict[str, int] = {}
    out = set()
    for line in prose(path).splitlines():
        match = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if not match:
            continue
        base = slug(match.group(1))
        count = seen.get(base, 0)
        seen[base] = count + 1
        out.add(base if count == 0 else f"{base}-{count}")
    out.update(re.findall(r'<a\s+(?:name|id)="([^"]+)"', path.read_text()))
    return frozenset(out)


FILES = markdown_files()


def test_there_are_docs_to_check() -> None:
    names = {p.relative_to(ROOT).as_posix() for p in FILES}
    assert {"README.md", "docs/maths.md", "docs/blanket-bound.md", "docs/reference.md"} <= names


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_no_doc_points_outside_the_repository(path: Path) -> None:
    text = path.read_text()
    for needle in OUTSIDE:
        lines = [i + 1 for i, line in enumerate(text.splitlines()) if needle in line]
        assert not lines, f"{path.relative_to(ROOT)} names {needle!r} on lines {lines}"


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_relative_link_resolves(path: Path) -> None:
    broken = []
    for number, line in enumerate(prose(path).splitlines(), start=1):
        for target in LINK.findall(line):
            if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
                continue
            file_part, _, fragment = unquote(target).partition("#")
            dest = (path.parent / file_part).resolve() if file_part else path
            if ROOT not in (dest, *dest.parents):
                broken.append((number, target, "outside the repository"))
            elif not dest.exists():
                broken.append((number, target, "no such file"))
            elif fragment and dest.suffix == ".md" and fragment not in anchors(dest):
                broken.append((number, target, "no such heading"))
    assert not broken, f"{path.relative_to(ROOT)}: {broken}"
