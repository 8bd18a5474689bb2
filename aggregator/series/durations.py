"""Durations as operators write them: ``90s``, ``15m``, ``1h``, ``7d``, ``2w`` (a bare number
is seconds). Pure code: :func:`parse_duration` is shared by the service's options and its
queries."""

from __future__ import annotations

import math
import re

__all__ = ["UNITS", "parse_duration"]

UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
"""Seconds per unit."""
_PATTERN = re.compile(r"(\d+(?:\.\d*)?|\.\d+)([smhdw]?)")


def parse_duration(text: str) -> float:
    """The seconds of ``text`` (> 0, finite); :class:`ValueError` (one line) otherwise."""
    match = _PATTERN.fullmatch(text.strip().lower())
    if match is None:
        raise ValueError(
            f"not a duration: {text[:40]!r} (a number and a unit s, m, h, d or w, e.g. 15m, 7d)"
        )
    seconds = float(match.group(1)) * UNITS[match.group(2) or "s"]
    if not (math.isfinite(seconds) and seconds > 0):
        raise ValueError(f"a duration must be finite and > 0, got {text[:40]!r}")
    return seconds
