"""The accuracy figures, inspected as matplotlib objects: ticks, ratio panel, error bars."""

from __future__ import annotations

import math
from typing import Any

import matplotlib.pyplot as plt
import numpy as np
import pytest
from matplotlib.axes import Axes
from matplotlib.figure import Figure as MplFigure

from sim.experiments.plots import (
    Figure,
    ci_factor,
    closed_form_ratio,
    draw_figure,
)

EPSILONS = [0.001, 0.01, 0.1, 0.2, 0.4, 0.8, 1.0, 1.5, 2.0]
N, D = 100_000, 256
SS = [4, 8]


def _rows(mechanisms: list[str], *, metric: str = "MSE", repeats: int = 3) -> list[dict[str, Any]]:
    """Summary rows with made-up errors: mechanism ``i`` has ``mean_ln = i - ln(eps) + s/10``."""
    rows = []
    for i, mech in enumerate(mechanisms):
        for s in SS:
            for eps in EPSILONS:
                rows.append(
                    {
                        "mechanism": mech,
                        "n": N,
                        "d": D,
                        "s": s,
                        "epsilon": eps,
                        "target": "mean",
                        "projected": 0,
                        "metric": metric,
                        "repeats": repeats,
                        "mean_ln": 0.1 * i - math.log(eps) + s / 10,
                        "se_ln": 0.05,
                    }
                )
    return rows


FIG = Figure(key="test", paper_label=None, n=N, d=D, target="mean", metric="MSE", projected=False)


def _draw(rows: list[dict[str, Any]], fig: Figure = FIG) -> MplFigure:
    figure = draw_figure(rows, fig)
    assert figure is not None
    return figure


def _axes(figure: MplFigure, prefix: str) -> dict[int, Axes]:
    out = {}
    for ax in figure.axes:
        label = str(ax.get_label())
        if label.startswith(prefix):
            out[int(label.split("=")[1])] = ax
    return out


@pytest.fixture
def figure() -> Any:
    fig = _draw(_rows(["Collision", "CoCo", "PrivKV"]))
    yield fig
    plt.close(fig)


def test_a_labelled_tick_at_every_epsilon_of_the_grid(figure: MplFigure) -> None:
    panels = [*_axes(figure, "errors").values(), *_axes(figure, "ratio").values()]
    assert len(panels) == 2 * len(SS)
    for ax in panels:
        assert ax.get_xscale() == "log"
        assert list(ax.get_xticks()) == pytest.approx(EPSILONS)
        assert len(ax.xaxis.get_minor_locator()()) == 0
    # The bottom row carries the labels, one per grid value, as written in the grid.
    for ax in _axes(figure, "ratio").values():
        assert [t.get_text() for t in ax.get_xticklabels()] == [f"{e:g}" for e in EPSILONS]


def test_ratio_panel_shows_the_measured_ratio_and_the_closed_form(figure: MplFigure) -> None:
    ratio_axes = _axes(figure, "ratio")
    assert sorted(ratio_axes) == SS
    for s, ax in ratio_axes.items():
        # Measured: exp(mean_ln(CoCo) - mean_ln(Collision)) = exp(0.1) in the made-up rows.
        (measured,) = [ln for ln in ax.get_lines() if ln.get_label() == "measured"]
        expect_measured = [math.exp(0.1)] * len(EPSILONS)
        assert list(np.asarray(measured.get_ydata())) == pytest.approx(expect_measured)
        # The closed-form line, at every epsilon of the grid.
        (line,) = [ln for ln in ax.get_lines() if ln.get_label() == "closed form"]
        assert list(np.asarray(line.get_xdata())) == pytest.approx(EPSILONS)
        expect = [closed_form_ratio("MSE", "mean", d=D, s=s, eps=e) for e in EPSILONS]
        assert list(np.asarray(line.get_ydata())) == pytest.approx(expect)
    assert ratio_axes[SS[0]].get_ylabel() == "MSE: CoCo / Collision"


def test_error_bars_are_95_percent_intervals_and_the_figure_says_so(figure: MplFigure) -> None:
    texts = [t.get_text() for t in figure.texts]
    assert any("95% confidence interval" in t and "3 repetitions" in t for t in texts)
    assert any("4.30 standard errors" in t for t in texts)
    # The bar of the first point of the first mechanism spans exp(mean_ln +- t se_ln).
    ax = _axes(figure, "errors")[SS[0]]
    segments = ax.collections[0].get_segments()  # type: ignore[attr-defined]
    (_, lo), (_, hi) = segments[0]
    mean_ln = -math.log(EPSILONS[0]) + SS[0] / 10
    half = ci_factor(3) * 0.05
    assert lo == pytest.approx(math.exp(mean_ln - half))
    assert hi == pytest.approx(math.exp(mean_ln + half))


def test_student_quantiles() -> None:
    assert ci_factor(3) == pytest.approx(4.3027, abs=1e-4)
    assert ci_factor(100) == pytest.approx(1.9842, abs=1e-4)
    assert math.isnan(ci_factor(1))


def test_no_ratio_panel_without_both_collision_and_coco() -> None:
    figure = _draw(_rows(["Collision", "PrivKV"]))
    try:
        assert _axes(figure, "ratio") == {}
        for ax in _axes(figure, "errors").values():
            assert list(ax.get_xticks()) == pytest.approx(EPSILONS)
            assert [t.get_text() for t in ax.get_xticklabels()] == [f"{e:g}" for e in EPSILONS]
    finally:
        plt.close(figure)


@pytest.mark.parametrize("s", [2, 4, 8, 32, 64])
@pytest.mark.parametrize("d", [256, 512])
def test_l1_and_linf_gains_of_coco_are_the_square_root_of_the_mse_gain(d: int, s: int) -> None:
    """TVE/MAE ratio = sqrt(MSE ratio); the MSE gain is largest as eps -> 0 and stays below
    26.2%, so CoCo's TVE/MAE gain over Collision stays below 1 - sqrt(1 - 0.262) = 14.1%."""
    for eps in [1e-4, 1e-3, 0.01, 0.1, 0.5, 1.0, 2.0, 4.0]:
        mse = closed_form_ratio("MSE", "mean", d=d, s=s, eps=eps)
        for metric in ("TVE", "MAE"):
            assert closed_form_ratio(metric, "mean", d=d, s=s, eps=eps) == pytest.approx(
                math.sqrt(mse)
            )
        assert 1 - mse < 0.262
        assert 1 - math.sqrt(mse) < 0.141


def test_post_processed_figures_have_the_measured_ratio_but_no_closed_form_line() -> None:
    rows = [dict(r, projected=1) for r in _rows(["Collision", "CoCo"], metric="TVE")]
    fig = Figure(key="p", paper_label=None, n=N, d=D, target="mean", metric="TVE", projected=True)
    figure = _draw(rows, fig)
    try:
        for ax in _axes(figure, "ratio").values():
            labels = [ln.get_label() for ln in ax.get_lines()]
            assert "measured" in labels
            assert "closed form" not in labels
            assert "no closed form" in ax.get_title(loc="left")
    finally:
        plt.close(figure)
