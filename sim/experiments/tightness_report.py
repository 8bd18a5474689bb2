"""``coco experiment tightness``'s files: the audit of every setting
(:mod:`sim.experiments.tightness_audit`) as a CSV, two figures and a markdown summary
(docs/results.md)."""

from __future__ import annotations

import csv
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from sim.experiments.tightness_audit import (
    LEVEL,
    SETTINGS,
    AuditPoint,
    EpsilonComparison,
    Setting,
    audit_setting,
)

__all__ = [
    "CSV_NAME",
    "EXCESS_PNG_NAME",
    "PNG_NAME",
    "SUMMARY_NAME",
    "run_tightness",
    "write_csv",
    "write_excess_plot",
    "write_plot",
    "write_summary",
]

CSV_NAME = "tightness.csv"
PNG_NAME = "tightness.png"
EXCESS_PNG_NAME = "tightness_excess.png"
SUMMARY_NAME = "tightness_summary.md"
_REPORTED_DELTA = 1e-9
"""The summary's relative excess skips points where the paper's delta is below this (near
eps0 the pair's divergence vanishes much faster than the view's, and the ratio is huge)."""
_EXCESS_RESOLUTION = 1e-8
"""Relative excesses below this are within the rounding of the exact sums (not plotted)."""


def write_csv(points: Sequence[AuditPoint], path: Path) -> Path:
    rows = [p.row() for p in points]
    with path.open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(rows[0]))
        writer.writeheader()
        for row in rows:
            writer.writerow({k: repr(v) if isinstance(v, float) else v for k, v in row.items()})
    return path


def _pyplot() -> Any:
    import matplotlib  # noqa: PLC0415 (the backend must be chosen before pyplot is imported)

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    return plt


def _by_setting(points: Sequence[AuditPoint]) -> list[list[AuditPoint]]:
    groups: dict[str, list[AuditPoint]] = {}
    for p in points:
        groups.setdefault(p.setting.label, []).append(p)
    return list(groups.values())


def write_plot(points: Sequence[AuditPoint], path: Path) -> Path:
    """Per setting: certified delta, the paper's delta, exact and simulated divergences."""
    plt = _pyplot()
    groups = _by_setting(points)
    cols = 2
    rows = (len(groups) + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(11, 4 * rows), squeeze=False)
    for ax, group in zip(axes.flat, groups, strict=False):
        eps = np.array([p.epsilon for p in group])
        ax.plot(
            eps,
            [p.certified for p in group],
            "-",
            color="tab:blue",
            lw=2,
            label="certified delta (generic stronger clone)",
        )
        ax.plot(
            eps,
            [p.blanket for p in group],
            "-",
            color="tab:purple",
            lw=2,
            label="certified delta (privacy blanket, reported)",
        )
        ax.plot(
            eps,
            [p.mechanism for p in group],
            "--",
            color="tab:red",
            label="paper's delta (mechanism-specific, INVALID)",
        )
        ax.plot(
            eps,
            [p.view_exact for p in group],
            "k.",
            ms=9,
            label="exact divergence of the shuffled view",
        )
        est = np.array([p.view_mc.estimate for p in group])
        lo = np.array([p.view_mc.lower for p in group])
        hi = np.array([p.view_mc.upper for p in group])
        shown = est > 0
        ax.errorbar(
            eps[shown] * 1.01,
            est[shown],
            yerr=[np.maximum(est - np.maximum(lo, est * 1e-3), 0)[shown], (hi - est)[shown]],
            fmt="o",
            mfc="none",
            color="tab:orange",
            ms=5,
            capsize=2,
            label=f"simulated view ({group[0].view_mc.runs:.0e} runs, {LEVEL:.1%} CI)",
        )
        ax.set_yscale("log")
        ax.set_xlabel("eps")
        ax.set_ylabel("hockey-stick divergence / delta")
        ax.set_title(group[0].setting.label, fontsize=10)
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[len(groups) :]:
        ax.axis("off")
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=2, fontsize=9)
    fig.tight_layout(rect=(0, 0.07, 1, 1))
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def write_excess_plot(points: Sequence[AuditPoint], path: Path) -> Path:
    """Relative excess of the shuffled view's divergence over the paper's delta (the pair's,
    both exact), where the latter is at least ``_REPORTED_DELTA`` and the excess is above
    the sums' rounding (``_EXCESS_RESOLUTION``)."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.2))
    for group in _by_setting(points):
        sel = [
            p
            for p in group
            if p.pair_exact >= _REPORTED_DELTA
            and p.view_exact > p.pair_exact * (1.0 + _EXCESS_RESOLUTION)
        ]
        if not sel:
            continue
        ax.plot(
            [p.epsilon / p.setting.epsilon0 for p in sel],
            [(p.view_exact - p.pair_exact) / p.pair_exact for p in sel],
            "o-",
            ms=4,
            label=group[0].setting.label,
        )
    ax.set_yscale("log")
    ax.set_xlabel("eps / eps0")
    ax.set_ylabel("(view divergence - paper's delta) / paper's delta (exact)")
    ax.set_title("The lower-bound construction exceeds the paper's upper bound")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def write_summary(
    points: Sequence[AuditPoint], comparisons: Sequence[EpsilonComparison], path: Path
) -> Path:
    lines = [
        "| setting | eps points | certified delta >= exact view divergence (generic, blanket) | "
        "max relative excess of the view over the paper's delta (where that is >= 1e-9) | "
        f"eps where the simulated view's {LEVEL:.1%} lower bound exceeds the paper's delta | "
        f"exact view divergence inside the simulated {LEVEL:.1%} interval | runs per dataset |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for group in _by_setting(points):
        holds = sum(p.certified >= p.view_exact for p in group)
        holds_b = sum(p.blanket >= p.view_exact for p in group)
        excess = max(
            (
                (p.view_exact - p.pair_exact) / p.pair_exact
                for p in group
                if p.pair_exact >= _REPORTED_DELTA
            ),
            default=0.0,
        )
        refuted = [p.epsilon for p in group if p.view_mc.lower > p.mechanism]
        covered = sum(p.view_mc.lower <= p.view_exact <= p.view_mc.upper for p in group)
        refuted_txt = ", ".join(f"{e:.3g}" for e in refuted) if refuted else "none"
        lines.append(
            f"| {group[0].setting.label} | {len(group)} | {holds}, {holds_b} of {len(group)} "
            f"| {100 * excess:.3g}% | {refuted_txt} | {covered} of {len(group)} "
            f"| {group[0].view_mc.runs:.0e} |"
        )
    lines += [
        "",
        "| setting | delta | eps_c certified (generic) | eps_c certified (blanket, reported) "
        "| eps_c paper (invalid) | eps of the construction's shuffled view (lower bound) "
        "| blanket above the lower bound by | view above paper by |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for c in comparisons:
        rel = (c.view - c.mechanism) / c.mechanism if c.mechanism > 0 else 0.0
        gap = (c.blanket - c.view) / c.view if c.view > 0 else 0.0
        lines.append(
            f"| {c.setting.label} | {c.delta:.3g} | {c.generic:.6g} | {c.blanket:.6g} "
            f"| {c.mechanism:.6g} | {c.view:.6g} | {100 * gap:.3g}% | {100 * rel:.3g}% |"
        )
    path.write_text("\n".join(lines) + "\n")
    return path


def run_tightness(
    out: Path,
    *,
    full: bool,
    seed: int,
    progress: bool,
    settings: Sequence[Setting] = SETTINGS,
    points: int | None = None,
    runs: int | None = None,
) -> list[Path]:
    """Audit every setting and write CSV, the two PNGs and the markdown summary to ``out``.

    Quick: 8 values of eps and 2e5 simulated runs per dataset; full: 16 and 2e6. ``points``
    and ``runs`` override them (tests). Results depend on ``seed`` only.
    """
    out.mkdir(parents=True, exist_ok=True)
    default_points, default_runs = (16, 2_000_000) if full else (8, 200_000)
    points_per_setting = default_points if points is None else points
    runs = default_runs if runs is None else runs
    rngs = [np.random.default_rng(s) for s in np.random.SeedSequence(seed).spawn(len(settings))]
    audited: list[AuditPoint] = []
    comparisons: list[EpsilonComparison] = []
    for setting, rng in zip(settings, rngs, strict=True):
        if progress:
            print(f"tightness: {setting.label} ({runs} runs per dataset)", file=sys.stderr)
        got, comparison = audit_setting(setting, points=points_per_setting, runs=runs, rng=rng)
        audited.extend(got)
        comparisons.append(comparison)
    return [
        write_csv(audited, out / CSV_NAME),
        write_plot(audited, out / PNG_NAME),
        write_excess_plot(audited, out / EXCESS_PNG_NAME),
        write_summary(audited, comparisons, out / SUMMARY_NAME),
    ]
