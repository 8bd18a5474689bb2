"""Amplification comparison (paper, Figure "shuffle"): eps0 / epsilon_c against eps0.

For ``n`` in {1e4, 1e5}, ``s`` in {4, 64} and ``eps0`` in [0.1, 5], Collision with the
figure's ``t* = floor(s e^eps0 + 2s - 1)`` (caption of Figure "shuffle"), and
``delta = n^-1.1`` (the paper fixes ``delta = O(1/n)`` without a value; ``n^-1.1`` is the
delta of the reference table ``docs/reference/amplification.tsv`` for these ``n``):

* ``eps_c_blanket``: the privacy-blanket bound for Collision
  (:func:`aggregator.accountant.blanket_epsilon`): **certified**, mechanism-specific, what the
  product reports as ``epsilon_central``;
* ``eps_c_generic``: the stronger-clone bound with the generic clone probability
  ``1/(e^eps0 + 1)`` (:func:`aggregator.accountant.amplify`): **certified**, reported as
  ``epsilon_central_generic``. It depends on neither ``s`` nor ``t``;
* ``eps_c_mechanism`` (column ``eps_c_mechanism_uncertified``): the paper's Theorem
  "Amplification Upper Bounds" with the mechanism-specific clone probability
  ``s / (s e^eps0 + t - s)`` (ERRATA item 4). **Invalid, not an upper bound**: the
  stronger-clone lemma fails below the generic clone probability (docs/privacy-model.md;
  :mod:`sim.experiments.tightness` shows the paper's own lower-bound construction exceeding
  it). It depends on ``s`` and ``t`` only through that probability, not on ``d``;
* the closed forms EFMRTT19 and FMT21 where their regimes allow (``None`` -> empty cell).

Outputs: ``amplification.csv`` (every value), ``amplification.png`` (the figure:
``log2(eps0 / epsilon_c)``, one panel per ``(n, s)``) and ``amplification_summary.md`` (the
savings table quoted by docs/results.md).

The paper's figure also shows Balle et al.'s generic privacy-blanket and clone-reduction
curves; they are not implemented in this code base and are left out.
"""

from __future__ import annotations

import csv
import math
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from aggregator.accountant import BlanketPair, amplify, blanket_epsilon, epsilon_central
from edge.theory import paper_t

__all__ = [
    "AmplificationRow",
    "compute_rows",
    "eps0_grid",
    "run_amplification",
    "write_csv",
    "write_plot",
    "write_summary",
]

NS: tuple[int, ...] = (10_000, 100_000)
SPARSITIES: tuple[int, ...] = (4, 64)
DELTA_EXPONENT = 1.1
"""``delta = n^-DELTA_EXPONENT``."""

CSV_NAME = "amplification.csv"
PNG_NAME = "amplification.png"
SUMMARY_NAME = "amplification_summary.md"

COLUMNS: tuple[str, ...] = (
    "n",
    "s",
    "t",
    "delta",
    "epsilon0",
    "clone_probability_generic",
    "clone_probability_mechanism",
    "eps_c_blanket",
    "eps_c_generic",
    "eps_c_mechanism_uncertified",
    "eps_c_efmrtt19",
    "eps_c_fmt21",
    "ratio_generic",
    "ratio_mechanism_uncertified",
    "saving_mechanism_vs_generic",
    "saving_blanket_vs_generic",
)


def eps0_grid(*, full: bool) -> list[float]:
    """``0.1, 0.2, ..., 5.0`` (full, the reference table's grid) or ``0.1, 0.5, 1, ..., 5``."""
    if full:
        return [round(0.1 * k, 1) for k in range(1, 51)]
    return [0.1, *(round(0.5 * k, 1) for k in range(1, 11))]


def delta_for_n(n: int) -> float:
    """The figure's delta for ``n`` reports."""
    return float(n ** (-DELTA_EXPONENT))


@dataclass(frozen=True, kw_only=True, slots=True)
class AmplificationRow:
    """One point of the figure. ``saving`` is ``1 - eps_c_mechanism / eps_c_generic`` (the
    paper's invalid claim), ``saving_blanket`` the certified
    ``1 - eps_c_blanket / eps_c_generic``."""

    n: int
    s: int
    t: int
    delta: float
    epsilon0: float
    clone_generic: float
    clone_mechanism: float
    eps_c_blanket: float
    eps_c_generic: float
    eps_c_mechanism: float
    efmrtt19: float | None
    fmt21: float | None

    @property
    def saving(self) -> float:
        return 1.0 - self.eps_c_mechanism / self.eps_c_generic

    @property
    def saving_blanket(self) -> float:
        return 1.0 - self.eps_c_blanket / self.eps_c_generic

    def values(self) -> list[int | float | None]:
        return [
            self.n,
            self.s,
            self.t,
            self.delta,
            self.epsilon0,
            self.clone_generic,
            self.clone_mechanism,
            self.eps_c_blanket,
            self.eps_c_generic,
            self.eps_c_mechanism,
            self.efmrtt19,
            self.fmt21,
            self.epsilon0 / self.eps_c_generic,
            self.epsilon0 / self.eps_c_mechanism,
            self.saving,
            self.saving_blanket,
        ]


def compute_row(*, n: int, s: int, epsilon0: float, delta: float) -> AmplificationRow:
    """All bounds for one ``(n, s, eps0)`` with the figure's ``t*``."""
    t = paper_t("collision", s=s, exp_eps=math.exp(epsilon0))
    alpha = s / (s * math.exp(epsilon0) + t - s)  # ERRATA item 4; <= 1/(e^eps0+1) as t* >= 2s
    record = amplify(n=n, delta=delta, epsilon0=epsilon0)
    # The paper's pair, kept for the comparison only: NOT an upper bound (docs/privacy-model.md).
    invalid = epsilon_central(n=n, delta=delta, epsilon0=epsilon0, clone_probability=alpha)
    pair = BlanketPair(n=n, exp_epsilon0=math.exp(epsilon0), s=s, t=t)
    return AmplificationRow(
        n=n,
        s=s,
        t=t,
        delta=delta,
        epsilon0=epsilon0,
        clone_generic=record.clone_probability,
        clone_mechanism=alpha,
        eps_c_blanket=blanket_epsilon(pair, delta=delta),
        eps_c_generic=record.epsilon_central_generic,
        eps_c_mechanism=invalid,
        efmrtt19=record.efmrtt19,
        fmt21=record.fmt21,
    )


def compute_rows(
    *,
    ns: Sequence[int] = NS,
    sparsities: Sequence[int] = SPARSITIES,
    eps0s: Sequence[float],
    progress: Callable[[str], None] | None = None,
) -> list[AmplificationRow]:
    """Every ``(n, s, eps0)`` point, in that order."""
    rows: list[AmplificationRow] = []
    for n in ns:
        delta = delta_for_n(n)
        for s in sparsities:
            if progress is not None:
                progress(f"amplification: n={n} s={s} ({len(eps0s)} values of eps0)")
            rows.extend(compute_row(n=n, s=s, epsilon0=e0, delta=delta) for e0 in eps0s)
    return rows


def _cell(value: int | float | None) -> str:
    if value is None:
        return ""
    if isinstance(value, int):
        return str(value)
    return repr(float(value))


def write_csv(rows: Sequence[AmplificationRow], path: Path) -> Path:
    with path.open("w", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow(COLUMNS)
        for row in rows:
            writer.writerow([_cell(v) for v in row.values()])
    return path


def write_plot(rows: Sequence[AmplificationRow], path: Path) -> Path:
    """The paper's Figure "shuffle": ``log2(eps0 / epsilon_c)`` per ``(n, s)`` panel."""
    import matplotlib  # noqa: PLC0415 (the backend must be chosen before pyplot is imported)

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    ns = sorted({r.n for r in rows})
    ss = sorted({r.s for r in rows})
    fig, axes = plt.subplots(
        len(ns), len(ss), figsize=(5.2 * len(ss), 3.8 * len(ns)), squeeze=False, sharex=True
    )
    for i, n in enumerate(ns):
        for j, s in enumerate(ss):
            ax = axes[i][j]
            sel = sorted((r for r in rows if r.n == n and r.s == s), key=lambda r: r.epsilon0)
            e0 = np.array([r.epsilon0 for r in sel])

            def log_ratio(values: list[float | None], eps0: np.ndarray = e0) -> np.ndarray:
                v = np.array([np.nan if x is None else x for x in values], dtype=np.float64)
                return np.log2(eps0 / v)

            ax.plot(
                e0,
                log_ratio([r.eps_c_mechanism for r in sel]),
                "--",
                color="tab:red",
                label="mechanism-specific stronger clone (paper; INVALID)",
            )
            ax.plot(
                e0,
                log_ratio([r.eps_c_blanket for r in sel]),
                "-",
                color="tab:purple",
                lw=2,
                label="privacy blanket, mechanism-specific (certified; reported)",
            )
            ax.plot(
                e0,
                log_ratio([r.eps_c_generic for r in sel]),
                "-",
                color="tab:blue",
                lw=2,
                label="generic stronger clone (certified; epsilon_central_generic)",
            )
            ax.plot(e0, log_ratio([r.fmt21 for r in sel]), ":", color="tab:green", label="FMT21")
            ax.plot(
                e0,
                log_ratio([r.efmrtt19 for r in sel]),
                "o-",
                ms=3,
                color="tab:gray",
                label="EFMRTT19",
            )
            ax.set_title(f"n = {n:.0e}, s = {s}, t = t*, delta = n^-{DELTA_EXPONENT}")
            ax.set_ylabel("log2(eps0 / eps_c)")
            ax.grid(alpha=0.3)
            if i == len(ns) - 1:
                ax.set_xlabel("local budget eps0")
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=2, fontsize=9)
    fig.tight_layout(rect=(0, 0.08, 1, 1))
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def write_summary(rows: Sequence[AmplificationRow], path: Path) -> Path:
    """Markdown table of the mechanism-specific formula's saving against the certified bound."""
    lines = [
        "| n | s | delta | eps0 range | saving of the (invalid) formula: min | median "
        "| max | certified blanket saving: min | median | max "
        "| eps_c generic at eps0 = 1 | eps_c blanket at eps0 = 1 "
        "| eps_c mechanism (invalid) at eps0 = 1 |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for n in sorted({r.n for r in rows}):
        for s in sorted({r.s for r in rows}):
            sel = [r for r in rows if r.n == n and r.s == s]
            if not sel:
                continue
            sav = np.array([r.saving for r in sel])
            bsav = np.array([r.saving_blanket for r in sel])
            at1 = [r for r in sel if r.epsilon0 == 1.0]
            g1 = f"{at1[0].eps_c_generic:.4g}" if at1 else ""
            m1 = f"{at1[0].eps_c_mechanism:.4g}" if at1 else ""
            b1 = f"{at1[0].eps_c_blanket:.4g}" if at1 else ""
            lo, hi = min(r.epsilon0 for r in sel), max(r.epsilon0 for r in sel)
            lines.append(
                f"| {n:.0e} | {s} | {sel[0].delta:.3g} | {lo:g}-{hi:g} ({len(sel)} points) "
                f"| {100 * sav.min():.1f}% | {100 * float(np.median(sav)):.1f}% "
                f"| {100 * sav.max():.1f}% | {100 * bsav.min():.1f}% "
                f"| {100 * float(np.median(bsav)):.1f}% | {100 * bsav.max():.1f}% "
                f"| {g1} | {b1} | {m1} |"
            )
    best_closed = [
        (r, min(x for x in (r.fmt21, r.efmrtt19) if x is not None))
        for r in rows
        if r.fmt21 is not None or r.efmrtt19 is not None
    ]
    lines.append("")
    if best_closed:
        gain = np.array([1.0 - r.eps_c_generic / c for r, c in best_closed])
        lines.append(
            f"The certified generic bound is below the best applicable closed form at "
            f"{int((gain > 0).sum())} of {len(best_closed)} points where one applies "
            f"(its eps_c is {100 * gain.min():.0f}%-{100 * gain.max():.0f}% smaller)."
        )
    path.write_text("\n".join(lines) + "\n")
    return path


def _stderr(message: str) -> None:
    print(message, file=sys.stderr)


def run_amplification(out: Path, *, full: bool, progress: bool) -> list[Path]:
    """Compute the comparison and write the CSV, the PNG and the markdown summary to ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    report = _stderr if progress else None
    rows = compute_rows(eps0s=eps0_grid(full=full), progress=report)
    return [
        write_csv(rows, out / CSV_NAME),
        write_plot(rows, out / PNG_NAME),
        write_summary(rows, out / SUMMARY_NAME),
    ]
