"""The sensor model's day on the wall clock: a real day, or one compressed into fewer seconds
(``coco fleet --day-seconds``, ``coco demo --day-seconds``) so that the daily cycle shows in
minutes. No numpy: the commands' ``--help`` imports it."""

from __future__ import annotations

__all__ = ["DAY_SECONDS", "check_day_seconds", "hour_of_day"]

DAY_SECONDS = 86_400
"""A real day: the sensors' cycle follows the wall clock unless a run compresses it."""


def check_day_seconds(day_seconds: int, round_seconds: int) -> int:
    """``day_seconds`` if it is an int >= 1 and, when it is not a real day, at least two
    rounds of ``round_seconds`` (a shorter day would show the cycle aliased, not followed);
    :class:`ValueError` naming the problem otherwise."""
    if isinstance(day_seconds, bool) or not isinstance(day_seconds, int) or day_seconds < 1:
        raise ValueError(f"day_seconds must be an int >= 1, got {day_seconds!r}")
    if day_seconds != DAY_SECONDS and day_seconds < 2 * round_seconds:
        raise ValueError(
            f"day_seconds {day_seconds} must hold at least two rounds of {round_seconds} s "
            f"(>= {2 * round_seconds}) to show the daily cycle"
        )
    return day_seconds


def hour_of_day(unix_seconds: int, day_seconds: int = DAY_SECONDS) -> float:
    """The hour (``[0, 24)``) of the sensors' day at whole Unix second ``unix_seconds``, the
    day lasting ``day_seconds`` (a real day by default: the UTC hour; a smaller value
    compresses the day, so the cycle runs ``86400 / day_seconds`` times faster). Exact
    integer arithmetic up to one division, so the real day gives the same hours as
    ``(t % 86400) / 3600``."""
    return (unix_seconds % day_seconds) * 24 / day_seconds
