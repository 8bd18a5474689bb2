"""Period budgets (edge/budget.py, edge/ledger.py): refusal at the cap, renewal at the period
boundary, across restarts, a clock set back, a changed period, a damaged or old file."""

from __future__ import annotations

import json
from fractions import Fraction
from pathlib import Path

import pytest

from edge.budget import (
    BudgetPolicy,
    BudgetState,
    PeriodPolicy,
    Refusal,
    decide,
    format_period,
    parse_period,
)
from edge.ledger import BudgetExhausted, BudgetLedger, LedgerError

DAY = 86_400
T0 = 20_300 * DAY  # the start of period 20300 of one day (2025-07-31)
PER_DAY = PeriodPolicy.of(1.0, "1d")


def ledger(path: Path, **kw: object) -> BudgetLedger:
    return BudgetLedger(path, period=PER_DAY, **kw)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("text", "seconds"), [("1h", 3600), ("1d", DAY), ("7d", 7 * DAY), ("90s", 90), ("5m", 300)]
)
def test_parse_period(text: str, seconds: int) -> None:
    assert parse_period(text) == seconds
    assert parse_period(format_period(seconds)) == seconds


@pytest.mark.parametrize("text", ["", "1", "d", "0d", "-1d", "1.5d", "1w", "367d", "1 d x"])
def test_parse_period_refuses(text: str) -> None:
    with pytest.raises(ValueError, match="period"):
        parse_period(text)


def test_refuses_at_the_period_cap_and_renews_at_the_boundary(tmp_path: Path) -> None:
    book = ledger(tmp_path / "l.json")
    for k in range(4):
        book.charge(0.25, at=T0 + 10 * k)  # 4 x 0.25 == 1.0 exactly: allowed
    with pytest.raises(BudgetExhausted) as info:
        book.charge(0.25, at=T0 + DAY - 1)  # the last second of the period
    assert (info.value.kind, info.value.renews_at) == ("period", T0 + DAY)
    assert (info.value.spent, info.value.total) == (1.0, 1.0)
    assert "the next period starts at 2025-08-01T00:00:00Z" in str(info.value)
    assert book.reports == 4
    assert book.can_afford(0.25, at=T0 + DAY)  # the first second of the next period
    book.charge(0.25, at=T0 + DAY)
    assert book.state.period == T0 // DAY + 1
    assert book.state.period_spent == Fraction(1, 4)
    assert book.spent == 1.25


def test_the_period_survives_a_restart(tmp_path: Path) -> None:
    path = tmp_path / "l.json"
    ledger(path).charge(0.75, at=T0 + 5)
    again = ledger(path)
    assert again.state.period_spent == Fraction(3, 4)
    with pytest.raises(BudgetExhausted, match="period"):
        again.charge(0.5, at=T0 + 100)
    again.charge(0.25, at=T0 + 100)
    assert not ledger(path).can_afford(0.25, at=T0 + DAY - 1)
    assert ledger(path).can_afford(0.25, at=T0 + DAY)


def test_a_clock_set_back_never_renews_the_budget(tmp_path: Path) -> None:
    """A clock that ran three days ahead spent that day's budget; set back to the right
    time, the device is charged as in the highest period and waits for it to pass."""
    path = tmp_path / "l.json"
    ahead = T0 + 3 * DAY
    ledger(path).charge(1.0, at=ahead)
    back = ledger(path)
    for at in (T0, T0 + DAY, ahead + DAY - 1):
        refusal = back.refusal(0.5, at=at)
        assert refusal is not None
        assert (refusal.kind, refusal.renews_at) == ("period", ahead + DAY)
    back.charge(0.5, at=ahead + DAY)
    # set back again after a charge in a later period: still charged to the highest one
    back.charge(0.5, at=T0)
    assert back.state.period == (ahead + DAY) // DAY
    assert back.state.period_spent == 1
    assert not back.can_afford(0.1, at=T0 + 7)


def test_the_lifetime_cap_still_ends_a_device(tmp_path: Path) -> None:
    book = ledger(tmp_path / "l.json", total_epsilon=1.5)
    book.charge(1.0, at=T0)
    book.charge(0.5, at=T0 + DAY)
    with pytest.raises(BudgetExhausted) as info:
        book.charge(0.5, at=T0 + 5 * DAY)
    assert (info.value.kind, info.value.renews_at) == ("lifetime", None)
    assert "exhausted" in str(info.value)


def test_a_period_cap_below_one_report_never_fits_and_is_not_waited_for(tmp_path: Path) -> None:
    book = BudgetLedger(tmp_path / "l.json", period=PeriodPolicy.of(0.25, "1h"))
    refusal = book.refusal(0.5, at=T0)
    assert refusal is not None
    assert (refusal.kind, refusal.renews_at) == ("period", None)
    assert "never fits" in refusal.message(0.5)


def test_a_changed_period_length_forgets_nothing_before_the_old_period_ends() -> None:
    """Kept per day, read per hour: the day's spending stays with the hour holding its last
    second, so nothing is renewed before the day is over."""
    state = decide(BudgetState(), BudgetPolicy(period=PER_DAY), Fraction(1), T0)
    assert isinstance(state, BudgetState)
    hourly = BudgetPolicy(period=PeriodPolicy.of(1.0, "1h"))
    for at in (T0, T0 + 3600, T0 + DAY - 1):
        assert isinstance(decide(state, hourly, Fraction(1, 2), at), Refusal)
    after = decide(state, hourly, Fraction(1, 2), T0 + DAY)
    assert isinstance(after, BudgetState)
    assert (after.period_seconds, after.period) == (3600, (T0 + DAY) // 3600)


def test_a_version_1_file_is_still_read(tmp_path: Path) -> None:
    path = tmp_path / "l.json"
    path.write_text(
        '{"version": 1, "total_epsilon": 8.0, "spent_epsilon": 2.5, '
        '"spent_epsilon_exact": "5/2", "reports": 5}'
    )
    book = BudgetLedger(path, total_epsilon=3.0, period=PER_DAY)
    assert (book.spent, book.reports, book.state.period) == (2.5, 5, None)
    assert json.loads(path.read_text())["version"] == 2
    book.charge(0.5, at=T0)
    with pytest.raises(BudgetExhausted, match="exhausted"):
        book.charge(0.5, at=T0 + DAY)


def _edit(path: Path, **changes: object) -> None:
    data = json.loads(path.read_text())
    data.update(changes)
    path.write_text(json.dumps(data))


@pytest.mark.parametrize(
    "changes",
    [
        {"period": 0},  # the clock-set-back defence rolled back by hand
        {"period_spent_epsilon": 0.0, "period_spent_epsilon_exact": "0/1"},
        {"reports": 7},
        {"sha256": "0" * 64},
        {"sha256": None},
        {"version": 3},
    ],
)
def test_a_damaged_or_edited_file_is_refused_not_reset(tmp_path: Path, changes: object) -> None:
    path = tmp_path / "l.json"
    ledger(path).charge(0.75, at=T0)
    _edit(path, **changes)  # type: ignore[arg-type]
    before = path.read_bytes()
    with pytest.raises(LedgerError, match=str(path)):
        ledger(path)
    assert path.read_bytes() == before


def test_a_consistent_file_with_impossible_fields_is_refused(tmp_path: Path) -> None:
    """Fields that pass the checksum but cannot come from the ledger (a period that spent more
    than the lifetime): refused too."""
    path = tmp_path / "l.json"
    ledger(path).charge(0.75, at=T0)
    data = json.loads(path.read_text())
    data.update(spent_epsilon=0.5, spent_epsilon_exact="1/2")
    from edge.ledger import _checksum  # noqa: PLC0415

    data["sha256"] = _checksum({k: v for k, v in data.items() if k != "sha256"})
    path.write_text(json.dumps(data))
    with pytest.raises(LedgerError, match="more than the whole ledger"):
        ledger(path)


def test_a_ledger_needs_a_cap(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="cap"):
        BudgetLedger(tmp_path / "l.json")
