"""Debian binaries that deploy tests drive (prometheus, chromium): found, or skipped.

scripts/test installs them with apt-get when it runs as root. Where one is missing its
tests skip, except under ``CI=true``, where they fail: CI must run them.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest


def debian_binary(command: str, *, env: str) -> str:
    """The executable of ``command`` (``$env``, else on the PATH, else ``/usr/bin``); skip
    where it is missing, fail under CI=true."""
    binary = os.environ.get(env) or shutil.which(command) or f"/usr/bin/{command}"
    if Path(binary).exists():
        return binary
    message = f"{command} is not installed (scripts/test installs it: apt-get install {command})"
    if os.environ.get("CI") == "true":
        pytest.fail(f"CI=true: {message}")
    pytest.skip(message)
