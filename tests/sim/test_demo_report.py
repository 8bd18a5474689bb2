"""What the demo prints for people: intervals within the channels' physical ranges, the
faulty devices explained, the MSE judged against its closed form, and a progress line that
says "pending" while the accountant trails."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest

from sim.demo.pipeline import level_text
from sim.demo.report import (
    CLIPPED_NOTE,
    FAULTY_NOTE,
    OUTSIDE_NOTE,
    format_table,
    interval_in_range,
    mse_range,
    outbox_accounting,
)


def test_an_interval_is_cut_to_the_physical_range() -> None:
    assert interval_in_range(500.0, 100.0, 350.0, 5000.0) == (400.0, 600.0, "inside")
    assert interval_in_range(545.0, 690.0, 350.0, 5000.0) == (350.0, 1235.0, "cut")
    assert interval_in_range(10.0, 98.0, 0.0, 100.0) == (0.0, 100.0, "cut")
    assert interval_in_range(-88.0, 100.0, 0.0, 1000.0) == (0.0, 12.0, "cut")
    # an interval that misses the range misses the true mean: shown as it is
    assert interval_in_range(-88.0, 20.0, 0.0, 1000.0) == (-108.0, -68.0, "outside")
    assert interval_in_range(1200.0, 50.0, 0.0, 1000.0) == (1150.0, 1250.0, "outside")


@pytest.mark.parametrize("d", [1, 6, 20])
def test_the_mse_range_holds_95_percent_of_runs(d: int) -> None:
    """Sums of d squared standard normal errors over their expectation d: the fraction in
    mse_range(d) is 0.95 within 4 binomial standard errors (seeded)."""
    low, high = mse_range(d)
    assert 0 < low < 1 < high
    runs = 20_000
    ratio = (np.random.default_rng(7).standard_normal((runs, d)) ** 2).sum(axis=1) / d
    inside = float(np.mean((ratio >= low) & (ratio <= high)))
    assert abs(inside - 0.95) <= 4 * math.sqrt(0.95 * 0.05 / runs)


def result(*, estimate: float, half: float, mse: float) -> dict[str, Any]:
    low, high, where = interval_in_range(estimate, half, 350.0, 5000.0)
    return {
        "broker": "embedded at mqtt://127.0.0.1:1",
        "mechanism": "coco",
        "d": 6,
        "s": 2,
        "t": 6,
        "devices": 200,
        "rounds": 3,
        "faulty_devices": 15,
        "channels": [
            {
                "name": "co2",
                "unit": "ppm",
                "estimate": estimate,
                "ci95_halfwidth": half,
                "ci95_lo": low,
                "ci95_hi": high,
                "ci95_range": where,
                "ground_truth": 600.0,
            }
        ],
        "epsilon_central": 0.5,
        "epsilon_total": 0.9,
        "epsilon_total_batches": 3,
        "epsilon_local": 4.0,
        "delta": 1e-6,
        "reports_sent": 600,
        "reports_aggregated": 600,
        "reports_rejected": 0,
        "reports_dropped": 0,
        "reports_buffered": 0,
        "reports_unaccounted": 0,
        "batches": 3,
        "batch_size_smallest": 200,
        "min_batch": 100,
        "mse_mean": mse,
        "mse_mean_theory": 0.01,
        "mse_mean_ratio_range95": list(mse_range(6)),
        "throughput_reports_per_s": 1000.0,
    }


def test_the_table_cuts_intervals_and_says_so() -> None:
    table = format_table(result(estimate=545.0, half=690.0, mse=0.01))
    assert "[350, 1235]*" in table
    assert CLIPPED_NOTE in table
    within = format_table(result(estimate=545.0, half=100.0, mse=0.01))
    assert "[445, 645] " in within
    assert CLIPPED_NOTE not in within
    assert "+- 1.96 SE" not in within
    missed = format_table(result(estimate=6000.0, half=500.0, mse=0.01))
    assert "[5500, 6500]!" in missed
    assert OUTSIDE_NOTE in missed
    assert CLIPPED_NOTE not in missed


def test_the_table_explains_the_faulty_devices() -> None:
    table = format_table(result(estimate=545.0, half=100.0, mse=0.01))
    assert "(15 of them faulty: see below)" in table
    assert f"faulty devices: 15; {FAULTY_NOTE}" in table
    assert "stuck channel)" not in table


def test_the_table_judges_the_mse_against_its_closed_form() -> None:
    low, high = mse_range(6)
    good = format_table(result(estimate=545.0, half=100.0, mse=0.006454))
    assert "closed form 0.01: ratio 0.65" in good
    assert f"[{low:.2f}, {high:.2f}] 95 % of the time for d=6: as expected" in good
    bad = format_table(result(estimate=545.0, half=100.0, mse=0.05))
    assert "ratio 5.00" in bad
    assert "outside that range: look closer" in bad


def test_the_progress_line_says_pending_while_the_accountant_trails() -> None:
    assert level_text(None, 0) == "-"
    assert level_text(None, 8000) == "pending"
    assert level_text(0.51234, 8000) == "0.5123"


@pytest.mark.parametrize(
    ("outbox", "applied_unacked", "counted", "expected"),
    [
        (0, 0, 0, (0, 0)),  # the usual end: every batch acknowledged
        (3000, 0, 3000, (3000, 0)),  # never published, counted dropped at shutdown: once
        (1000, 1000, 1000, (0, 0)),  # applied before its PUBACK came: aggregated only
        (3000, 1000, 3000, (2000, 0)),
        (3000, 1000, 0, (0, 2000)),  # the shuffler has not stopped: still buffered
    ],
)
def test_every_report_of_the_outbox_at_the_end_is_counted_once(
    outbox: int, applied_unacked: int, counted: int, expected: tuple[int, int]
) -> None:
    """A clean-clone run saw 6,000 accounted for 3,000 sent: a shuffler that could not
    publish counted its outbox as dropped, and the demo counted it again as buffered."""
    assert outbox_accounting(outbox, applied_unacked, counted) == expected
    dropped, buffered = expected
    assert dropped + buffered + applied_unacked == outbox
