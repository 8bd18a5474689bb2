"""The neutral count's cdf and pmf values chained along diagonals (aggregator.accountant.chains).

Against exact values (mpmath, 60 digits, the float ``q`` taken exactly): every chained cdf
and pmf value is within the special functions' budget plus the ``extra`` the chains report,
on chains that cross the mean, start and end in the tails and break where a link is not
allowed.
And ``epsilon_total`` with the chains is never below the value-by-value evaluation (one
Boost value per boundary, as before) beyond the composition's own rounding noise, and
within ``1e-6`` relative of it.
"""

from __future__ import annotations

import random

import mpmath
import numpy as np
import pytest
from numpy.typing import NDArray
from scipy import stats

from aggregator.accountant import blanket, composition
from aggregator.accountant.blanket import _SPECIAL_REL_ERR, blanket_pair_for_spec
from aggregator.accountant.chains import CAP, chained_lower_cdf, lower_cdf
from aggregator.accountant.composition import epsilon_total_counts
from edge.spec import MechanismSpec
from tests.aggregator.test_blanket_recurrences import direct_chained

FloatArray = NDArray[np.float64]
_COMPOSITION_NOISE = 1e-11
"""The composition is monotone in its curve points only to about 1e-12 relative: the last
bits of its inputs move its FFT rounding budget and where its cuts fall (each result
carries its own certified budget). The points themselves, where the ordering is exact, are
never below the value-by-value ones (test_blanket_recurrences.py)."""


def _exact_lower_cdf(x: int, m: int, q: float) -> mpmath.mpf:
    """``Pr[Bin(m, q) <= x] - [x >= m q]`` summed exactly (60 digits)."""
    with mpmath.workdps(60):
        qq = mpmath.mpf(q)
        terms = [mpmath.binomial(m, y) * qq**y * (1 - qq) ** (m - y) for y in range(m + 1)]
        if x < m * q:
            return mpmath.fsum(terms[: max(0, x + 1)])
        return -mpmath.fsum(terms[x + 1 :])


def _exact_pmf(x: int, m: int, q: float) -> mpmath.mpf:
    """``Pr[Bin(m, q) = x]`` (60 digits, the float ``q`` taken exactly)."""
    with mpmath.workdps(60):
        if not 0 <= x <= m:
            return mpmath.mpf(0)
        qq = mpmath.mpf(q)
        return mpmath.binomial(m, x) * qq**x * (1 - qq) ** (m - x)


def _points(seed: int, n: int, q: float) -> tuple[FloatArray, ...]:
    """Points as the engine makes them: rows ``K``, ``m = n - K``; on each diagonal the end
    falls by ``p + 1`` rounded (2..5 here, now and then more than CAP, which breaks the
    chain) every two rows, crossing the mean; plus scattered points."""
    rng = random.Random(seed)
    xs: list[float] = []
    ms: list[float] = []
    diagonals: list[float] = []
    ks: list[float] = []
    for diagonal in range(6):
        big_k = diagonal % 2 + 2 * rng.randint(0, 3)
        x = rng.randint(int(0.8 * n * q), n - 10)
        while x >= 0 and big_k < n // 2:
            xs.append(float(x))
            ms.append(float(n - big_k))
            diagonals.append(float(diagonal))
            ks.append(float(big_k))
            big_k += 2
            x -= rng.choice([2, 3, 3, 4, 4, 5, CAP + 1])
    for _ in range(30):
        big_k = rng.randint(0, n // 2)
        xs.append(float(rng.randint(0, n - big_k)))
        ms.append(float(n - big_k))
        diagonals.append(float(100 + rng.randint(0, 20)))
        ks.append(float(big_k))
    return tuple(np.asarray(v) for v in (xs, ms, diagonals, ks))


@pytest.mark.parametrize(("n", "q"), [(40, 0.5378828460590105), (150, 0.3), (240, 0.8)])
@pytest.mark.parametrize("seed", [0, 1])
def test_chained_values_within_their_budget_of_exact(n: int, q: float, seed: int) -> None:
    x, m, diagonal, big_k = _points(seed, n, q)
    values, pmf, extra = chained_lower_cdf(x, m, q, diagonal, big_k)
    assert 0.0 < extra < 1e-12
    budget = _SPECIAL_REL_ERR + extra
    boost = np.asarray(stats.binom.pmf(x, m, q))
    assert np.all(np.abs(pmf - boost) <= 2.0 * budget * boost)
    chained = 0
    direct = lower_cdf(x, m, q)
    for i in range(x.size):
        exact = _exact_lower_cdf(int(x[i]), int(m[i]), q)
        error = abs(mpmath.mpf(float(values[i])) - exact)
        assert error <= budget * abs(exact), (i, values[i], exact)
        chained += values[i] != direct[i]
        exact_pmf = _exact_pmf(int(x[i]), int(m[i]), q)
        assert abs(mpmath.mpf(float(pmf[i])) - exact_pmf) <= budget * exact_pmf, (i, pmf[i])
    assert chained > x.size // 4  # most values did come from chains


def test_a_chain_that_would_cancel_is_not_formed() -> None:
    """Points on both sides of the mean never share a chain: each side gets its own
    anchor, so the values are sums of non-negative terms."""
    n, q = 200, 0.5
    ks = np.arange(0.0, 80.0, 2.0)
    x = np.floor((n - ks) * q) + 30.0 - 2.5 * ks  # crosses the mean near K = 24
    m = n - ks
    values, _, _ = chained_lower_cdf(x, m, q, np.zeros_like(ks), ks)
    below = x < m * q
    assert below.any()
    assert (~below).any()
    assert np.all(values[below] >= 0.0)
    assert np.all(values[~below] <= 0.0)
    for i in range(x.size):
        exact = _exact_lower_cdf(int(x[i]), int(m[i]), q)
        assert abs(mpmath.mpf(float(values[i])) - exact) <= 2e-10 * abs(exact)


def _clear_caches() -> None:
    composition.clear_caches()


@pytest.mark.parametrize(
    ("sizes", "delta"),
    [((61_440, 65_536, 98_304), 1e-8), ((253_952, 262_144), 1e-6)],
)
def test_epsilon_total_never_below_the_value_by_value_path(
    monkeypatch: pytest.MonkeyPatch, sizes: tuple[int, ...], delta: float
) -> None:
    spec = MechanismSpec(mechanism="coco", d=128, s=8, epsilon=1.0)
    counts = {blanket_pair_for_spec(spec, n=n): 7 + i for i, n in enumerate(sizes)}
    _clear_caches()
    new = epsilon_total_counts(counts, delta=delta)
    _clear_caches()
    with monkeypatch.context() as patch:
        patch.setattr(blanket, "chained_lower_cdf", direct_chained)
        old = epsilon_total_counts(counts, delta=delta)
    _clear_caches()
    assert new >= old * (1.0 - _COMPOSITION_NOISE)
    assert new <= old * (1.0 + 1e-6)
