"""The figures of the paper's section "Experiments", drawn from ``accuracy.csv`` rows.

One PNG per figure: ``x`` is the budget ``eps`` (log scale), one panel per sparsity ``s``, ``y``
is the paper's statistic, the mean of ``ln(error)`` over repetitions, shown as its
exponential (the geometric mean) on a log axis, with bars of +-1 standard error of the mean
log. The paper's figure files are missing (ERRATA item 7), so the figures follow the captions.

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

from sim.experiments.mechanisms import PAPER_ORDER

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


def plot_figure(rows: list[dict[str, Any]], fig: Figure, path: Path) -> Path | None:
    """Draw ``fig`` from summary rows into ``path``; ``None`` if the rows lack its cells."""
    ss = sorted({r["s"] for r in rows if (r["n"], r["d"]) == (fig.n, fig.d)})
    panels = [(s, _series(rows, fig, s)) for s in ss]
    panels = [(s, p) for s, p in panels if p]
    if not panels:
        return None
    order = {name: i for i, name in enumerate(PAPER_ORDER)}
    figure, axes = plt.subplots(
        1, len(panels), figsize=(3.3 * len(panels) + 0.6, 3.4), squeeze=False
    )
    handles: dict[str, Any] = {}
    for ax, (s, series) in zip(axes[0], panels, strict=True):
        for label in sorted(series, key=lambda m: (order.get(m.split(" ")[0], 99), m)):
            pts = series[label]
            base = label.split(" ")[0]
            color, marker = STYLE.get(base, ("black", "."))
            eps = np.array([r["epsilon"] for r in pts])
            mean_ln = np.array([r["mean_ln"] for r in pts])
            se_ln = np.nan_to_num(np.array([r["se_ln"] for r in pts]))
            y = np.exp(mean_ln)
            yerr = np.vstack([y - np.exp(mean_ln - se_ln), np.exp(mean_ln + se_ln) - y])
            (line, *_rest) = ax.errorbar(
                eps,
                y,
                yerr=yerr,
                color=color,
                marker=marker,
                markersize=4,
                linewidth=1.2,
                capsize=2,
                linestyle="--" if label != base else "-",
                label=label,
            )
            handles.setdefault(label, line)
        if fig.target == "mean":
            eps_all = np.array(sorted({r["epsilon"] for v in series.values() for r in v}))
            ref = minimax_order(fig.metric, n=fig.n, d=fig.d, s=s, eps=eps_all)
            (line,) = ax.plot(eps_all, ref, color="black", linestyle=":", linewidth=1.2)
            handles.setdefault(_reference_label(fig.metric), line)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_title(f"s = {s}", fontsize=10)
        ax.set_xlabel("ε")
        ax.grid(True, which="both", alpha=0.25)
    axes[0][0].set_ylabel(f"{fig.metric} (geometric mean)")
    figure.suptitle(fig.caption, fontsize=10)
    figure.legend(
        list(handles.values()),
        list(handles),
        loc="lower center",
        ncol=min(len(handles), 5),
        fontsize=8,
        frameon=False,
    )
    rows_of_legend = math.ceil(len(handles) / 5)
    figure.tight_layout(rect=(0, 0.07 * rows_of_legend + 0.02, 1, 0.98))
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


def plot_all(rows: list[dict[str, Any]], out: Path) -> list[Path]:
    """Every figure of :func:`figures_for` the configurations of ``rows``, into ``out``."""
    configs = sorted({(r["n"], r["d"]) for r in rows}, key=lambda c: (-c[0], c[1]))
    paths = []
    for fig in figures_for(configs):
        path = plot_figure(rows, fig, out / fig.filename)
        if path is not None:
            paths.append(path)
    return paths
