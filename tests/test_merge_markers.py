"""No file of the repository holds a merge-conflict marker (a merge committed half-resolved
once: the docs' tests passed on a table whose rows sat between markers)."""

from __future__ import annotations

import re
import subprocess

from tests.processes import ROOT

MARKER = re.compile(rb"^(<{7}|>{7}) ", re.MULTILINE)


def test_no_tracked_file_holds_a_conflict_marker() -> None:
    listed = subprocess.run(
        ["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True
    ).stdout.split(b"\0")
    found = [
        name.decode()
        for name in listed
        if name
        and (ROOT / name.decode()).is_file()
        and MARKER.search((ROOT / name.decode()).read_bytes())
    ]
    assert found == []
