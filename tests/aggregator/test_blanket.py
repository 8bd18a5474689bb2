"""Tests of the certified blanket bound (aggregator/accountant/blanket.py).

Independent second computations used here (the exhaustive enumeration of the TRUE shuffled
divergence of k-RR, Collision and CoCo is in test_shuffle_brute_force.py):

* a direct sum over the multinomial class counts ``(N1, N2, N0, NR)`` of the design note's
  closed form (section 5), for n up to 60 and both class layouts (t >= 2s, t < 2s);
* the generic stronger-clone bound, which must coincide for binary randomised response;
* the exact shuffled divergence of the paper's lower-bound construction
  (:func:`sim.experiments.tightness.exact_divergences`), a certified lower bound;
* the independent reference table ``amplification-blanket.tsv`` (tests/aggregator/reference.py);
* exact rational arithmetic for the binomial cdf values with general ``q`` that the
  certificate relies on.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from decimal import Decimal, localcontext
from fractions import Fraction

import numpy as np
import pytest
from scipy import stats

from aggregator.accountant import (
    BlanketPair,
    amplify_spec,
    blanket_delta,
    blanket_epsilon,
    blanket_pair_for_spec,
    epsilon_central,
    generic_clone_probability,
    hockey_stick,
)
from edge import MechanismSpec
from sim.experiments.tightness import WorstCase, epsilon_at, exact_divergences
from tests.aggregator.reference import reference_rows


def direct_delta(pair: BlanketPair, epsilon: float) -> float:
    """``(1/n) E[((p - E) N1 + (1 - p E) N2 - c0 (E - 1) N0)_+]`` by enumerating counts."""
    n, p, c0 = pair.n, pair.exp_epsilon0, pair.neutral_weight
    a, b = pair.hot, pair.neutral
    r = 1.0 - 2.0 * a - b
    e = math.exp(epsilon)
    total = 0.0
    for n1 in range(n + 1):
        for n2 in range(n + 1 - n1):
            for n0 in range(n + 1 - n1 - n2):
                nr = n - n1 - n2 - n0
                value = (p - e) * n1 + (1 - p * e) * n2 - c0 * (e - 1) * n0
                if value <= 0:
                    continue
                mult = (
                    math.factorial(n)
                    // (
                        math.factorial(n1)
                        * math.factorial(n2)
                        * math.factorial(n0)
                        * math.factorial(nr)
                    )
                    * a ** (n1 + n2)
                    * b**n0
                    * r**nr
                )
                total += mult * value
    return total / n


@pytest.mark.parametrize(
    ("s", "t"), [(1, 2), (1, 3), (1, 6), (2, 3), (3, 4), (2, 9), (4, 17), (3, 5)]
)
@pytest.mark.parametrize("n", [1, 2, 7, 25, 60])
@pytest.mark.parametrize("epsilon0", [0.3, 1.0, 2.5])
def test_fast_engine_equals_direct_sum(s: int, t: int, n: int, epsilon0: float) -> None:
    pair = BlanketPair(n=n, exp_epsilon0=math.exp(epsilon0), s=s, t=t)
    for frac in (0.0, 0.02, 0.1, 0.3, 0.6, 0.9, 0.99):
        eps = frac * epsilon0
        exact = direct_delta(pair, eps)
        fast = blanket_delta(pair, epsilon=eps)
        # certified: never below. Budgets: 1e-9 relative slack, 3e-10 relative on the
        # magnitudes of each group's terms (up to ~1e3 times its value when they cancel,
        # eps close to eps0 at tiny n), and for the rounding of tau an absolute
        # (p - 1)(1 + e^eps) / n * 2 * 64 u (n + hi0 + 2) <= 384 u p^2.
        assert fast >= exact
        assert fast <= exact * (1 + 1e-6) + 384 * 2.0**-53 * pair.exp_epsilon0**2


def test_class_probabilities_sum_to_one_and_size_bias() -> None:
    for s, t in [(1, 2), (2, 3), (3, 5), (4, 17), (8, 40)]:
        pair = BlanketPair(n=10, exp_epsilon0=math.exp(1.3), s=s, t=t)
        p, a, b = pair.exp_epsilon0, pair.hot, pair.neutral
        r = s * (p - 1) / pair.omega
        assert 2 * a + b + r == pytest.approx(1.0, abs=1e-15)
        assert p * a + a + pair.neutral_weight * b == pytest.approx(1.0, abs=1e-15)


@pytest.mark.parametrize("n", [1, 5, 100, 10_000, 1_000_000])
@pytest.mark.parametrize("epsilon0", [0.2, 1.0, 3.0])
def test_binary_rr_equals_generic_stronger_clone(n: int, epsilon0: float) -> None:
    """Design note, section 5: s = 1, t = 2 gives exactly the generic bound."""
    pair = BlanketPair(n=n, exp_epsilon0=math.exp(epsilon0), s=1, t=2)
    alpha = generic_clone_probability(epsilon0)
    for frac in (0.0, 0.01, 0.05, 0.2, 0.5):
        eps = frac * epsilon0
        blanket = blanket_delta(pair, epsilon=eps)
        generic = hockey_stick(eps, n=n, epsilon0=epsilon0, clone_probability=alpha)
        # both carry their certificates' budgets: up to ~1e-7 relative after cancellation,
        # and the blanket bound's absolute budget for the rounding of tau (<= 384 u p^2)
        floor = 384 * 2.0**-53 * pair.exp_epsilon0**2
        assert blanket == pytest.approx(generic, rel=1e-6, abs=floor)
        assert blanket >= generic * (1 - 1e-6)


@pytest.mark.parametrize(
    ("mechanism", "s", "epsilon0"),
    [
        ("collision", 1, 0.5),
        ("collision", 4, 1.0),
        ("collision", 16, 3.0),
        ("coco", 1, 1.0),
        ("coco", 4, 0.5),
        ("coco", 8, 2.0),
    ],
)
@pytest.mark.parametrize("n", [100, 10_000])
def test_paper_pair_le_blanket_le_generic(mechanism: str, s: int, epsilon0: float, n: int) -> None:
    spec = MechanismSpec(mechanism=mechanism, d=4 * s, s=s, epsilon=epsilon0)  # type: ignore[arg-type]
    eps0 = spec.epsilon_effective
    delta = 1e-6
    blanket = blanket_epsilon(blanket_pair_for_spec(spec, n=n), delta=delta)
    generic = epsilon_central(
        n=n, delta=delta, epsilon0=eps0, clone_probability=generic_clone_probability(eps0)
    )
    paper = epsilon_central(
        n=n, delta=delta, epsilon0=eps0, clone_probability=spec.clone_probability
    )
    assert paper <= blanket <= generic
    record = amplify_spec(spec, n=n, delta=delta)
    assert record.epsilon_central == blanket
    assert record.epsilon_central_generic == generic


@pytest.mark.parametrize(("s", "epsilon0"), [(1, 1.0), (4, 1.0), (4, 2.0), (2, 0.5)])
def test_lower_bound_construction_is_below_and_within_0_2_percent(s: int, epsilon0: float) -> None:
    """The exact divergence of the paper's construction (Collision, t >= 3s) is a lower
    bound on any certified bound: the blanket bound is never below it, and within 0.2% of
    it in epsilon at n = 1e3 (design note, "Checks")."""
    n, delta = 1_000, 1e-6
    t = 3 * s + 2
    wc = WorstCase.for_collision(n=n, s=s, t=t, epsilon0=epsilon0)
    pair = BlanketPair(n=n, exp_epsilon0=math.exp(epsilon0), s=s, t=t)
    for frac in (0.02, 0.1, 0.3):
        eps = frac * epsilon0
        assert exact_divergences(wc, eps)[1] <= blanket_delta(pair, epsilon=eps)
    lower = epsilon_at(lambda e: exact_divergences(wc, e)[1], epsilon0=epsilon0, delta=delta)
    upper = blanket_epsilon(pair, delta=delta)
    assert lower <= upper <= lower * 1.002


def test_reference_amplification_blanket_tsv() -> None:
    """Within 0.2% of the reference and never below it (the reference is rounded to 7
    significant digits and searched to a relative 1e-7: 1e-6 relative covers both; ours
    is the upper end of a bracket, so it can only be above)."""
    rows = reference_rows("amplification-blanket.tsv")
    assert len(rows) == 32
    for row in rows:
        s, t, n = int(row["s"]), int(row["t"]), int(row["n"])
        eps0, delta = float(row["eps0"]), float(row["delta"])
        ours = blanket_epsilon(BlanketPair(n=n, exp_epsilon0=math.exp(eps0), s=s, t=t), delta=delta)
        ref = float(row["eps_c_blanket"])
        assert ref * (1 - 1e-6) <= ours <= ref * 1.002, row
        assert ours >= float(row["eps_c_lower"]), row
        # equal to generic for binary RR: the default search precision is 1e-5 relative
        assert ours <= float(row["eps_c_generic"]) * (1 + 2e-5), row
        tight = t >= (3 * s if row["mechanism"] == "collision" else 4 * s)
        if tight:  # the construction applies: the lower bound is within 0.2% at n = 1e3,
            # and at n = 1e5 within 1e-5 plus the search's 1e-5 relative precision
            assert ours <= float(row["eps_c_lower"]) * (1.002 if n < 10**5 else 1 + 2e-5), row


@pytest.mark.parametrize(("s", "t"), [(1, 3), (4, 17), (3, 5)])
def test_epsilon_monotone_in_n_and_delta(s: int, t: int) -> None:
    p = math.exp(1.0)
    by_n = [
        blanket_epsilon(BlanketPair(n=n, exp_epsilon0=p, s=s, t=t), delta=1e-6)
        for n in (10, 100, 1_000, 10_000, 100_000)
    ]
    assert by_n == sorted(by_n, reverse=True)
    pair = BlanketPair(n=5_000, exp_epsilon0=p, s=s, t=t)
    by_delta = [blanket_epsilon(pair, delta=d) for d in (1e-3, 1e-6, 1e-9, 1e-12)]
    assert by_delta == sorted(by_delta)


@pytest.mark.parametrize("n", [3, 300, 30_000])
def test_inverse_and_upper_end_of_bracket(n: int) -> None:
    pair = BlanketPair(n=n, exp_epsilon0=math.exp(1.5), s=2, t=11)
    for delta in (1e-3, 1e-7):
        eps = blanket_epsilon(pair, delta=delta, rtol=1e-9)
        if eps < pair.epsilon0:
            assert blanket_delta(pair, epsilon=eps) <= delta
            assert blanket_delta(pair, epsilon=eps * (1 - 1e-6)) > delta


def test_delta_non_increasing_in_epsilon_and_zero_at_epsilon0() -> None:
    pair = BlanketPair(n=2_000, exp_epsilon0=math.exp(2.0), s=4, t=30)
    grid = np.linspace(0.0, pair.epsilon0, 41)  # (ln p rounded up: maybe above 2)
    values = [blanket_delta(pair, epsilon=float(e)) for e in grid]
    # non-increasing above the certificate's absolute floor (~1e-13 here); never above 1
    floor = 384 * 2.0**-53 * pair.exp_epsilon0**2
    assert all(b <= a or b <= floor for a, b in itertools.pairwise(values))
    assert values[0] <= 1.0
    assert values[-1] == 0.0
    assert blanket_delta(pair, epsilon=5.0) == 0.0


def test_trivial_and_validation() -> None:
    flat = BlanketPair(n=10, exp_epsilon0=1.0, s=1, t=3)
    assert blanket_delta(flat, epsilon=0.0) == 0.0
    assert blanket_epsilon(flat, delta=1e-6) == 0.0
    with pytest.raises(ValueError, match="t must be > s=2, got 2"):
        BlanketPair(n=10, exp_epsilon0=2.0, s=2, t=2)
    with pytest.raises(ValueError, match="exp_epsilon0 must be >= 1"):
        BlanketPair(n=10, exp_epsilon0=0.5, s=1, t=3)
    with pytest.raises(ValueError, match="n must be >= 1"):
        BlanketPair(n=0, exp_epsilon0=2.0, s=1, t=3)
    with pytest.raises(TypeError, match="s must be an integer"):
        BlanketPair(n=3, exp_epsilon0=2.0, s=1.0, t=3)  # type: ignore[arg-type]
    pair = BlanketPair(n=10, exp_epsilon0=2.0, s=1, t=3)
    with pytest.raises(ValueError, match="epsilon must be >= 0"):
        blanket_delta(pair, epsilon=-0.1)
    with pytest.raises(ValueError, match="delta must be in"):
        blanket_epsilon(pair, delta=0.0)
    with pytest.raises(ValueError, match="rtol must be in"):
        blanket_epsilon(pair, delta=1e-6, rtol=0.0)
    with pytest.raises(dataclasses.FrozenInstanceError):
        pair.n = 3  # type: ignore[misc]


def _exact_cdf(k: int, m: int, q: Fraction) -> Fraction:
    return sum(
        (Fraction(math.comb(m, j)) * q**j * (1 - q) ** (m - j) for j in range(k + 1)),
        Fraction(0),
    )


def test_boost_binomial_cdf_general_q_accuracy() -> None:
    """The certificate budgets 1e-10 relative per Boost cdf/sf value with general ``q``."""
    rng = np.random.default_rng(11)
    worst = 0.0
    for _ in range(60):
        m = int(rng.integers(2, 400))
        q = Fraction(int(rng.integers(1, 999)), 1000)
        k = int(rng.integers(0, m))
        exact_cdf = _exact_cdf(k, m, q)
        cdf = float(stats.binom.cdf(k, m, float(q)))
        sf = float(stats.binom.sf(k, m, float(q)))
        # below the double range (~1e-300) only an absolute error that small matters
        if exact_cdf > Fraction(1, 10**300):
            worst = max(worst, float(abs(Fraction(cdf) / exact_cdf - 1)))
        if 1 - exact_cdf > Fraction(1, 10**300):
            worst = max(worst, float(abs(Fraction(sf) / (1 - exact_cdf) - 1)))
    assert worst < 1e-11


@pytest.mark.parametrize(("s", "t", "epsilon0"), [(1, 3, 1.0), (2, 9, 0.7), (3, 5, 1.5)])
def test_the_certificate_has_no_absolute_floor_in_the_tail(s: int, t: int, epsilon0: float) -> None:
    """Far in the tail the certified curve follows the true one down to the skipped mass
    (about 4 p tail), instead of stopping at a floor of about 4e-14 p^2: compositions aim
    there. Every value stays above the direct sum (certified)."""
    n = 120
    pair = BlanketPair(n=n, exp_epsilon0=math.exp(epsilon0), s=s, t=t)
    checked = 0
    for frac in np.linspace(0.3, 0.98, 18):
        eps = float(frac) * epsilon0
        exact = direct_delta(pair, eps)
        fast = blanket_delta(pair, epsilon=eps)
        assert fast >= exact
        assert fast <= exact * (1 + 1e-6) + 1e-18
        if 0 < exact < 1e-12:
            checked += 1
    assert checked >= 2  # the tail was reached, below the old floor


def _exact_delta_below(pair: BlanketPair, epsilon: float) -> Fraction:
    """A rigorous lower bound on the exact ``H_{e^eps}(P || Q)`` of the pair, in rationals:
    the direct multinomial sum (design note, section 5) at an ``E`` at least ``e^eps``
    (the sum falls as ``E`` grows), ``p`` and ``eps`` taken exactly as the floats given."""
    n, p = pair.n, Fraction(pair.exp_epsilon0)
    omega = pair.s * p + pair.t - pair.s
    if pair.t >= 2 * pair.s:
        a, b, c0 = Fraction(pair.s) / omega, Fraction(pair.t - 2 * pair.s) / omega, Fraction(1)
    else:
        a, b, c0 = Fraction(pair.t - pair.s) / omega, Fraction(2 * pair.s - pair.t) / omega, p
    r = 1 - 2 * a - b
    with localcontext() as ctx:
        ctx.prec = 60
        big_e = Fraction(Decimal(epsilon).exp()) * (1 + Fraction(1, 10**50))
    total = Fraction(0)
    for n1 in range(n + 1):
        for n2 in range(n + 1 - n1):
            for n0 in range(n + 1 - n1 - n2):
                value = (p - big_e) * n1 + (1 - p * big_e) * n2 - c0 * (big_e - 1) * n0
                if value > 0:
                    nr = n - n1 - n2 - n0
                    mult = math.factorial(n) // (
                        math.factorial(n1)
                        * math.factorial(n2)
                        * math.factorial(n0)
                        * math.factorial(nr)
                    )
                    total += mult * a ** (n1 + n2) * b**n0 * r**nr * value
    return total / n


@pytest.mark.parametrize(
    ("mechanism", "s", "t", "n"),
    [("collision", 1, 2, 1), ("collision", 1, 2, 5), ("collision", 2, 3, 2), ("coco", 1, 4, 6)],
)
@pytest.mark.parametrize("epsilon0", [1e-7, 1e-6])
def test_certificate_holds_for_the_smallest_epsilon0_a_spec_accepts(
    mechanism: str, s: int, t: int, n: int, epsilon0: float
) -> None:
    """A spec accepts any epsilon with e^eps 2^24 >= 2^24 + 1 (p = 1 + 2^-24 at 1e-7). There
    ``p e^eps - 1`` formed directly loses about ``u / (eps0 + eps)`` of its value, far more
    than the ``eta = 64 u (K + hi0 + 2)`` the certificate allows for the threshold ``tau``:
    the certified value must still never be below the exact one (rational arithmetic,
    at an ``E >= e^eps``)."""
    spec = MechanismSpec(mechanism=mechanism, d=4 * s, s=s, t=t, epsilon=epsilon0)  # type: ignore[arg-type]
    pair = blanket_pair_for_spec(spec, n=n)
    for frac in (0.02, 0.1, 0.35, 0.7, 0.9, 0.999, 0.999999):
        eps = frac * pair.epsilon0
        exact = _exact_delta_below(pair, eps)
        certified = blanket_delta(pair, epsilon=eps)
        assert Fraction(certified) >= exact, (frac, certified, float(exact))
