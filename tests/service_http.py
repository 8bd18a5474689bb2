"""Reading a running service's HTTP endpoints from tests."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any


def ready(port: int) -> int | None:
    """The status of ``GET /ready`` of the service on ``port``; ``None`` while nothing
    answers."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/ready", timeout=2) as response:
            return int(response.status)
    except urllib.error.HTTPError as exc:
        exc.close()
        return exc.code
    except OSError:
        return None


def estimates(port: int, *, timeout: float = 5.0) -> dict[str, Any] | None:
    """The ``/estimates`` document of the aggregator on ``port``; ``None`` while it does not
    answer (not started yet, or gone)."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/estimates", timeout=timeout) as resp:
            document: dict[str, Any] = json.loads(resp.read())
            return document
    except OSError:
        return None
