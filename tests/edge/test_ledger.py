"""The privacy-budget ledger: exact composition, durability, and refusal to reset."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from edge.errors import CocoError
from edge.ledger import BudgetExhausted, BudgetLedger, LedgerError


def test_new_ledger_is_created_empty(tmp_path: Path) -> None:
    path = tmp_path / "ledger.json"
    ledger = BudgetLedger(path, total_epsilon=2.0)
    assert path.exists()
    assert (ledger.spent, ledger.remaining, ledger.reports, ledger.total) == (0.0, 2.0, 0, 2.0)


def test_charge_persists_and_reloads(tmp_path: Path) -> None:
    path = tmp_path / "ledger.json"
    ledger = BudgetLedger(path, total_epsilon=5.0)
    ledger.charge(1.25)
    ledger.charge(1.25)
    data = json.loads(path.read_text())
    assert data["spent_epsilon"] == 2.5
    assert data["spent_epsilon_exact"] == "5/2"
    assert data["reports"] == 2
    again = BudgetLedger(path, total_epsilon=5.0)
    assert (again.spent, again.remaining, again.reports) == (2.5, 2.5, 2)


def test_exhaustion_exactly_at_the_boundary(tmp_path: Path) -> None:
    ledger = BudgetLedger(tmp_path / "l.json", total_epsilon=2.0)
    for _ in range(4):
        ledger.charge(0.5)  # 4 x 0.5 == 2.0 exactly: allowed
    assert ledger.remaining == 0.0
    assert not ledger.can_afford(0.5)
    with pytest.raises(BudgetExhausted) as info:
        ledger.charge(0.5)
    assert isinstance(info.value, CocoError)
    assert (info.value.spent, info.value.total, info.value.epsilon) == (2.0, 2.0, 0.5)
    assert ledger.reports == 4
    assert BudgetLedger(tmp_path / "l.json", total_epsilon=2.0).reports == 4


def test_float_sums_never_creep_over_the_total(tmp_path: Path) -> None:
    # In binary, 0.1 + 0.1 + 0.1 > 0.3: the safe answer is to refuse the third report.
    ledger = BudgetLedger(tmp_path / "l.json", total_epsilon=0.3)
    ledger.charge(0.1)
    ledger.charge(0.1)
    with pytest.raises(BudgetExhausted):
        ledger.charge(0.1)
    assert ledger.spent <= 0.3
    # Many small charges: the exact sum never exceeds the total.
    many = BudgetLedger(tmp_path / "m.json", total_epsilon=1.0)
    count = 0
    while many.can_afford(0.01):
        many.charge(0.01)
        count += 1
    assert count == 99  # 100 x float(0.01) is slightly more than 1
    assert many.spent <= 1.0


def test_refused_charge_writes_nothing(tmp_path: Path) -> None:
    path = tmp_path / "l.json"
    ledger = BudgetLedger(path, total_epsilon=1.0)
    ledger.charge(1.0)
    before = path.read_bytes()
    with pytest.raises(BudgetExhausted):
        ledger.charge(1.0)
    assert path.read_bytes() == before


def test_charge_is_on_disk_when_it_returns(tmp_path: Path) -> None:
    """Crash safety: a second reader (a restarted process) sees every charge at once."""
    path = tmp_path / "l.json"
    ledger = BudgetLedger(path, total_epsilon=3.0)
    for k in range(1, 4):
        ledger.charge(1.0)
        # what a process restarted right now (before the report left) would load
        assert BudgetLedger(path, total_epsilon=3.0).reports == k
    assert not list(tmp_path.glob(".l.json.*"))  # no temp files left behind


def test_lower_total_does_not_reset_spending(tmp_path: Path) -> None:
    path = tmp_path / "l.json"
    BudgetLedger(path, total_epsilon=3.0).charge(2.0)
    smaller = BudgetLedger(path, total_epsilon=1.0)
    assert smaller.spent == 2.0
    assert smaller.remaining == 0.0
    with pytest.raises(BudgetExhausted):
        smaller.charge(0.5)


@pytest.mark.parametrize(
    "content",
    [
        "",
        "{not json",
        "[]",
        '{"version": 2, "spent_epsilon": 0, "spent_epsilon_exact": "0/1", "reports": 0}',
        '{"version": 1, "spent_epsilon": 1.0, "spent_epsilon_exact": "x", "reports": 1}',
        '{"version": 1, "spent_epsilon": 1.0, "spent_epsilon_exact": "1/0", "reports": 1}',
        '{"version": 1, "spent_epsilon": -1.0, "spent_epsilon_exact": "-1/1", "reports": 1}',
        '{"version": 1, "spent_epsilon": 1.0, "spent_epsilon_exact": "1/1", "reports": -1}',
        '{"version": 1, "spent_epsilon": 0.0, "spent_epsilon_exact": "1/1", "reports": 1}',
        '{"version": 1, "spent_epsilon": 1.0, "spent_epsilon_exact": "1/1"}',
    ],
)
def test_corrupt_file_is_an_error_not_a_reset(tmp_path: Path, content: str) -> None:
    path = tmp_path / "ledger.json"
    path.write_text(content)
    with pytest.raises(LedgerError, match=str(path)) as info:
        BudgetLedger(path, total_epsilon=10.0)
    assert info.value.path == path
    assert path.read_text() == content  # untouched


def test_unreadable_file_is_an_error(tmp_path: Path) -> None:
    path = tmp_path / "ledger.json"
    path.mkdir()  # a directory where the file should be: reading fails with OSError
    with pytest.raises(LedgerError, match="cannot be read"):
        BudgetLedger(path, total_epsilon=1.0)


def test_unwritable_location_fails_at_start(tmp_path: Path) -> None:
    not_a_directory = tmp_path / "plain-file"
    not_a_directory.write_text("")  # works as root too, unlike permission bits
    with pytest.raises(LedgerError, match="cannot be written"):
        BudgetLedger(not_a_directory / "l.json", total_epsilon=1.0)


@pytest.mark.parametrize("bad", [0.0, -1.0, float("nan"), float("inf")])
def test_charge_rejects_invalid_epsilon(tmp_path: Path, bad: float) -> None:
    ledger = BudgetLedger(tmp_path / "l.json", total_epsilon=1.0)
    with pytest.raises(ValueError, match="epsilon"):
        ledger.charge(bad)


@pytest.mark.parametrize("bad", [-1.0, float("nan"), float("inf")])
def test_total_must_be_finite_and_non_negative(tmp_path: Path, bad: float) -> None:
    with pytest.raises(ValueError, match="total_epsilon"):
        BudgetLedger(tmp_path / "l.json", total_epsilon=bad)
