"""Exact coverage of the frequency intervals, from the exact law of the bucket count.

A dimension's frequency estimate is an affine map of its bucket count ``V = sum_v``. Given the
reports' data, with ``k`` of the ``n`` reports holding the dimension, ``V`` is a sum of
independent Bernoulli indicators (ideal hashing, the model the estimators assume and the
Monte Carlo tests check for XXH32):

* CoCo: one per report, ``v = [z in the dimension's pair]``: ``Bin(k, c0 + D) + Bin(n - k, c0)``;
* Collision: two per report, ``a`` and ``b``: ``Bin(k, c0/2 + D) + Bin(2n - k, c0/2)``;

with ``c0 = moments.c0`` and ``D = moments.d_freq``. The coverage of an interval at the true
frequency ``k/n`` is then a finite sum over ``V`` of its law times whether the interval the
aggregator computes from ``V`` holds ``k/n``; the intervals are those of
:func:`aggregator.estimation.intervals.frequency_intervals` itself. No simulation: these numbers
are exact up to the float rounding of the binomial pmfs (tail mass below ``TAIL`` is dropped).

``python -m tests.aggregator.exact_coverage`` prints the table of docs/estimates.md.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray
from scipy import stats

from aggregator.estimation.intervals import frequency_intervals, normal_count_threshold, z_score
from edge import MechanismSpec
from edge.theory import ReportMoments

TAIL = 1e-13
"""Upper tail mass of each binomial left out of the count's law."""


def count_pmf(spec: MechanismSpec, n: int, k: int) -> NDArray[np.float64]:
    """The law of the bucket count ``V`` (index = value) when ``k`` of ``n`` reports hold
    the dimension (module docs)."""
    mo = spec.moments
    if spec.mechanism == "coco":
        (m1, p1), (m0, p0) = (k, mo.c0 + mo.d_freq), (n - k, mo.c0)
    else:
        (m1, p1), (m0, p0) = (k, mo.c0 / 2 + mo.d_freq), (2 * n - k, mo.c0 / 2)
    parts = []
    for m, p in ((m1, p1), (m0, p0)):
        top = int(stats.binom.isf(TAIL, m, p)) + 1 if m > 0 else 0
        parts.append(stats.binom.pmf(np.arange(top + 1), m, p))
    pmf: NDArray[np.float64] = np.convolve(parts[0], parts[1])
    return pmf


def count_variance(moments: ReportMoments, n: int, k: int) -> float:
    """``Var V`` at the true frequency ``k/n``."""
    f = k / n
    return n * (f * moments.var_v_nonzero + (1 - f) * moments.var_v_zero)


def normal_intervals(
    count: NDArray[np.int64], n: int, moments: ReportMoments, *, confidence: float
) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    """``freq +- z freq_se`` for every count (the normal interval everywhere, as before the
    score interval)."""
    freq = (count / n - moments.c0) / moments.d_freq
    se = np.sqrt(moments.freq_variance(np.clip(freq, 0.0, 1.0)) / n)
    z = z_score(confidence)
    return freq - z * se, freq + z * se


@dataclass(frozen=True)
class Coverage:
    """Exact coverage at one true count ``k`` of ``n``."""

    k: int
    count_variance: float
    published: float
    """Of the intervals the aggregator publishes (normal or score by the threshold)."""
    normal: float
    """Of the normal interval everywhere."""
    score: float
    """Of the score interval everywhere."""


def coverage(spec: MechanismSpec, n: int, k: int, *, confidence: float = 0.95) -> Coverage:
    """Exact coverage of the three intervals when ``k`` of ``n`` reports hold the dimension."""
    pmf = count_pmf(spec, n, k)
    v = np.arange(pmf.size, dtype=np.int64)
    mo, f = spec.moments, k / n
    lo, hi, _ = frequency_intervals(v, n, mo, confidence=confidence)
    n_lo, n_hi = normal_intervals(v, n, mo, confidence=confidence)
    s_lo, s_hi = _score_everywhere(v, n, mo, confidence=confidence)
    return Coverage(
        k=k,
        count_variance=count_variance(mo, n, k),
        published=float(pmf[(lo <= f) & (f <= hi)].sum()),
        normal=float(pmf[(n_lo <= f) & (f <= n_hi)].sum()),
        score=float(pmf[(s_lo <= f) & (f <= s_hi)].sum()),
    )


def _score_everywhere(
    count: NDArray[np.int64], n: int, moments: ReportMoments, *, confidence: float
) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    """The score interval for every count, whatever its variance: the roots of
    ``(y - D f)^2 = z^2 (B + f (A - B)) / n`` (written out here, apart from the production
    code)."""
    z2 = z_score(confidence) ** 2
    y = count / n - moments.c0
    d, a, b = moments.d_freq, moments.var_v_nonzero, moments.var_v_zero
    p2, p1, p0 = d * d, -(2 * y * d + z2 * (a - b) / n), y * y - z2 * b / n
    disc = np.sqrt(p1 * p1 - 4 * p2 * p0)
    return (-p1 - disc) / (2 * p2), (-p1 + disc) / (2 * p2)


def average_coverage(
    spec: MechanismSpec, n: int, holders: float, *, confidence: float = 0.95
) -> dict[str, float]:
    """Coverage when each report holds the dimension with probability ``holders / n``
    independently (the true count ``k`` is ``Bin(n, holders/n)``), as in the Monte Carlo
    tests: the lattice's oscillation in ``k`` averages out."""
    ks = np.arange(n + 1)
    weight = stats.binom.pmf(ks, n, holders / n)
    keep = weight > 1e-12
    out = {"published": 0.0, "normal": 0.0, "score": 0.0}
    for k, w in zip(ks[keep].tolist(), weight[keep].tolist(), strict=True):
        c = coverage(spec, n, k, confidence=confidence)
        for name in out:
            out[name] += w * getattr(c, name)
    total = float(weight[keep].sum())
    return {name: value / total for name, value in out.items()}


GRID_SPECS = tuple(
    MechanismSpec(mechanism=mechanism, d=d, s=s, epsilon=epsilon)
    for mechanism in ("coco", "collision")
    for epsilon in (0.5, 2.0, 8.0)
    for d, s in ((8, 2), (64, 4), (27, 1))
)
"""The settings of the docs' table: both mechanisms, three budgets, three shapes."""
GRID_N = (300, 1000, 3000)
BINS = (0.0, 2.0, 5.0, 10.0, 20.0, 40.0, 75.0, 150.0, 300.0, float("inf"))
"""Bins of the count variance ``Var V`` (75: about :func:`normal_count_threshold` at 95%)."""


def grid(*, confidence: float = 0.95) -> list[Coverage]:
    """Exact coverage at about 30 true counts per (spec, n) of the grid, spread evenly in
    ``log k`` from 1 to ``n / 2``."""
    rows: list[Coverage] = []
    for spec in GRID_SPECS:
        for n in GRID_N:
            ks = np.unique(np.geomspace(1, n // 2, 30).astype(np.int64))
            rows.extend(coverage(spec, n, int(k), confidence=confidence) for k in ks)
    return rows


def table(rows: list[Coverage]) -> str:
    """Markdown table by bins of the count variance: min and mean of each interval's exact
    coverage."""
    lines = [
        "| `Var V` | cases | normal: min | mean | score: min | mean | published: min | mean |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for lo, hi in itertools.pairwise(BINS):
        inside = [r for r in rows if lo <= r.count_variance < hi]
        if not inside:
            continue
        cells = [f"{lo:g}-{hi:g}" if hi < float("inf") else f">= {lo:g}", str(len(inside))]
        for name in ("normal", "score", "published"):
            values = np.array([getattr(r, name) for r in inside])
            cells += [f"{values.min():.3f}", f"{values.mean():.3f}"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


if __name__ == "__main__":
    print(f"threshold at 95%: {normal_count_threshold(0.95):.1f}")
    print(table(grid()))
