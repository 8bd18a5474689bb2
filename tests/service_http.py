"""Reading a running service's HTTP endpoints from tests."""

from __future__ import annotations

import json
import urllib.request
from typing import Any


def estimates(port: int, *, timeout: float = 5.0) -> dict[str, Any] | None:
    """The ``/estimates`` document of the aggregator on ``port``; ``None`` while it does not
    answer (not started yet, or gone)."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/estimates", timeout=timeout) as resp:
            document: dict[str, Any] = json.loads(resp.read())
            return document
    except OSError:
        return None
