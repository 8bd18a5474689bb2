"""Exact coverage of the mean intervals, from the exact joint law of a dimension's two counts.

A dimension's mean estimate is ``sum_u / (n D_mean)`` with ``sum_u = A - B``, ``A`` the
reports whose output hit the dimension's ``+`` bucket and ``B`` its ``-`` bucket; the
published interval ``mean +- z mean_se`` plugs in the frequency estimated from
``sum_v = A + B``. Given the data, with ``k+`` reports holding ``x_j = +1``, ``k-`` holding
``-1`` and the others 0, ``(A, B)`` is a sum of independent per-report pairs ``(a, b)``
(ideal hashing, the estimators' model, :mod:`edge.theory`):

* CoCo: ``a`` and ``b`` exclusive, ``(1, 0)`` with probability ``P_t`` and ``(0, 1)`` with
  ``P_o`` for ``x_j = +1`` (swapped for ``-1``), each with ``P_f = c0/2`` for ``x_j = 0``;
* Collision: ``a`` and ``b`` independent Bernoullis, ``(p, q)`` for ``+1``, ``(q, p)`` for
  ``-1``, ``(q, q)`` for 0, with ``p = D + c0/2`` and ``q = c0/2``.

The coverage at the true mean ``(k+ - k-)/n`` is a finite sum over ``(A, B)`` of the law
times whether the interval the aggregator computes (:func:`estimate_rows`, the production
code) holds it. Averaged over how the data are drawn (each report holds the dimension with
probability ``share``, its entry ``+1`` with probability ``(1 + theta)/2``), as in the Monte
Carlo tests. Beside it, for the diagnosis, the same interval with the *true* frequency's
variance (``oracle``): what is left when the plug-in is not the cause.

``python -m tests.aggregator.exact_mean_coverage`` prints the table of docs/estimates.md.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray
from scipy import signal, stats

from aggregator.estimation.estimators import estimate_rows
from aggregator.estimation.intervals import z_score
from edge import MechanismSpec

TAIL = 1e-13
"""Upper tail mass of each count left out of the law."""
WEIGHT_FLOOR = 1e-9
"""Data draws ``(k+, k-)`` less likely than this are left out of the average."""


def _pair_law(spec: MechanismSpec, m: int, sign: int) -> NDArray[np.float64]:
    """Law of ``(A, B)`` summed over ``m`` reports whose ``x_j`` is ``sign``: ``[A, B]``."""
    if m == 0:
        return np.ones((1, 1))
    mo = spec.moments
    if spec.mechanism == "coco":
        pair = mo.d_freq + mo.c0
        p_t, p_o, p_f = (pair + mo.d_mean) / 2, (pair - mo.d_mean) / 2, mo.c0 / 2
        pa, pb = {1: (p_t, p_o), -1: (p_o, p_t), 0: (p_f, p_f)}[sign]
        top = min(m, int(stats.binom.isf(TAIL, m, pa + pb)) + 1)
        a = np.arange(top + 1)
        law = np.zeros((top + 1, top + 1))
        for i in range(top + 1):  # A ~ Bin(m, pa), B | A ~ Bin(m - A, pb / (1 - pa))
            law[i] = stats.binom.pmf(i, m, pa) * stats.binom.pmf(a, m - i, pb / (1 - pa))
        return law
    p, q = mo.d_mean + mo.c0 / 2, mo.c0 / 2
    pa, pb = {1: (p, q), -1: (q, p), 0: (q, q)}[sign]
    ta = min(m, int(stats.binom.isf(TAIL, m, pa)) + 1)
    tb = min(m, int(stats.binom.isf(TAIL, m, pb)) + 1)
    return np.outer(
        stats.binom.pmf(np.arange(ta + 1), m, pa), stats.binom.pmf(np.arange(tb + 1), m, pb)
    )


def count_law(spec: MechanismSpec, n: int, plus: int, minus: int) -> NDArray[np.float64]:
    """Law of ``(A, B)`` when ``plus`` reports hold ``+1`` and ``minus`` hold ``-1``."""
    law = _pair_law(spec, plus, 1)
    for m, sign in ((minus, -1), (n - plus - minus, 0)):
        law = signal.convolve2d(law, _pair_law(spec, m, sign))
    clipped: NDArray[np.float64] = np.clip(law, 0.0, None)
    return clipped


def coverage(
    spec: MechanismSpec, n: int, plus: int, minus: int, *, confidence: float = 0.95
) -> tuple[float, float, float]:
    """``(published, oracle, halfwidth)``: the exact coverage of the published mean
    interval and of ``mean +- z SE(true frequency)`` at this data, and the published
    interval's expected half-width."""
    law = count_law(spec, n, plus, minus)
    a, b = np.nonzero(law > 0)
    w = law[a, b]
    u = (a - b).astype(np.int64)[:, None]
    v = (a + b).astype(np.int64)[:, None]
    est = estimate_rows(spec, np.full(a.size, n, dtype=np.int64), u, v, confidence=confidence)
    lo, hi, mean = est["mean_lo"][:, 0], est["mean_hi"][:, 0], est["mean"][:, 0]
    truth = (plus - minus) / n
    se = np.sqrt(spec.moments.mean_variance((plus + minus) / n) / n)
    oracle = np.abs(mean - truth) <= z_score(confidence) * se
    return (
        float(w[(lo <= truth) & (truth <= hi)].sum()),
        float(w[oracle].sum()),
        float((w * (hi - lo)).sum() / 2),
    )


@dataclass(frozen=True)
class MeanCoverage:
    """Exact coverage averaged over the data of one setting."""

    mechanism: str
    n: int
    theta: float
    published: float
    oracle: float
    halfwidth: float


def average_coverage(
    spec: MechanismSpec, n: int, share: float, theta: float, *, confidence: float = 0.95
) -> MeanCoverage:
    """Coverage when each report holds the dimension with probability ``share``, with
    ``x_j = +1`` with probability ``(1 + theta)/2`` and ``-1`` otherwise (so the true
    ``(k+, k-, rest)`` is multinomial): the lattice's oscillation in the counts averages out."""
    probs = [share * (1 + theta) / 2, share * (1 - theta) / 2]
    probs.append(1.0 - sum(probs))
    top = int(n * share + 12 * np.sqrt(n * share) + 12)
    acc = np.zeros(3)
    total = 0.0
    for plus in range(min(n, top) + 1):
        for minus in range(min(n - plus, top) + 1):
            weight = float(stats.multinomial.pmf([plus, minus, n - plus - minus], n, probs))
            if weight < WEIGHT_FLOOR:
                continue
            acc += weight * np.array(coverage(spec, n, plus, minus, confidence=confidence))
            total += weight
    published, oracle, half = (acc / total).tolist()
    return MeanCoverage(spec.mechanism, n, theta, published, oracle, half)


EPSILON = 8.0
SHAPE = (16, 2)
"""``(d, s)`` of the documented setting."""
SHARE = 0.04
"""The dimension is held by 4% of the reports."""
GRID_N = (100, 300, 1000)
GRID_THETA = (0.0, 0.5, 1.0)


def grid(*, confidence: float = 0.95) -> list[MeanCoverage]:
    """The documented table's rows: both mechanisms at epsilon 8, ``(d, s) = (16, 2)``."""
    rows = []
    for mechanism in ("coco", "collision"):
        spec = MechanismSpec(mechanism=mechanism, d=SHAPE[0], s=SHAPE[1], epsilon=EPSILON)
        for n in GRID_N:
            for theta in GRID_THETA:
                rows.append(average_coverage(spec, n, SHARE, theta, confidence=confidence))
    return rows


def table(rows: list[MeanCoverage]) -> str:
    """Markdown table of the rows."""
    lines = [
        "| mechanism | n | holders' mean θ | coverage "
        "| with the true frequency's SE | half-width |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        lines.append(
            f"| {r.mechanism} | {r.n} | {r.theta:g} | {r.published:.3f} | {r.oracle:.3f} "
            f"| {r.halfwidth:.4f} |"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    print(table(grid()))
