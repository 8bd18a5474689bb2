"""Very large batches: the certificate's binomial error budget, and the cap MAX_N.

Boost's binomial values lose accuracy like ``sqrt(n)``; the certified bound budgets
``1e-10`` relative per value, so it is validated (here, against 40-digit arithmetic) up to
``MAX_N`` and refuses larger batches; the ledger accounts a larger release as one of
``MAX_N`` reports (pessimistic). The class probabilities' binary64 rounding is budgeted
per engine, and the budget is checked against actual perturbations of ``q``.
"""

from __future__ import annotations

import math

import mpmath  # (installed with dp_accounting, which the tests use)
import numpy as np
import pytest
from scipy import stats

from aggregator.accountant import BlanketPair
from aggregator.accountant.blanket import _SPECIAL_REL_ERR, MAX_N, _Engine
from aggregator.accountant.history import accounting_size


def _pmf(k: int, n: int, q: float) -> mpmath.mpf:
    qq = mpmath.mpf(q)
    return mpmath.exp(
        mpmath.loggamma(n + 1)
        - mpmath.loggamma(k + 1)
        - mpmath.loggamma(n - k + 1)
        + k * mpmath.log(qq)
        + (n - k) * mpmath.log1p(-qq)
    )


def _tail(k: int, n: int, q: float, *, lower: bool) -> mpmath.mpf:
    """``P(X <= k)`` (``lower``, k below the mean) or ``P(X > k)`` (k above it), summing the
    pmf outwards by its recurrence until the terms are below 1e-25 of the sum."""
    qq = mpmath.mpf(q)
    j = k if lower else k + 1
    term = _pmf(j, n, q)
    total = term
    while 0 < j < n:
        if lower:
            term *= mpmath.mpf(j) / (n - j + 1) * (1 - qq) / qq
            j -= 1
        else:
            term *= mpmath.mpf(n - j) / (j + 1) * qq / (1 - qq)
            j += 1
        total += term
        if term < total * mpmath.mpf(10) ** -25:
            break
    return total


def test_boost_binomial_values_at_max_n_are_inside_the_budget() -> None:
    """At n = MAX_N, 10 standard deviations out (the windows reach about 9.3), pmf, cdf and
    sf are within half the 1e-10 budget of 40-digit values."""
    mpmath.mp.dps = 40
    n, q = MAX_N, 0.37
    sd = math.sqrt(n * q * (1 - q))
    worst = 0.0
    for z in (-10.0, 10.0):
        k = int(n * q + z * sd)
        worst = max(worst, float(abs(stats.binom.pmf(k, n, q) / _pmf(k, n, q) - 1)))
        if z < 0:
            value, exact = stats.binom.cdf(k, n, q), _tail(k, n, q, lower=True)
        else:
            value, exact = stats.binom.sf(k, n, q), _tail(k, n, q, lower=False)
        worst = max(worst, float(abs(value / exact - 1)))
    assert worst < _SPECIAL_REL_ERR / 2


def test_a_batch_above_max_n_is_refused_with_a_clear_error() -> None:
    BlanketPair(n=MAX_N, exp_epsilon0=math.e, s=1, t=4)  # the cap itself is accepted
    with pytest.raises(ValueError, match=r"above 1073741824, the largest batch"):
        BlanketPair(n=MAX_N + 1, exp_epsilon0=math.e, s=1, t=4)
    with pytest.raises(ValueError, match="validated"):
        BlanketPair(n=10**12, exp_epsilon0=math.e, s=1, t=4)


@pytest.mark.parametrize("n", [MAX_N, MAX_N + 1, 3 * MAX_N, 10**12, 2**62])
def test_the_ledger_accounts_a_larger_release_as_max_n_reports(n: int) -> None:
    size = accounting_size(n)
    assert size == MAX_N
    BlanketPair(n=size, exp_epsilon0=math.e, s=1, t=4)  # a pair the bound accepts


def _q1_perturbed_pmf_change(pair: BlanketPair, engine: _Engine, steps: int) -> float:
    """Largest relative change of the K pmf at the window's ends when q1 moves by
    ``steps`` ulps either way (what binary64 class probabilities can do)."""
    n = pair.n
    q1 = 2.0 * pair.hot
    ends = np.array([engine.k[0], engine.k[-1]])
    base = stats.binom.pmf(ends, n, q1)
    worst = 0.0
    for direction in (math.inf, -math.inf):
        q = q1
        for _ in range(steps):
            q = math.nextafter(q, direction)
        moved = stats.binom.pmf(ends, n, q)
        worst = max(worst, float(np.max(np.abs(moved / base - 1))))
    return worst


@pytest.mark.parametrize(
    ("n", "p", "s", "t"),
    [
        (10**6, 1.0 + 2.0**-24, 1, 2),  # t = 2s at the smallest eps0: 1 - q1 about 3e-8
        (10**6, 1.0 + 2.0**-20, 2, 4),
        (10**7, math.e, 2, 9),
    ],
)
def test_the_class_probability_budget_covers_their_rounding(
    n: int, p: float, s: int, t: int
) -> None:
    """q1 moved by 8 ulps (the rounding the budget allows for) changes the window ends'
    pmf by less than the budget's class-probability part, and by more than a tenth of it
    (the budget is of the right size, not vacuous)."""
    pair = BlanketPair(n=n, exp_epsilon0=p, s=s, t=t)
    engine = _Engine(pair, 1e-20)
    part = engine.rel - _SPECIAL_REL_ERR
    change = _q1_perturbed_pmf_change(pair, engine, 8)
    assert change <= part
    if part > 1e-9:  # where it matters, it is not vacuous
        assert change >= part / 10
