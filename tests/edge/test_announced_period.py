"""The deployment's device period policy in the announcement (``period_seconds``,
``budget_per_period``: edge/announce.py) and the rules a device's own cap is held to
against it (edge/budget.py: ``periods_meeting``, ``most_reports``, ``within_announced``)."""

from __future__ import annotations

import json
import math
import random
from fractions import Fraction

import pytest

from edge.announce import (
    AnnouncedPeriod,
    decode_announcement,
    encode_announcement,
    period_of,
)
from edge.budget import (
    BudgetPolicy,
    BudgetState,
    PeriodPolicy,
    decide,
    most_reports,
    periods_meeting,
    within_announced,
)
from edge.errors import SpecError
from edge.spec import MechanismSpec

SPEC = MechanismSpec(mechanism="coco", d=4, s=2, epsilon=0.5)


def announcement(**kw: object) -> bytes:
    return encode_announcement(
        SPEC.to_dict(),
        min_batch=10,
        delta=1e-6,
        round_seconds=60,
        **kw,  # type: ignore[arg-type]
    )


def test_an_announcement_without_a_policy_is_the_same_bytes() -> None:
    old = announcement()
    assert b"period" not in old
    assert period_of(decode_announcement(old)) is None
    assert period_of(None) is None


def test_the_policy_round_trips_and_states_its_reports_per_period() -> None:
    payload = announcement(period=AnnouncedPeriod(86_400, 12))
    doc = json.loads(payload)
    assert (doc["period_seconds"], doc["budget_per_period"]) == (86_400, 12.0)
    announced = period_of(decode_announcement(payload))
    assert announced == AnnouncedPeriod(86_400, 12.0)
    assert announced.reports_per_period(SPEC.epsilon) == 24  # floor(12 / 0.5)
    assert announced.policy() == PeriodPolicy(Fraction(12), 86_400)
    # a budget that is not a multiple of epsilon: floor, exactly
    assert AnnouncedPeriod(3600, 1.3).reports_per_period(0.5) == 2


@pytest.mark.parametrize(
    ("changes", "match"),
    [
        ({"period_seconds": 0}, "period_seconds"),
        ({"period_seconds": 90}, "multiple of round_seconds"),  # 1.5 rounds
        ({"period_seconds": 367 * 86_400}, "period_seconds"),
        ({"period_seconds": 3600.0}, "integer"),
        ({"period_seconds": True}, "integer"),
        ({"budget_per_period": 0.4}, "below one report"),  # epsilon 0.5
        ({"budget_per_period": 0}, "budget_per_period"),
        ({"budget_per_period": -1}, "budget_per_period"),
        ({"budget_per_period": 2.0**31}, "budget_per_period"),
        ({"budget_per_period": "1"}, "number"),
        ({"budget_per_period": None}, "number"),
    ],
)
def test_a_bad_policy_is_refused(changes: dict[str, object], match: str) -> None:
    doc = json.loads(announcement(period=AnnouncedPeriod(3600, 1.0)))
    doc.update(changes)
    with pytest.raises(SpecError, match=match):
        decode_announcement(json.dumps(doc).encode())
    fields = {"seconds": doc["period_seconds"], "budget": doc["budget_per_period"]}
    with pytest.raises(SpecError, match=match):
        announcement(period=AnnouncedPeriod(**fields))


@pytest.mark.parametrize("missing", ["period_seconds", "budget_per_period"])
def test_the_two_keys_come_together(missing: str) -> None:
    doc = json.loads(announcement(period=AnnouncedPeriod(3600, 1.0)))
    del doc[missing]
    with pytest.raises(SpecError, match="together"):
        decode_announcement(json.dumps(doc).encode())


def test_a_budget_of_exactly_one_report_is_accepted() -> None:
    decoded = decode_announcement(announcement(period=AnnouncedPeriod(60, 0.5)))
    assert period_of(decoded) == AnnouncedPeriod(60, 0.5)


def _meeting_by_enumeration(window: int, period: int, windows: int) -> int:
    """The most periods that any of the first ``windows`` aligned windows meets, counted."""
    return max(
        (k * window + window - 1) // period - (k * window) // period + 1 for k in range(windows)
    )


def test_periods_meeting_an_aligned_window_by_enumeration() -> None:
    """The closed form against the count over every window of a full cycle (lcm / W
    windows), for random window and period lengths."""
    rng = random.Random(20250621)
    cases = [(86_400, 3600), (3600, 86_400), (7, 3), (3, 7), (6, 4), (10, 10)]
    cases += [(rng.randint(1, 500), rng.randint(1, 500)) for _ in range(200)]
    for window, period in cases:
        cycle = period // math.gcd(window, period)  # windows per lcm
        assert periods_meeting(window, period) == _meeting_by_enumeration(window, period, cycle), (
            window,
            period,
        )


def test_most_reports_bounds_a_device_replayed_through_the_ledger_arithmetic() -> None:
    """A device that reports in every round it can under its own cap (edge.budget.decide,
    charged at each round's start), counted per aligned window of the announced period:
    never more than most_reports; exactly that where the device's periods tile the window
    and its cap fits its period's rounds (the bound is reached)."""
    rng = random.Random(7)
    tight = 0
    for _ in range(40):
        round_seconds = rng.choice([1, 2, 5])
        own = PeriodPolicy(Fraction(rng.randint(1, 3)), round_seconds * rng.randint(1, 12))
        window = round_seconds * rng.randint(1, 12)
        epsilon = Fraction(1)
        state, per_window = BudgetState(), dict[int, int]()
        start = rng.randrange(10_000) * round_seconds
        for r in range(400):
            at = start + r * round_seconds
            outcome = decide(state, BudgetPolicy(period=own), epsilon, at)
            if isinstance(outcome, BudgetState):
                state = outcome
                per_window[at // window] = per_window.get(at // window, 0) + 1
        bound = most_reports(own, epsilon, window)
        inner = list(per_window.values())[1:-1]  # whole windows only
        assert max(per_window.values()) <= bound
        tiles = window % own.seconds == 0 and own.epsilon * round_seconds <= own.seconds
        if inner and tiles:
            assert min(inner) == max(inner) == bound, (own, window, round_seconds)
            tight += 1
    assert tight >= 5  # the seeded cases include windows the bound is reached in


def test_within_announced() -> None:
    eps = Fraction(1, 2)
    daily = PeriodPolicy(Fraction(12), 86_400)
    assert within_announced(None, daily, eps) is daily  # the operator gave none
    assert within_announced(None, None, eps) is None
    own = PeriodPolicy(Fraction(100), 3600)
    assert within_announced(own, None, eps) is own  # nothing announced: the operator's
    tighter = PeriodPolicy(Fraction(1, 2), 3600)  # 24 per day: as many as announced
    assert within_announced(tighter, daily, eps) is tighter
    assert within_announced(PeriodPolicy(Fraction(12), 2 * 86_400), daily, eps) is not None
    with pytest.raises(ValueError, match="allows 48 reports"):
        within_announced(PeriodPolicy(Fraction(1), 3600), daily, eps)
    with pytest.raises(ValueError, match="allows 26 reports"):
        within_announced(PeriodPolicy(Fraction(13), 86_400), daily, eps)
