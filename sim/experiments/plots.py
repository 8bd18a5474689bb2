"""The figures of the paper's section "Experiments", drawn from ``accuracy.csv`` rows.

One PNG per figure: ``x`` is the budget ``eps`` (log scale, a labelled tick at every ``eps`` of
the grid), one column per sparsity ``s``, ``y`` is the paper's statistic, the mean of
``ln(error)`` over repetitions, shown as its exponential (the geometric mean) on a log axis.
Bars are 95% confidence intervals of that geometric mean: ``exp(mean_ln +- t se_ln)`` with
``t`` the 97.5% Student quantile for ``repeats - 1`` degrees of freedom (4.30 for 3
repetitions, 1.98 for 100); a footnote in every figure says so. The paper's figure files are
missing (ERRATA item 7), so the figures follow the captions.

Where both Collision and CoCo are drawn, a second row shows their ratio of errors,
``exp(mean_ln(CoCo) - mean_ln(Collision))`` on a linear axis (the two curves are a few percent
apart on three or four decades of log axis above it), with a 95% interval from the two
standard errors (independent noise; the populations are shared, which only makes it
conservative), and, without post-processing, the closed-form ratio of
:func:`closed_form_ratio` as a line (the projection has no closed form).

Mean-error figures carry the order of the minimax rate as a dotted reference line, with
constant 1 (the theorems only give ``c`` > 0 and hold for ``eps <= 1``): it shows the slope
and scale, and is not a bound. ``MSE``: ``ds/(n eps^2)`` (Theorem "vectorminimax");
``TVE`` (an l1 error): ``d sqrt(s/(n eps^2))``, the l1 rate of Theorem "vectorminimax1"
(equal to ``sqrt(d * ds/(n eps^2))``); ``MAE`` (l-infinity): ``sqrt(s ln(d/s)/(n eps^2))``
(Theorem "maeminimax").
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import matplotlib as mpl

mpl.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
from matplotlib.axes import Axes
from matplotlib.figure import Figure as MplFigure
from matplotlib.ticker import FixedLocator, NullLocator
from scipy import stats

from sim.experiments.mechanisms import ProductMechanism, TRule
from sim.experiments.names import PAPER_ORDER

STYLE: dict[str, tuple[str, str]] = {
    "Collision": ("tab:red", "o"),
    "CoCo": ("tab:purple", "*"),
    "PrivKV": ("tab:blue", "s"),
    "PCKV-UE": ("tab:green", "^"),
    "PCKV-GRR": ("tab:orange", "v"),
    "PCKV-AGRR": ("tab:brown", "D"),
    "SUCCINCT": ("tab:gray", "x"),
}


@dataclass(frozen=True, kw_only=True)
class Figure:
    """One figure: a metric of one target at one ``(n, d)``, projected or not."""

    key: str
    paper_label: str | None
    n: int
    d: int
    target: str
    metric: str
    projected: bool

    @property
    def filename(self) -> str:
        return f"accuracy-{self.key}.png"

    @property
    def caption(self) -> str:
        what = "Frequency estimation" if self.target == "freq" else "Mean estimation"
        post = "with" if self.projected else "without"
        src = f"paper Fig. `{self.paper_label}`" if self.paper_label else "not in the paper"
        return f"{what} {self.metric} {post} post-processing, n={self.n:,}, d={self.d} ({src})"


def _fig(label: str | None, n: int, d: int, target: str, metric: str, proj: bool) -> Figure:  # noqa: PLR0917
    key = f"{target}-{metric}-{'proj' if proj else 'raw'}-n{n}-d{d}"
    return Figure(
        key=key, paper_label=label, n=n, d=d, target=target, metric=metric, projected=proj
    )


FIGURES: tuple[Figure, ...] = (
    _fig("tve256n100000", 100_000, 256, "freq", "TVE", True),
    _fig("mae256n100000", 100_000, 256, "freq", "MAE", True),
    _fig("tve512n100000", 100_000, 512, "freq", "TVE", True),
    _fig("mae512n100000", 100_000, 512, "freq", "MAE", True),
    _fig("tve256n10000", 10_000, 256, "freq", "TVE", True),
    _fig("mae256n10000", 10_000, 256, "freq", "MAE", True),
    _fig("mae256n100000meanraw", 100_000, 256, "mean", "MAE", False),
    _fig("mae256n100000mean", 100_000, 256, "mean", "MAE", True),
    _fig("tve256n100000mean", 100_000, 256, "mean", "TVE", True),
    _fig("tve512n100000mean", 100_000, 512, "mean", "TVE", True),
    _fig("tve256n10000mean", 10_000, 256, "mean", "TVE", True),
    _fig(None, 100_000, 256, "freq", "TVE", False),
    _fig(None, 100_000, 256, "mean", "TVE", False),
    _fig(None, 100_000, 256, "mean", "MSE", False),
)
"""The paper's eleven figures (labels as in its source), then three it does not have:
frequency TVE and mean TVE without post-processing, and the mean MSE whose minimax order is
exactly ``ds/(n eps^2)``."""


def minimax_order(metric: str, *, n: int, d: int, s: int, eps: np.ndarray) -> np.ndarray:
    """The reference line of the mean-error figures (module docs), constant 1."""
    e = np.asarray(eps, dtype=np.float64)
    if metric == "MSE":
        return d * s / (n * e**2)
    if metric == "TVE":
        return d * np.sqrt(s / (n * e**2))
    return np.sqrt(s * math.log(d / s) / (n * e**2)) if d > s else np.full_like(e, np.nan)


def _series(rows: list[dict[str, Any]], fig: Figure, s: int) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        if (r["n"], r["d"], r["s"], r["target"], r["metric"]) != (
            fig.n,
            fig.d,
            s,
            fig.target,
            fig.metric,
        ):
            continue
        name = r["mechanism"]
        if bool(r["projected"]) == fig.projected:
            out.setdefault(name, []).append(r)
        elif fig.target == "mean" and fig.projected and name == "SUCCINCT":
            # SUCCINCT has no item estimates to project: show its raw error for comparison.
            out.setdefault(f"{name} (raw)", []).append(r)
    for series in out.values():
        series.sort(key=lambda r: r["epsilon"])
    return out


def ci_factor(repeats: int) -> float:
    """``t`` of the 95% interval ``mean_ln +- t se_ln``: the Student quantile with ``repeats - 1``
    degrees of freedom (``nan`` for a single repetition, which has no standard error)."""
    if repeats < 2:
        return math.nan
    return float(stats.t.ppf(0.975, repeats - 1))


def closed_form_ratio(
    metric: str, target: str, *, d: int, s: int, eps: float, t_rule: TRule = "optimal"
) -> float:
    """CoCo's error over Collision's in closed form (:mod:`edge.theory`), without projection.

    ``R`` is the ratio of the exact per-report mean-squared errors: of the means
    (``mean_mse``) for ``target="mean"``, of the ``2d`` items (``(freq_mse + mean_mse) / 2``,
    since ``f(j+-) = (f_j +- m_j) / 2``) for ``"freq"``. The MSE ratio is ``R``. The TVE and
    MAE ratios are ``sqrt(R)``: every coordinate of the paper's populations has the same
    non-missing frequency ``s/d`` in expectation and a mean near 0, so the estimation errors
    are, for large ``n``, i.i.d. normal up to a common scale ``sigma``; a sum or a maximum of
    absolute values then scales like ``sigma = sqrt(MSE / d)``, and the mean of its log
    shifts by ``ln sigma``.
    """
    mse = []
    for kind in ("coco", "collision"):
        m = ProductMechanism(kind, d=d, s=s, epsilon=eps, t_rule=t_rule).spec.moments
        mse.append(
            m.mean_mse(d, s) if target == "mean" else (m.freq_mse(d, s) + m.mean_mse(d, s)) / 2
        )
    ratio = mse[0] / mse[1]
    return ratio if metric == "MSE" else math.sqrt(ratio)


def _epsilon_axis(ax: Axes, epsilons: list[float], *, labels: bool) -> None:
    """Log ``eps`` axis with a tick at every grid value, labelled ``%g``, and no others."""
    ax.set_xscale("log")
    ax.xaxis.set_major_locator(FixedLocator(epsilons))
    ax.xaxis.set_minor_locator(NullLocator())
    if labels:
        ax.set_xticklabels([f"{e:g}" for e in epsilons], rotation=90, fontsize=7)
        ax.set_xlabel("ε")
    else:
        ax.set_xticklabels([])
    lo, hi = min(epsilons), max(epsilons)
    ax.set_xlim(lo / 1.35, hi * 1.35)


def _log_errorbar(
    ax: Axes, x: np.ndarray, log_y: np.ndarray, half: np.ndarray, **style: Any
) -> Any:
    """Points ``exp(log_y)`` with bars ``exp(log_y +- half)``; returns the data line."""
    y = np.exp(log_y)
    yerr = np.vstack([y - np.exp(log_y - half), np.exp(log_y + half) - y])
    (line, *_rest) = ax.errorbar(x, y, yerr=yerr, elinewidth=1.0, capsize=3, **style)
    return line


def _draw_errors(
    ax: Axes, series: dict[str, list[dict[str, Any]]], handles: dict[str, Any]
) -> None:
    order = {name: i for i, name in enumerate(PAPER_ORDER)}
    for label in sorted(series, key=lambda m: (order.get(m.split(" ")[0], 99), m)):
        pts = series[label]
        base = label.split(" ")[0]
        color, marker = STYLE.get(base, ("black", "."))
        eps = np.array([r["epsilon"] for r in pts])
        mean_ln = np.array([r["mean_ln"] for r in pts])
        half = np.nan_to_num(
            np.array([ci_factor(int(r["repeats"])) * r["se_ln"] for r in pts], dtype=np.float64)
        )
        line = _log_errorbar(
            ax,
            eps,
            mean_ln,
            half,
            color=color,
            marker=marker,
            markersize=4,
            linewidth=1.2,
            linestyle="--" if label != base else "-",
            label=label,
        )
        handles.setdefault(label, line)


def _ratio_points(
    series: dict[str, list[dict[str, Any]]],
) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """``(eps, ratio, half-width in log)`` of CoCo over Collision at their common ``eps``."""
    if "CoCo" not in series or "Collision" not in series:
        return None
    coll = {r["epsilon"]: r for r in series["Collision"]}
    pairs = [(r, coll[r["epsilon"]]) for r in series["CoCo"] if r["epsilon"] in coll]
    if not pairs:
        return None
    eps = np.array([a["epsilon"] for a, _ in pairs])
    log_ratio = np.array([a["mean_ln"] - b["mean_ln"] for a, b in pairs])
    half = np.array(
        [
            ci_factor(min(int(a["repeats"]), int(b["repeats"])))
            * math.hypot(a["se_ln"], b["se_ln"])
            for a, b in pairs
        ],
        dtype=np.float64,
    )
    return eps, log_ratio, np.nan_to_num(half)


def _draw_ratio(
    ax: Axes,
    fig: Figure,
    *,
    s: int,
    points: tuple[np.ndarray, np.ndarray, np.ndarray],
    handles: dict[str, Any],
    t_rule: TRule,
) -> None:
    eps, log_ratio, half = points
    color, marker = STYLE["CoCo"]
    measured = _log_errorbar(
        ax, eps, log_ratio, half, color=color, marker=marker, markersize=5, linestyle="none"
    )
    measured.set_label("measured")
    handles.setdefault("CoCo / Collision, measured", measured)
    if fig.projected:
        # The projection is non-linear: no closed form. The raw one would mislead here (CoCo's
        # raw item error is up to several times Collision's; projected, they are close).
        ax.set_title("(no closed form after post-processing)", fontsize=7, loc="left")
    else:
        theory = [
            closed_form_ratio(fig.metric, fig.target, d=fig.d, s=s, eps=e, t_rule=t_rule)
            for e in eps
        ]
        (line,) = ax.plot(eps, theory, color="black", label="closed form", linewidth=1.2)
        handles.setdefault("CoCo / Collision, closed form (edge/theory.py)", line)
    ax.axhline(1.0, color="gray", linewidth=0.8)
    ax.grid(True, axis="y", alpha=0.25)


def error_bar_note(rows: list[dict[str, Any]], fig: Figure) -> str:
    """The footnote that says what the bars are (repetitions as in ``rows``)."""
    reps = sorted({int(r["repeats"]) for r in rows if (r["n"], r["d"]) == (fig.n, fig.d)})
    rep_text = "/".join(str(r) for r in reps) or "?"
    t_text = "/".join(f"{ci_factor(r):.2f}" for r in reps)
    return (
        f"Markers: geometric mean of the error over {rep_text} repetitions. Bars: 95% confidence "
        f"interval, exp(mean ln error ± {t_text} standard errors) (Student t); "
        "bars shorter than a marker are hidden by it. Ratio panel: the same for the ratio."
    )


def _panel_width(rows: list[dict[str, Any]], fig: Figure) -> float:
    """Inches per panel: 3.3, or wider where the grid spans many decades of ``eps``, so that
    the labels of close budgets (0.8 and 1: a tenth of a decade) do not overlap."""
    eps = [r["epsilon"] for r in rows if (r["n"], r["d"]) == (fig.n, fig.d)]
    decades = math.log10(max(eps) / min(eps)) if eps else 0.0
    return max(3.3, 1.3 * decades)


def draw_figure(
    rows: list[dict[str, Any]], fig: Figure, *, t_rule: TRule = "optimal"
) -> MplFigure | None:
    """``fig`` as a matplotlib figure; ``None`` if the rows lack its cells."""
    ss = sorted({r["s"] for r in rows if (r["n"], r["d"]) == (fig.n, fig.d)})
    panels = [(s, _series(rows, fig, s)) for s in ss]
    panels = [(s, p) for s, p in panels if p]
    if not panels:
        return None
    ratios = [_ratio_points(p) for _, p in panels]
    with_ratio = any(r is not None for r in ratios)
    nrows = 2 if with_ratio else 1
    figure, axes = plt.subplots(
        nrows,
        len(panels),
        figsize=(_panel_width(rows, fig) * len(panels) + 0.6, 6.4 if with_ratio else 4.2),
        squeeze=False,
        sharex="col",
        gridspec_kw={"height_ratios": [2.2, 1.0]} if with_ratio else None,
    )
    handles: dict[str, Any] = {}
    for col, (s, series) in enumerate(panels):
        ax = axes[0][col]
        ax.set_label(f"errors s={s}")
        _draw_errors(ax, series, handles)
        eps_all = sorted({r["epsilon"] for v in series.values() for r in v})
        if fig.target == "mean":
            ref = minimax_order(fig.metric, n=fig.n, d=fig.d, s=s, eps=np.array(eps_all))
            (line,) = ax.plot(eps_all, ref, color="black", linestyle=":", linewidth=1.2)
            handles.setdefault(_reference_label(fig.metric), line)
        ax.set_yscale("log")
        ax.set_title(f"s = {s}", fontsize=10)
        ax.grid(True, which="major", alpha=0.25)
        _epsilon_axis(ax, eps_all, labels=not with_ratio)
        if with_ratio:
            rax = axes[1][col]
            rax.set_label(f"ratio s={s}")
            points = ratios[col]
            if points is not None:
                _draw_ratio(rax, fig, s=s, points=points, handles=handles, t_rule=t_rule)
            _epsilon_axis(rax, eps_all, labels=True)
    axes[0][0].set_ylabel(f"{fig.metric} (geometric mean)")
    if with_ratio:
        axes[1][0].set_ylabel(f"{fig.metric}: CoCo / Collision")
    figure.suptitle(fig.caption, fontsize=10)
    ncol = 4
    legend_rows = math.ceil(len(handles) / ncol)
    figure.legend(
        list(handles.values()),
        list(handles),
        loc="lower center",
        bbox_to_anchor=(0.5, 0.035),
        ncol=ncol,
        fontsize=8,
        frameon=False,
    )
    figure.text(0.5, 0.008, error_bar_note(rows, fig), ha="center", fontsize=7, wrap=True)
    bottom = 0.075 + 0.03 * legend_rows
    figure.tight_layout(rect=(0, bottom, 1, 0.97))
    return figure


def plot_figure(
    rows: list[dict[str, Any]], fig: Figure, path: Path, *, t_rule: TRule = "optimal"
) -> Path | None:
    """Draw ``fig`` from summary rows into ``path``; ``None`` if the rows lack its cells."""
    figure = draw_figure(rows, fig, t_rule=t_rule)
    if figure is None:
        return None
    figure.savefig(path, dpi=100)
    plt.close(figure)
    return path


def _reference_label(metric: str) -> str:
    return {
        "MSE": "order ds/(nε²), constant 1",
        "TVE": "order d·√(s/(nε²)), constant 1",
        "MAE": "order √(s·ln(d/s)/(nε²)), constant 1",
    }[metric]


GENERIC: tuple[tuple[str, str, bool], ...] = (
    ("freq", "TVE", True),
    ("freq", "MAE", True),
    ("mean", "MAE", False),
    ("mean", "TVE", True),
    ("mean", "MSE", False),
)
"""(target, metric, projected) drawn for an ``(n, d)`` that no paper figure shows."""


def figures_for(configs: list[tuple[int, int]]) -> list[Figure]:
    """The figures of :data:`FIGURES` at ``configs``, and the :data:`GENERIC` ones for every
    configuration the paper has no figure of (e.g. ``n = 10,000``, ``d = 512``)."""
    present = set(configs)
    out = [f for f in FIGURES if (f.n, f.d) in present]
    covered = {(f.n, f.d) for f in FIGURES}
    for n, d in configs:
        if (n, d) not in covered:
            out += [_fig(None, n, d, tg, m, p) for tg, m, p in GENERIC]
    return out


def plot_all(rows: list[dict[str, Any]], out: Path, *, t_rule: TRule = "optimal") -> list[Path]:
    """Every figure of :func:`figures_for` the configurations of ``rows``, into ``out``
    (``t_rule``: the one the rows were run with, for the closed-form ratio line)."""
    configs = sorted({(r["n"], r["d"]) for r in rows}, key=lambda c: (-c[0], c[1]))
    paths = []
    for fig in figures_for(configs):
        path = plot_figure(rows, fig, out / fig.filename, t_rule=t_rule)
        if path is not None:
            paths.append(path)
    return paths
