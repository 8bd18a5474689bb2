"""Durations as operators write them: ``90s``, ``15m``, ``1h``, ``7d`` (and bare seconds).

One reader for the device's budget periods (:mod:`edge.budget`), the aggregator's windows and
periods (:mod:`aggregator.series.windows`) and the planning commands, so that ``1d`` means the
same everywhere. Standard library only.
"""

from __future__ import annotations

import re

__all__ = ["UNITS", "format_duration", "seconds_of"]

UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86_400}
_DURATION = re.compile(r"([0-9]{1,12})([smhd]?)")


def seconds_of(text: str, *, require_unit: bool = False) -> int | None:
    """The seconds ``text`` writes (a whole number, then ``s``, ``m``, ``h`` or ``d``; a bare
    number is seconds unless ``require_unit``), or ``None`` if it writes none."""
    match = _DURATION.fullmatch(text.strip())
    if match is None or (require_unit and not match.group(2)):
        return None
    return int(match.group(1)) * UNITS[match.group(2) or "s"]


def format_duration(seconds: int) -> str:
    """The shortest ``<n><unit>`` for ``seconds`` (``86400`` -> ``1d``)."""
    for unit in ("d", "h", "m"):
        if seconds % UNITS[unit] == 0:
            return f"{seconds // UNITS[unit]}{unit}"
    return f"{seconds}s"
