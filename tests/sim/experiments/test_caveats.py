"""Exact budgets of the baselines and the constant answers (sim/experiments/caveats.py)."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from sim.cli import app
from sim.experiments.accuracy import Grid, Task, population_seed, run_grid, summarise
from sim.experiments.caveats import (
    BEGIN_MARKER,
    CONSTANT,
    END_MARKER,
    PRIVKV_EQUAL,
    exact_level,
    extra_rows,
    privkv_nominal_for,
    render,
)
from sim.experiments.data import uniform_population


def test_exact_levels_in_closed_form() -> None:
    for eps in (0.1, 1.0, 2.0):
        # PrivKV, even split: ln(2 e^eps / (1 + e^(eps/2))), whatever s.
        expect = math.log(2 * math.exp(eps) / (1 + math.exp(eps / 2)))
        for s in (1, 4, 32):
            assert exact_level("PrivKV", s=s, epsilon=eps) == pytest.approx(expect, abs=1e-6)
            assert exact_level("PCKV-GRR", s=s, epsilon=eps) == pytest.approx(
                math.log(1 + math.expm1(eps) / s), abs=1e-6
            )
    # The numbers quoted in docs/results.md, at eps = 1.
    assert round(exact_level("PrivKV", s=4, epsilon=1.0), 2) == 0.72
    assert round(exact_level("PCKV-GRR", s=4, epsilon=1.0), 2) == 0.36
    with pytest.raises(ValueError, match="PCKV-UE"):
        exact_level("PCKV-UE", s=4, epsilon=1.0)


@pytest.mark.parametrize("eps", [0.1, 0.4, 1.0, 2.0])
def test_privkv_nominal_budget_spends_exactly_eps(eps: float) -> None:
    nominal = privkv_nominal_for(eps)
    assert nominal > eps
    assert exact_level("PrivKV", s=1, epsilon=nominal) <= eps
    assert exact_level("PrivKV", s=1, epsilon=nominal) == pytest.approx(eps, abs=1e-6)


def test_constant_rows_are_the_errors_of_answering_zero_on_the_runs_populations() -> None:
    n, d, s, seed = 2_000, 16, 2, 7
    rows = extra_rows([(n, d, s)], epsilons=[0.5, 1.0], repeats=2, seed=seed, privkv=False)
    assert {r["mechanism"] for r in rows} == {CONSTANT}
    for r in range(2):
        task = Task(n=n, d=d, s=s, epsilon=0.5, repeat=r)
        pop = uniform_population(n, d, s, np.random.default_rng(population_seed(seed, task)))
        mse = [
            x["value"]
            for x in rows
            if (x["repeat"], x["target"], x["metric"], x["projected"]) == (r, "mean", "MSE", 0)
        ]
        assert mse == pytest.approx([float((pop.means() ** 2).sum())] * 2)
        freq_tve = [
            x["value"]
            for x in rows
            if (x["repeat"], x["target"], x["metric"], x["projected"]) == (r, "freq", "TVE", 0)
        ]
        truth = pop.item_frequencies()
        assert freq_tve[0] == pytest.approx(float(np.abs(truth - s / (2 * d)).sum()))


def test_constant_mean_mse_is_s_over_n_in_expectation() -> None:
    """E[sum_j m_j^2] = d Var(x_ij) / n = s / n; K = 5 standard errors over 200 populations."""
    n, d, s, reps = 500, 8, 2, 200
    rows = extra_rows([(n, d, s)], epsilons=[1.0], repeats=reps, seed=3, privkv=False)
    key = ("mean", "MSE", 0)
    v = np.array([r["value"] for r in rows if (r["target"], r["metric"], r["projected"]) == key])
    assert v.size == reps
    assert abs(v.mean() - s / n) < 5 * v.std(ddof=1) / math.sqrt(reps)


def _tiny_summary() -> list[dict[str, object]]:
    grid = Grid(
        configs=((400, 16),),
        ss=(2,),
        epsilons=(0.5, 1.0),
        repeats=2,
        mechanisms=("Collision", "CoCo", "PrivKV", "PCKV-GRR", "PCKV-AGRR"),
    )
    results = run_grid(grid, seed=1, jobs=1, t_rule="optimal", progress=False)
    return summarise([r for res in results for r in res.rows])


def test_render_has_every_table_and_privkv_at_equal_exact_budget() -> None:
    text = render(_tiny_summary(), seed=1)
    assert "nominal ε at which PrivKV spends ε" in text
    assert "vs PCKV-GRR at equal exact ε (= PCKV-AGRR)" in text
    assert f"vs {PRIVKV_EQUAL}" in text
    assert "cells where the best mechanism beats the constant" in text
    for metric in ("MSE", "TVE", "MAE"):
        assert f"constant 0: {metric}" in text


def test_cli_pastes_between_its_markers(tmp_path: Path) -> None:
    from sim.experiments.accuracy import SUMMARY_FIELDS, write_csv  # noqa: PLC0415

    csv = write_csv(tmp_path / "accuracy.csv", SUMMARY_FIELDS, _tiny_summary())
    doc = tmp_path / "results.md"
    doc.write_text(f"before\n{BEGIN_MARKER}\nold\n{END_MARKER}\nafter\n")
    runner = CliRunner()
    args = ["experiment", "caveats", "--csv", str(csv), "--update-doc", str(doc)]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    text = doc.read_text()
    assert text.startswith(f"before\n{BEGIN_MARKER}\n")
    assert text.endswith(f"{END_MARKER}\nafter\n")
    assert "old" not in text
    assert "constant 0: MSE" in text
    bare = tmp_path / "bare.md"
    bare.write_text("no markers\n")
    result = runner.invoke(app, [*args[:-1], str(bare)])
    assert result.exit_code == 1
    assert "caveats-summary" in result.output
