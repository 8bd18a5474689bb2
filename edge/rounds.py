"""Round numbers of protocol v1: a device's round comes from its wall clock.

The announcement fixes ``round_seconds`` (``L``). Round ``r`` is the interval of Unix time
``[r L, (r + 1) L)``; a device reporting at Unix time ``u`` (seconds, UTC) puts
``floor(u / L)`` in the report's ``round`` field. That is the whole rule: no counter to keep,
nothing to persist across a reboot, and every honest device of a deployment agrees on the
round up to its clock error.

The shuffler accepts a round only inside a small window around its own clock (see
:mod:`broker.core.admission`), so a device with a wrong clock, or a hostile one, cannot open
far-off rounds. A device whose clock is not set (before :data:`CLOCK_FLOOR`, e.g. 1970 after a
reboot without an RTC) must not report: :func:`current_round` raises :class:`ClockError`.

Like :mod:`edge.codec` this module runs unchanged on MicroPython: it imports only ``time``.
"""

import time

CLOCK_FLOOR = 1_735_689_600
"""2025-01-01T00:00:00Z: a clock that reads earlier than this has not been set."""
MIN_ROUND_SECONDS = 1
MAX_ROUND_SECONDS = 86_400
U32_MAX = 0xFFFFFFFF
MAX_START = U32_MAX * MAX_ROUND_SECONDS
"""The latest start a round can have (Unix seconds): a u32 round of the longest length."""


class ClockError(ValueError):
    """The device's clock is not set (or out of the protocol's range): do not report."""


def check_round_seconds(round_seconds: int) -> int:
    """``round_seconds`` if it is an int in ``[1, 86400]``; :class:`ValueError` otherwise."""
    if (
        isinstance(round_seconds, bool)
        or not isinstance(round_seconds, int)
        or not MIN_ROUND_SECONDS <= round_seconds <= MAX_ROUND_SECONDS
    ):
        raise ValueError(
            f"round_seconds must be an int in [{MIN_ROUND_SECONDS}, {MAX_ROUND_SECONDS}], "
            f"got {round_seconds!r}"
        )
    return round_seconds


def round_of(unix_time: float, round_seconds: int) -> int:
    """The round of Unix time ``unix_time``: ``floor(unix_time / round_seconds)``."""
    check_round_seconds(round_seconds)
    if not unix_time >= CLOCK_FLOOR:  # also catches NaN
        raise ClockError(f"the clock reads {unix_time}, before 2025-01-01: it is not set")
    round_ = int(unix_time // round_seconds)
    if round_ > U32_MAX:
        raise ClockError(f"round {round_} does not fit the report's u32 round field")
    return round_


def current_round(round_seconds: int, now: "float | None" = None) -> int:
    """The round a device reports in now (``now``: Unix seconds, default ``time.time()``)."""
    return round_of(time.time() if now is None else now, round_seconds)


def round_start(round_: int, round_seconds: int) -> int:
    """Unix time at which round ``round_`` starts."""
    return round_ * round_seconds


def seconds_to_next_round(round_seconds: int, now: "float | None" = None) -> float:
    """Seconds from ``now`` until the next round starts (in ``(0, round_seconds]``)."""
    now = time.time() if now is None else now
    return (current_round(round_seconds, now) + 1) * round_seconds - now
