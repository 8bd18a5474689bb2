"""The accuracy experiments: data, the Collision/CoCo adapters, the grid runner, the outputs."""

from __future__ import annotations

import csv
import itertools
import math
from pathlib import Path

import numpy as np
import pytest

from sim.experiments.accuracy import (
    PAPER_EPSILONS,
    QUICK_GRID,
    RAW_FIELDS,
    SUMMARY_FIELDS,
    TIMING_FIELDS,
    Grid,
    run_accuracy,
    run_grid,
    summarise,
    with_overrides,
)
from sim.experiments.accuracy_report import BEGIN_MARKER, END_MARKER
from sim.experiments.data import Population, uniform_population, uniform_subsets
from sim.experiments.mechanisms import ProductMechanism, registry
from sim.experiments.names import PAPER_ORDER

K = 5.0
"""Standard errors allowed in the Monte Carlo checks (two-sided p ~ 6e-7 per check)."""


# -- data ---------------------------------------------------------------------------------


def test_uniform_subsets_are_exactly_uniform_over_subsets_and_positions() -> None:
    n, d, s = 40_000, 6, 3
    keys = uniform_subsets(n, d, s, np.random.default_rng(1))
    assert keys.shape == (n, s)
    assert (np.sort(keys, axis=1)[:, 1:] != np.sort(keys, axis=1)[:, :-1]).all()
    assert keys.min() >= 0
    assert keys.max() < d
    # Each of the C(6, 3) = 20 subsets has probability 1/20.
    subsets = list(itertools.combinations(range(d), s))
    index = {sub: i for i, sub in enumerate(subsets)}
    counts = np.bincount([index[tuple(r)] for r in np.sort(keys, axis=1)], minlength=20)
    p = 1 / len(subsets)
    assert np.abs(counts - n * p).max() < K * math.sqrt(n * p * (1 - p))
    # Rows are in random order: every position holds each key with probability 1/d.
    p = 1 / d
    for col in range(s):
        c = np.bincount(keys[:, col], minlength=d)
        assert np.abs(c - n * p).max() < K * math.sqrt(n * p * (1 - p))


def test_population_signs_are_balanced_and_statistics_add_up() -> None:
    pop = uniform_population(20_000, 32, 8, np.random.default_rng(2))
    plus = float((pop.signs > 0).mean())
    assert abs(plus - 0.5) < K * math.sqrt(0.25 / pop.signs.size)
    freq = pop.item_frequencies()
    assert freq.shape == (2, 32)
    assert freq.sum() == pytest.approx(8.0)  # every user holds exactly s elements
    np.testing.assert_allclose(pop.means(), freq[0] - freq[1])


def test_population_statistics_by_hand() -> None:
    pop = Population(
        keys=np.array([[0, 2], [2, 1]], dtype=np.int64),
        signs=np.array([[1, -1], [-1, 1]], dtype=np.int8),
        d=3,
    )
    np.testing.assert_allclose(pop.item_frequencies(), [[0.5, 0.5, 0.0], [0.0, 0.0, 1.0]])
    np.testing.assert_allclose(pop.means(), [0.5, 0.5, -1.0])


# -- Collision and CoCo adapters ----------------------------------------------------------


@pytest.mark.parametrize("kind", ["collision", "coco"])
def test_product_adapter_is_unbiased_with_the_closed_form_variance(kind: str) -> None:
    """Per-dimension means and items, averaged over runs on one population, sit within K
    standard errors of the truth; the standard errors come from edge/theory.py."""
    d, s, eps, n, runs = 12, 3, 1.0, 2_000, 300
    mech = ProductMechanism(kind, d=d, s=s, epsilon=eps)  # type: ignore[arg-type]
    pop = uniform_population(n, d, s, np.random.default_rng(5))
    f_true, m_true = pop.item_frequencies(), pop.means()
    present = f_true[0] + f_true[1]
    mo = mech.spec.moments
    var_m = mo.mean_variance(present) / n
    var_f = mo.freq_variance(present) / n
    cov = mo.mean_freq_covariance(m_true) / n
    var_items = np.stack([(var_m + var_f + 2 * cov) / 4, (var_m + var_f - 2 * cov) / 4])
    rng = np.random.default_rng(6)
    ests = [mech.run(pop.keys, pop.signs, rng) for _ in range(runs)]
    means = np.array([e.mean for e in ests])
    items = np.array([e.freq for e in ests])
    assert np.abs(means.mean(axis=0) - m_true).max() < K * np.sqrt(var_m / runs).max()
    assert (np.abs(items.mean(axis=0) - f_true) < K * np.sqrt(var_items / runs)).all()
    # The spread matches the closed form too: summed squared error vs the exact MSE.
    sq = ((means - m_true) ** 2).sum(axis=1)
    theory = float(var_m.sum())
    assert abs(sq.mean() - theory) < K * sq.std(ddof=1) / math.sqrt(runs)
    # Per-item variances: measured vs closed form, within K standard errors of a variance.
    measured = items.var(axis=0, ddof=1)
    assert (np.abs(measured - var_items) < K * var_items * math.sqrt(2 / (runs - 1))).all()


def test_adapters_use_the_products_t_by_default_and_the_papers_on_request() -> None:
    opt = ProductMechanism("collision", d=256, s=8, epsilon=1.0)
    pap = ProductMechanism("collision", d=256, s=8, epsilon=1.0, t_rule="paper")
    assert opt.t == opt.spec.t  # the MSE-optimal t of MechanismSpec
    assert pap.t == math.floor(8 * math.e + 2 * 8 - 1)


def test_registry_has_every_mechanism_of_the_paper() -> None:
    assert set(PAPER_ORDER) <= set(registry())


# -- runner -------------------------------------------------------------------------------

TINY = Grid(configs=((400, 16),), ss=(2, 4), epsilons=(0.5, 2.0), repeats=2)


def test_rows_have_the_schema_and_one_row_per_metric() -> None:
    results = run_grid(TINY, seed=3, progress=False)
    rows = [r for res in results for r in res.rows]
    assert all(tuple(r) == RAW_FIELDS for r in rows)
    per_cell = 2 * 2 * 2  # s x eps x repeats
    # Mechanisms with item estimates: freq raw/projected x (TVE, MAE) + mean raw/projected x
    # (TVE, MAE, MSE) = 10 metrics; SUCCINCT: raw mean only, 3.
    expected = per_cell * (10 * (len(PAPER_ORDER) - 1) + 3)
    assert len(rows) == expected
    assert {r["mechanism"] for r in rows} == set(PAPER_ORDER)
    assert all(r["value"] >= 0 and math.isfinite(r["value"]) for r in rows)
    timings = [t for res in results for t in res.timings]
    assert all(tuple(t) == TIMING_FIELDS for t in timings)
    assert len(timings) == per_cell * len(PAPER_ORDER)


def test_summary_statistics_by_hand() -> None:
    base = {"mechanism": "CoCo", "n": 1, "d": 2, "s": 1, "epsilon": 1.0, "target": "mean"}
    rows = [
        {**base, "projected": 0, "metric": "TVE", "repeat": i, "value": v}
        for i, v in enumerate([1.0, math.e, math.e**2])
    ]
    (row,) = summarise(rows)
    assert tuple(row) == SUMMARY_FIELDS
    assert row["repeats"] == 3
    assert row["mean_ln"] == pytest.approx(1.0)
    assert row["se_ln"] == pytest.approx(1.0 / math.sqrt(3))  # std of (0, 1, 2) is 1
    assert row["geo_mean"] == pytest.approx(math.e)
    assert row["mean"] == pytest.approx((1 + math.e + math.e**2) / 3)


def test_seeded_and_independent_of_the_grid_around_a_cell() -> None:
    small = Grid(configs=((300, 12),), ss=(3,), epsilons=(1.0,), repeats=1)
    a = [r for res in run_grid(small, seed=7, progress=False) for r in res.rows]
    b = [r for res in run_grid(small, seed=7, progress=False) for r in res.rows]
    assert a == b
    big = with_overrides(small, epsilons=(0.5, 1.0), ss=(2, 3))
    c = [r for res in run_grid(big, seed=7, progress=False) for r in res.rows]
    assert [r for r in c if r["s"] == 3 and r["epsilon"] == 1.0] == a
    d = [r for res in run_grid(small, seed=8, progress=False) for r in res.rows]
    assert [r["value"] for r in d] != [r["value"] for r in a]


def test_worker_processes_give_the_same_rows() -> None:
    small = Grid(
        configs=((300, 12),), ss=(3,), epsilons=(0.5, 1.0), repeats=2, mechanisms=("CoCo",)
    )
    one = [r for res in run_grid(small, seed=9, progress=False) for r in res.rows]
    two = [r for res in run_grid(small, seed=9, jobs=2, progress=False) for r in res.rows]
    assert one == two


def test_unknown_mechanism_is_a_clear_error() -> None:
    grid = with_overrides(TINY, mechanisms=["Nope"])
    with pytest.raises(ValueError, match="unknown mechanism"):
        run_grid(grid, seed=1, progress=False)


def test_grids_match_the_paper() -> None:
    assert PAPER_EPSILONS == (0.001, 0.01, 0.1, 0.2, 0.4, 0.8, 1.0, 1.5, 2.0)
    assert QUICK_GRID.ss == (4, 8, 16, 32)
    assert set(QUICK_GRID.epsilons) <= set(PAPER_EPSILONS)
    with pytest.raises(ValueError, match="repeats"):
        Grid(configs=((10, 4),), ss=(2,), epsilons=(1.0,), repeats=0)
    with pytest.raises(ValueError, match="s <= d"):
        Grid(configs=((10, 4),), ss=(5,), epsilons=(1.0,), repeats=1)


# -- outputs ------------------------------------------------------------------------------


def test_end_to_end_writes_csv_png_and_a_summary(tmp_path: Path) -> None:
    doc = tmp_path / "results.md"
    doc.write_text(f"# Top\n\nkept\n{BEGIN_MARKER}\nold\n{END_MARKER}\n\nkept too\n")
    out = tmp_path / "results"
    run = run_accuracy(out, grid=TINY, seed=1, progress=False, update_doc=doc)
    names = {p.name for p in run.paths}
    assert {"accuracy.csv", "accuracy-raw.csv", "accuracy-timing.csv"} <= names
    pngs = sorted(out.glob("*.png"))
    assert pngs  # (n=400, d=16) has no paper figure: the generic set is drawn
    for png in pngs:
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with (out / "accuracy.csv").open() as fh:
        reader = csv.DictReader(fh)
        assert tuple(reader.fieldnames or ()) == SUMMARY_FIELDS
        assert len(list(reader)) > 0
    summary = (out / "accuracy-summary.md").read_text()
    assert "Collision's error reduction" in summary
    text = doc.read_text()
    assert text.startswith("# Top\n\nkept\n")
    assert text.endswith(f"{END_MARKER}\n\nkept too\n")
    assert "old" not in text
    assert "](results/accuracy-" in text  # image links relative to the document


def test_missing_markers_fail_before_running(tmp_path: Path) -> None:
    doc = tmp_path / "plain.md"
    doc.write_text("no markers\n")
    with pytest.raises(ValueError, match="accuracy-summary:begin"):
        run_accuracy(tmp_path / "o", grid=TINY, seed=1, progress=False, update_doc=doc)
    assert not (tmp_path / "o").exists()
