"""The confidence intervals of the estimators, per dimension: the normal quantile, the score
interval of a frequency at small bucket counts, and Fieller's set for a conditional mean
(docs/estimates.md). Pure numpy; :mod:`aggregator.estimation.estimators` applies them."""

from __future__ import annotations

import math
from statistics import NormalDist

import numpy as np
from numpy.typing import ArrayLike, NDArray

from edge.theory import ReportMoments

F64 = NDArray[np.float64]

__all__ = ["fieller_interval", "frequency_intervals", "normal_count_threshold", "z_score"]


def z_score(confidence: float) -> float:
    """Two-sided normal quantile of ``confidence`` (1.95996... for 0.95)."""
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")
    return NormalDist().inv_cdf(0.5 + confidence / 2)


def normal_count_threshold(confidence: float) -> float:
    """Smallest estimated variance of a dimension's bucket count ``sum_v`` at which its
    frequency gets the normal interval ``freq +- z freq_se`` (below it: the score interval of
    :func:`frequency_intervals`). 74.9 at ``confidence = 0.95``.

    The frequency is an affine map of the count ``V = sum_v``, a sum of independent
    Bernoulli indicators (one per report for CoCo, two for Collision) whose variance
    ``sigma^2 = n (f A + (1 - f) B)`` is affine in the true frequency ``f``. The normal
    interval is ``|V - E V| <= z sigma(f_hat)``: its standard deviation moves with the
    estimate, by ``b = d sigma^2 / d E[V]`` (``1 - p1 - p0`` for CoCo, ``1 - p - q`` for
    Collision, in ``(-1, 1)``). The Edgeworth expansion of ``V`` (skewness ``g / sigma`` with
    ``g = kappa_3 / sigma^2`` in ``[-1, 1]``) gives its coverage as that of the score
    interval, which puts ``sigma(f)`` at the tested ``f``, plus

        phi(z) z^3 ((1 - z^2) b^2 / 4 + (z^2 - 3) b g / 6) / sigma^2,

    both up to the same terms in ``1/sigma`` (the lattice's oscillation, which averages out
    over the true count) and ``1/sigma^2`` (the count's own shape). Its size is at most
    ``C(z) / sigma^2``, ``C(z) = phi(z) z^3 (|z^2 - 1| / 4 + |z^2 - 3| / 6)`` (0.374 at
    ``z = 1.96``, a shortfall: the normal interval shrinks where the count came out low).
    The threshold keeps it within a tenth of the nominal miss rate ``alpha = 1 -
    confidence``: ``sigma^2 >= 10 C(z) / alpha`` (docs/estimates.md, "Frequencies at small
    counts").
    """
    z = z_score(confidence)
    phi = math.exp(-z * z / 2) / math.sqrt(2 * math.pi)
    c = phi * z**3 * (abs(z * z - 1) / 4 + abs(z * z - 3) / 6)
    return 10 * c / (1 - confidence)


def frequency_intervals(
    count: ArrayLike, n: int | NDArray[np.int64], moments: ReportMoments, *, confidence: float
) -> tuple[F64, F64, NDArray[np.bool_]]:
    """``(lo, hi, score)``: the frequency intervals of dimensions whose bucket counts
    ``sum_v`` are ``count`` after ``n`` reports; ``score[j]`` where the score interval was used.
    ``n`` may be an array that broadcasts against ``count`` (one count per row of rows).

    ``E[V] = n (c0 + D f)`` and ``Var V = n (B + f (A - B))`` with ``D = d_freq``,
    ``A = var_v_nonzero``, ``B = var_v_zero``. Where the estimated variance (at the
    estimate clipped to ``[0, 1]``) is at least :func:`normal_count_threshold`, the interval
    is ``f_hat +- z SE``, as for means. Below it, the score interval: the ``f`` that the
    z-test of ``V`` with the variance *at* ``f`` accepts, ``(y - D f)^2 <= z^2 (B + f (A -
    B)) / n`` with ``y = V/n - c0`` (Wilson's interval, moved through the estimator's affine
    map), a quadratic in ``f`` whose leading coefficient ``D^2`` is positive and which is
    negative at ``f_hat`` (the variance is positive for every count), so always an interval
    around ``f_hat``. Like the normal interval it is not clipped to ``[0, 1]``.
    """
    v = np.asarray(count, dtype=np.float64)
    z = z_score(confidence)
    d_freq, c0 = moments.d_freq, moments.c0
    ns = np.broadcast_to(np.asarray(n), v.shape)  # one n, or one per row (estimate_rows)
    a_var, b_var = moments.var_v_nonzero, moments.var_v_zero
    freq = (v / n - c0) / d_freq
    f_plug = np.clip(freq, 0.0, 1.0)
    count_var = n * (f_plug * a_var + (1.0 - f_plug) * b_var)
    score: NDArray[np.bool_] = count_var < normal_count_threshold(confidence)
    freq_se = np.sqrt(moments.freq_variance(f_plug) / n)  # as estimate() computes it
    lo: F64 = freq - z * freq_se
    hi: F64 = freq + z * freq_se
    if score.any():
        m = ns[score]
        y = v[score] / m - c0
        qa = d_freq * d_freq  # qa f^2 - 2 qb f + qc <= 0
        qb = y * d_freq + z * z * (a_var - b_var) / (2 * m)
        qc = y * y - z * z * b_var / m
        # qb^2 - qa qc > 0 (the variance at f_hat is positive); stable roots q/qa and qc/q
        root = np.sqrt(np.maximum(qb * qb - qa * qc, 0.0))
        q = qb + np.where(qb >= 0, root, -root)
        with np.errstate(divide="ignore", invalid="ignore"):
            other = np.where(q != 0, qc / q, q / qa)
        lo[score] = np.minimum(q / qa, other)
        hi[score] = np.maximum(q / qa, other)
    return lo, hi, score


def fieller_interval(
    mean: F64, freq: F64, *, var_mean: F64, var_freq: F64, cov_unit: F64, z: float
) -> tuple[F64, F64]:
    """Hull of Fieller's confidence set for ``theta = mean / freq`` within ``[-1, 1]``.

    At the true ``theta`` the raw estimates satisfy ``E[mean - theta freq] = 0``, with
    variance ``V(theta) = var_mean + theta^2 (var_freq - 2 cov_unit)`` (the covariance of the
    estimates is ``theta * cov_unit`` there, :meth:`ReportMoments.mean_freq_covariance`).
    The set ``{theta in [-1, 1]: (mean - theta freq)^2 <= z^2 V(theta)}`` inverts that
    test: a quadratic inequality ``A theta^2 - 2 B theta + C <= 0``. Its hull's ends are
    among ``-1``, ``1`` and the real roots in between; an empty set gives NaN.
    """
    a = freq**2 - z**2 * (var_freq - 2 * cov_unit)
    b = mean * freq
    c = mean**2 - z**2 * var_mean
    disc = np.maximum(b**2 - a * c, 0.0)
    real = b**2 - a * c >= 0
    with np.errstate(divide="ignore", invalid="ignore"):
        q = b + np.where(b >= 0, 1.0, -1.0) * np.sqrt(disc)  # stable roots q/a and c/q
        roots = np.stack([q / a, c / q])
    ends = np.array([-1.0, 1.0]).reshape((2,) + (1,) * np.ndim(mean)) * np.ones_like(mean)
    g = a * ends**2 - 2 * b * ends + c
    inside = real & np.isfinite(roots) & (np.abs(roots) <= 1.0)
    cand = np.concatenate([ends, roots])
    ok = np.concatenate([g <= 0, inside])
    lo: F64 = np.where(ok, cand, np.inf).min(axis=0)
    hi: F64 = np.where(ok, cand, -np.inf).max(axis=0)
    empty = ~ok.any(axis=0)
    lo[empty] = np.nan
    hi[empty] = np.nan
    return lo, hi
