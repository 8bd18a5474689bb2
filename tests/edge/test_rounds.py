"""edge/rounds.py: the round of a Unix time, on CPython and under real MicroPython.

Every time here is a given number (no assertion depends on when the test runs).
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from edge import rounds
from edge.rounds import (
    CLOCK_FLOOR,
    ClockError,
    check_round_seconds,
    current_round,
    round_of,
    round_start,
    seconds_to_next_round,
)
from tests.edge.test_micropython import (  # noqa: F401 (pytest fixtures used by name)
    RunMicroPython,
    micropython_harness,
    run_micropython,
)

ROUNDS = Path(rounds.__file__)
T0 = 1_764_115_200  # 2025-11-26T00:00:00Z, a multiple of 60


def test_round_is_the_floor_of_time_over_length() -> None:
    assert round_of(T0, 60) == T0 // 60
    assert round_of(T0 + 59.999, 60) == T0 // 60  # the last instant of the round
    assert round_of(T0 + 60, 60) == T0 // 60 + 1  # a round starts at its boundary
    assert round_of(T0 + 0.5, 1) == T0
    assert round_start(round_of(T0 + 17, 60), 60) == T0
    assert current_round(60, now=T0 + 30) == T0 // 60


@given(
    now=st.floats(min_value=CLOCK_FLOOR, max_value=4e9, allow_nan=False),
    length=st.integers(min_value=1, max_value=86_400),
)
def test_a_time_lies_in_its_round_and_the_next_round_starts_within_one_length(
    now: float, length: int
) -> None:
    r = round_of(now, length)
    assert round_start(r, length) <= now < round_start(r + 1, length)
    wait = seconds_to_next_round(length, now)
    assert 0 < wait <= length
    assert math.isclose(now + wait, round_start(r + 1, length), rel_tol=0, abs_tol=1e-6)


@pytest.mark.parametrize("now", [0.0, 12.5, CLOCK_FLOOR - 1, -1.0, float("nan")])
def test_an_unset_clock_is_a_clock_error(now: float) -> None:
    with pytest.raises(ClockError, match="not set"):
        current_round(60, now=now)
    with pytest.raises(ClockError):
        seconds_to_next_round(60, now=now)
    assert issubclass(ClockError, ValueError)


def test_a_round_beyond_the_u32_field_is_a_clock_error() -> None:
    assert round_of(2**32 - 0.5, 1) == 2**32 - 1
    with pytest.raises(ClockError, match="u32"):
        round_of(2**32, 1)


@pytest.mark.parametrize("length", [0, -1, 86_401, 1.0, True, "60", None])
def test_round_seconds_is_an_int_in_range(length: object) -> None:
    with pytest.raises(ValueError, match="round_seconds"):
        check_round_seconds(length)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="round_seconds"):
        round_of(T0, length)  # type: ignore[arg-type]


# (call, now, round_seconds) cases run on both interpreters; "ClockError"/"ValueError" when
# the call raises.
CASES: list[tuple[str, float, object]] = [
    ("round_of", T0, 60),
    ("round_of", T0 + 59.999, 60),
    ("round_of", T0 + 60, 60),
    ("round_of", T0 + 0.25, 1),
    ("round_of", 2**32 - 0.5, 1),
    ("round_of", 2**32, 1),
    ("round_of", 0, 60),
    ("round_of", CLOCK_FLOOR - 1, 60),
    ("round_of", T0, 0),
    ("round_of", T0, 86_401),
    ("round_of", T0, True),
    ("round_of", T0, 1.0),
    ("current_round", T0 + 7, 15),
    ("seconds_to_next_round", T0 + 7, 15),
    ("seconds_to_next_round", T0, 15),
]

PROGRAM = """
import rounds

def call(name, now, length):
    try:
        if name == "round_of":
            return rounds.round_of(now, length)
        if name == "current_round":
            return rounds.current_round(length, now)
        return rounds.seconds_to_next_round(length, now)
    except rounds.ClockError:
        return "ClockError"
    except ValueError:
        return "ValueError"

for name, now, length in CASES:
    print(repr(call(name, now, length)))
r = rounds.current_round(60)  # the interpreter's own clock
print(isinstance(r, int) and r > 0)
"""


def _call(name: str, now: float, length: object) -> object:
    try:
        if name == "round_of":
            return round_of(now, length)  # type: ignore[arg-type]
        if name == "current_round":
            return current_round(length, now)  # type: ignore[arg-type]
        return seconds_to_next_round(length, now)  # type: ignore[arg-type]
    except ClockError:
        return "ClockError"
    except ValueError:
        return "ValueError"


@pytest.mark.integration
def test_rounds_under_micropython(run_micropython: RunMicroPython) -> None:  # noqa: F811
    """edge/rounds.py runs unchanged on MicroPython and gives CPython's answers."""
    want = [repr(_call(*case)) for case in CASES]
    assert "'ClockError'" in want
    assert "'ValueError'" in want
    got = run_micropython(ROUNDS, code=f"CASES = {CASES!r}\n{PROGRAM}").splitlines()
    assert got[:-1] == want
    assert got[-1] == "True"
