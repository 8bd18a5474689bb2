"""Tests of the generic stronger-clone bound (aggregator/accountant/clone.py) and the record.

Independent second computations used here:

* brute-force enumeration of (C, A, Delta1, Delta2) into the exact pmfs of P_alpha and
  Q_alpha, both hockey-stick directions summed point by point (floats for n <= 30,
  fractions for n <= 8);
* a direct sum over the (m, x) lattice of the conditional formula for n in the hundreds and
  thousands (exercises the m-window and the binomial-tail identity);
* the exact shuffled output (histogram) of a real k-ary randomised response;
* the independent reference table ``amplification.tsv`` (tests/aggregator/reference.py);
* exact integer arithmetic for the special functions the certificate relies on.
"""

from __future__ import annotations

import csv
import dataclasses
import itertools
import json
import math
from collections import defaultdict
from decimal import Decimal, localcontext
from fractions import Fraction

import numpy as np
import pytest
from scipy import stats

from aggregator.accountant import (
    Amplification,
    amplify,
    delta_for,
    efmrtt19,
    epsilon_central,
    fmt21,
    generic_clone_probability,
    hockey_stick,
)
from tests.aggregator.reference import REFERENCE_DIR, require_reference

REFERENCE_TSV = REFERENCE_DIR / "amplification.tsv"

Pmf = dict[tuple[int, ...], float]
ExactPmf = dict[tuple[int, ...], Fraction]


# --------------------------------------------------------------------------------------------
# second computations


def brute_pair(n: int, epsilon0: float, alpha: float) -> tuple[Pmf, Pmf]:
    """The pmfs of P_alpha and Q_alpha by enumerating (C, A, Delta1, Delta2) (floats)."""
    p = math.exp(epsilon0)
    q = 2 * alpha
    gamma = max(0.0, 1 - alpha - p * alpha)
    deltas = ((1, 0, p * alpha), (0, 1, alpha), (0, 0, gamma))
    big_p: Pmf = defaultdict(float)
    big_q: Pmf = defaultdict(float)
    for c in range(n):
        b_c = math.comb(n - 1, c) * q**c * (1 - q) ** (n - 1 - c)
        for a in range(c + 1):
            w = b_c * math.comb(c, a) / 2**c
            for d1, d2, pr in deltas:
                big_p[(a + d1, c - a + d2)] += w * pr
                big_q[(a + d2, c - a + d1)] += w * pr
    return big_p, big_q


def brute_pair_exact(n: int, p: Fraction, alpha: Fraction) -> tuple[ExactPmf, ExactPmf]:
    """The same enumeration in exact rational arithmetic."""
    q = 2 * alpha
    gamma = 1 - alpha - p * alpha
    deltas = ((1, 0, p * alpha), (0, 1, alpha), (0, 0, gamma))
    big_p: ExactPmf = defaultdict(Fraction)
    big_q: ExactPmf = defaultdict(Fraction)
    for c in range(n):
        b_c = math.comb(n - 1, c) * q**c * (1 - q) ** (n - 1 - c)
        for a in range(c + 1):
            w = b_c * Fraction(math.comb(c, a), 2**c)
            for d1, d2, pr in deltas:
                big_p[(a + d1, c - a + d2)] += w * pr
                big_q[(a + d2, c - a + d1)] += w * pr
    return big_p, big_q


def hs(big_p: Pmf, big_q: Pmf, e_eps: float) -> float:
    """``D_e^eps(P || Q) = sum_y max(0, P(y) - e^eps Q(y))`` (directed)."""
    keys = set(big_p) | set(big_q)
    return math.fsum(max(0.0, big_p.get(k, 0.0) - e_eps * big_q.get(k, 0.0)) for k in keys)


def hs_exact(big_p: ExactPmf, big_q: ExactPmf, e_eps: Fraction) -> Fraction:
    keys = set(big_p) | set(big_q)
    zero = Fraction(0)
    return sum((max(zero, big_p.get(k, zero) - e_eps * big_q.get(k, zero)) for k in keys), zero)


def krr_histogram(inputs: tuple[int, ...], k: int, epsilon0: float) -> Pmf:
    """Exact law of the shuffled view (output histogram) of k-ary randomised response."""
    p = math.exp(epsilon0)
    dist: Pmf = {tuple([0] * k): 1.0}
    for x in inputs:
        new: Pmf = defaultdict(float)
        for hist, pr in dist.items():
            for y in range(k):
                out = list(hist)
                out[y] += 1
                new[tuple(out)] += pr * (p if y == x else 1.0) / (p + k - 1)
        dist = new
    return dist


def krr_shuffled_divergence(*, k: int, n: int, epsilon0: float, epsilon: float) -> float:
    """max over the other users' inputs and both directions: x_1 = 0 versus x_1' = 1."""
    e_eps = math.exp(epsilon)
    worst = 0.0
    for others in itertools.combinations_with_replacement(range(k), n - 1):
        big_p = krr_histogram((0, *others), k, epsilon0)
        big_q = krr_histogram((1, *others), k, epsilon0)
        worst = max(worst, hs(big_p, big_q, e_eps), hs(big_q, big_p, e_eps))
    return worst


def lattice_divergence(*, epsilon: float, n: int, epsilon0: float, alpha: float) -> float:
    """Direct sum over every (m, x) of the conditional formula of ERRATA item 5."""
    p = math.exp(epsilon0)
    e_eps = math.exp(epsilon)
    gamma = max(0.0, 1 - alpha - p * alpha)
    b = stats.binom.pmf(np.arange(n + 1), n - 1, 2 * alpha)  # b(n) = 0
    total = 0.0
    for m in range(1, n + 1):
        x = np.arange(m + 1, dtype=np.float64)
        big_b = stats.binom.pmf(x, m, 0.5)
        pm = big_b * (b[m - 1] * (2 / m) * (p * alpha * x + alpha * (m - x)) + gamma * b[m])
        qm = pm[::-1]
        total += float(np.maximum(pm - e_eps * qm, 0.0).sum())
    return total


def bisection_epsilon(*, n: int, delta: float, epsilon0: float, alpha: float) -> float:
    """Plain bisection on delta_for (the slow obvious search), returning the upper end."""
    lo, hi = 0.0, epsilon0
    for _ in range(45):
        mid = 0.5 * (lo + hi)
        if delta_for(epsilon=mid, n=n, epsilon0=epsilon0, clone_probability=alpha) <= delta:
            hi = mid
        else:
            lo = mid
    return hi


def collision_alpha(*, epsilon0: float, s: int, t: int) -> float:
    """ERRATA item 4: clone probability beta / (e^eps0 - 1) = s / (s e^eps0 + t - s)."""
    return s / (s * math.exp(epsilon0) + (t - s))


# --------------------------------------------------------------------------------------------
# the pair against brute force

EPS0_GRID = (0.2, 1.0, 2.5)
ALPHA_FACTORS = (1.0, 0.5, 0.1)  # 1.0 is the generic clone probability
EPS_FRACTIONS = (0.0, 0.05, 0.3, 0.7, 0.95)


@pytest.mark.parametrize("epsilon0", EPS0_GRID)
@pytest.mark.parametrize("factor", ALPHA_FACTORS)
def test_hockey_stick_matches_brute_force_small_n(epsilon0: float, factor: float) -> None:
    alpha = factor * generic_clone_probability(epsilon0)
    for n in range(1, 31):
        big_p, big_q = brute_pair(n, epsilon0, alpha)
        assert math.isclose(math.fsum(big_p.values()), 1.0, rel_tol=1e-12)
        for frac in EPS_FRACTIONS:
            eps = frac * epsilon0
            forward = hs(big_p, big_q, math.exp(eps))
            backward = hs(big_q, big_p, math.exp(eps))
            got = hockey_stick(eps, n=n, epsilon0=epsilon0, clone_probability=alpha)
            where = f"n={n} eps0={epsilon0} alpha={alpha} eps={eps}"
            # symmetry D(P||Q) = D(Q||P), from two separate brute-force sums
            assert math.isclose(forward, backward, rel_tol=1e-11, abs_tol=1e-17), where
            exact = max(forward, backward)
            assert got >= exact * (1 - 1e-12), where  # an upper bound ...
            assert got <= exact * (1 + 1e-6) + 1e-18, where  # ... and a tight one


@pytest.mark.parametrize(
    ("n", "epsilon0", "factor"), [(1, 1.0, 1.0), (2, 0.5, 0.3), (5, 2.0, 1.0), (8, 1.5, 0.6)]
)
def test_hockey_stick_matches_exact_rational_enumeration(
    n: int, epsilon0: float, factor: float
) -> None:
    alpha = factor * generic_clone_probability(epsilon0)
    p = Fraction(math.exp(epsilon0))
    big_p, big_q = brute_pair_exact(n, p, Fraction(alpha))
    assert sum(big_p.values()) == 1
    for frac in EPS_FRACTIONS:
        eps = frac * epsilon0
        e_eps = Fraction(math.exp(eps))
        forward, backward = hs_exact(big_p, big_q, e_eps), hs_exact(big_q, big_p, e_eps)
        assert forward == backward  # exact symmetry
        got = hockey_stick(eps, n=n, epsilon0=epsilon0, clone_probability=alpha)
        assert got >= float(forward) * (1 - 1e-12)
        assert got <= float(forward) * (1 + 1e-6) + 1e-18


def test_single_user_closed_form() -> None:
    """n = 1: the pair is one eps0-LDP report, D = alpha (e^eps0 - e^eps)."""
    for epsilon0, eps in [(1.0, 0.0), (1.0, 0.4), (3.0, 2.9)]:
        alpha = generic_clone_probability(epsilon0)
        want = alpha * (math.exp(epsilon0) - math.exp(eps))
        got = hockey_stick(eps, n=1, epsilon0=epsilon0, clone_probability=alpha)
        assert want <= got <= want * (1 + 1e-8)


def test_tail_identity_used_by_the_fast_path() -> None:
    """sum_{x >= x0} (x - m/2) B(x; m) = (m/4) B(x0 - 1; m - 1), exactly."""

    def b(x: int, m: int) -> Fraction:
        return Fraction(math.comb(m, x), 2**m) if 0 <= x <= m else Fraction(0)

    for m in range(1, 14):
        for x0 in range(m + 2):
            lhs = sum((Fraction(2 * x - m, 2) * b(x, m) for x in range(x0, m + 1)), Fraction(0))
            assert lhs == Fraction(m, 4) * b(x0 - 1, m - 1)


@pytest.mark.parametrize(
    ("n", "epsilon0", "factor"), [(200, 1.0, 1.0), (200, 3.0, 0.4), (2000, 0.5, 1.0)]
)
def test_hockey_stick_matches_lattice_sum(n: int, epsilon0: float, factor: float) -> None:
    alpha = factor * generic_clone_probability(epsilon0)
    for frac in (0.02, 0.1, 0.3):
        eps = frac * epsilon0
        want = lattice_divergence(epsilon=eps, n=n, epsilon0=epsilon0, alpha=alpha)
        got = hockey_stick(eps, n=n, epsilon0=epsilon0, clone_probability=alpha)
        assert want * (1 - 1e-9) <= got <= want * (1 + 1e-6) + 1e-22, (n, eps, want, got)


def test_seeded_random_parameters_against_brute_force() -> None:
    rng = np.random.default_rng(20240611)
    for _ in range(40):
        n = int(rng.integers(1, 26))
        epsilon0 = float(rng.uniform(0.05, 5.0))
        alpha = float(rng.uniform(0.0, 1.0)) * generic_clone_probability(epsilon0)
        eps = float(rng.uniform(0.0, epsilon0))
        big_p, big_q = brute_pair(n, epsilon0, alpha)
        exact = max(hs(big_p, big_q, math.exp(eps)), hs(big_q, big_p, math.exp(eps)))
        got = hockey_stick(eps, n=n, epsilon0=epsilon0, clone_probability=alpha)
        assert exact * (1 - 1e-12) <= got <= exact * (1 + 1e-6) + 1e-18


# --------------------------------------------------------------------------------------------
# a real shuffled mechanism


@pytest.mark.parametrize("k", [2, 3])
@pytest.mark.parametrize("epsilon0", [0.5, 1.0, 2.0])
def test_krr_shuffled_divergence_is_below_generic_bound(k: int, epsilon0: float) -> None:
    alpha = generic_clone_probability(epsilon0)
    for n in range(1, 6):
        for eps in np.linspace(0.0, epsilon0, 9):
            real = krr_shuffled_divergence(k=k, n=n, epsilon0=epsilon0, epsilon=float(eps))
            bound = hockey_stick(float(eps), n=n, epsilon0=epsilon0, clone_probability=alpha)
            assert real <= bound + 1e-15, (k, n, eps, real, bound)


def test_specific_clone_probability_is_not_certified_fmt23_erratum() -> None:
    """Pins the finding that a mechanism-specific clone probability is NOT a valid reduction.

    3-ary RR has total variation (e^eps0 - 1)/(e^eps0 + 2) between two inputs, i.e. clone
    probability 1/(e^eps0 + 2) by ERRATA item 4 (below the generic 1/(e^eps0 + 1)). With
    n = 2 and both users holding 0 versus (1, 0), the shuffled output's divergence exceeds
    D(P_alpha || Q_alpha): the stronger-clone lemma fails for alpha < 1/(e^eps0 + 1), as the
    FMT23 erratum (arXiv 2208.04591) states. The generic bound still holds.
    """
    epsilon0, eps, n = 0.5, 0.3125, 2
    p = math.exp(epsilon0)
    e_eps = math.exp(eps)
    big_p = krr_histogram((0, 0), 3, epsilon0)
    big_q = krr_histogram((1, 0), 3, epsilon0)
    real = hs(big_p, big_q, e_eps)
    specific = hockey_stick(eps, n=n, epsilon0=epsilon0, clone_probability=1 / (p + 2))
    generic = hockey_stick(eps, n=n, epsilon0=epsilon0, clone_probability=1 / (p + 1))
    assert real == pytest.approx(0.0349088270539731, rel=1e-12)
    assert specific == pytest.approx(0.0285275796607916, rel=1e-8)
    assert real > 1.2 * specific  # the "mechanism-specific bound" is violated
    assert real <= generic


# --------------------------------------------------------------------------------------------
# the reference figures


def _reference_rows() -> list[dict[str, str]]:
    if not REFERENCE_TSV.is_file():
        return []
    with REFERENCE_TSV.open(newline="") as fh:
        return list(csv.DictReader(fh, delimiter="\t"))


def _row_id(row: dict[str, str] | None) -> str:
    if row is None:
        return "missing"
    return f"{row['mechanism']}-eps0={row['eps0']}-n={row['n']}-delta={row['delta']}"


_ROWS = _reference_rows()
_ROW_PARAMS: list[object] = list(_ROWS) if _ROWS else [None]


@pytest.mark.parametrize("row", _ROW_PARAMS, ids=_row_id)
def test_reference_amplification_tsv(row: dict[str, str] | None) -> None:
    if row is None:  # absent: skips with the reason, or fails under CI=true
        require_reference("amplification.tsv")
    assert row is not None
    epsilon0, n, delta = float(row["eps0"]), int(row["n"]), float(row["delta"])
    alpha = float(row["alpha_clone"])
    if row["mechanism"] == "generic":
        assert alpha == pytest.approx(generic_clone_probability(epsilon0), rel=1e-9)
        alpha = generic_clone_probability(epsilon0)
    got = epsilon_central(n=n, delta=delta, epsilon0=epsilon0, clone_probability=alpha)
    want = float(row["eps_c_stronger_clone"])
    assert abs(got - want) <= 2e-6
    assert got >= want - 1e-6  # we are an upper bound too: never far below the reference
    for column, fn in (("eps_c_fmt21_closed_form", fmt21), ("eps_c_efmrtt19", efmrtt19)):
        value = fn(epsilon0=epsilon0, n=n, delta=delta)
        if row[column] == "NA":
            assert value is None, column
        else:
            assert value is not None, column
            assert value == pytest.approx(float(row[column]), rel=1e-9), column


# --------------------------------------------------------------------------------------------
# monotonicity, inverse, search


@pytest.mark.parametrize("epsilon0", [0.5, 2.0, 4.0])
def test_epsilon_central_non_increasing_in_n(epsilon0: float) -> None:
    alpha = generic_clone_probability(epsilon0)
    values = [
        epsilon_central(n=n, delta=1e-6, epsilon0=epsilon0, clone_probability=alpha)
        for n in (1, 3, 10, 30, 100, 300, 1000, 3000, 10_000, 100_000)
    ]
    assert all(0.0 <= v <= epsilon0 for v in values)
    assert all(b <= a + 2e-9 for a, b in itertools.pairwise(values)), values
    assert values[-1] < values[0]


@pytest.mark.parametrize("epsilon0", [0.5, 2.0, 4.0])
def test_epsilon_central_non_increasing_in_delta(epsilon0: float) -> None:
    alpha = generic_clone_probability(epsilon0)
    deltas = (1e-12, 1e-10, 1e-8, 1e-6, 1e-4, 1e-2, 0.1)
    values = [
        epsilon_central(n=5000, delta=d, epsilon0=epsilon0, clone_probability=alpha) for d in deltas
    ]
    assert all(0.0 <= v <= epsilon0 for v in values)
    assert all(b <= a + 2e-9 for a, b in itertools.pairwise(values)), values


def test_never_above_epsilon0_and_epsilon0_when_no_amplification() -> None:
    # one report and a delta below its divergence at every eps < eps0: no amplification
    alpha = generic_clone_probability(2.0)
    got = epsilon_central(n=1, delta=1e-12, epsilon0=2.0, clone_probability=alpha)
    assert 2.0 - 1e-9 <= got <= 2.0
    assert epsilon_central(n=2, delta=1e-300, epsilon0=1.0, clone_probability=0.2) <= 1.0


@pytest.mark.parametrize(("n", "epsilon0"), [(50, 1.0), (10_000, 0.3), (10_000, 4.0)])
def test_hockey_stick_non_increasing_in_epsilon(n: int, epsilon0: float) -> None:
    alpha = generic_clone_probability(epsilon0)
    grid = np.linspace(0.0, epsilon0, 61)
    values = [hockey_stick(float(e), n=n, epsilon0=epsilon0, clone_probability=alpha) for e in grid]
    assert all(b <= a for a, b in itertools.pairwise(values)), values
    assert values[-1] == 0.0


def test_hockey_stick_non_decreasing_in_clone_probability() -> None:
    """FMT23 Lemma 5.1 (the paper's Theorem "Amplification Upper Bounds" proof)."""
    for n, epsilon0, eps in [(20, 1.0, 0.2), (3000, 2.0, 0.1), (3000, 0.5, 0.02)]:
        generic = generic_clone_probability(epsilon0)
        values = [
            hockey_stick(eps, n=n, epsilon0=epsilon0, clone_probability=f * generic)
            for f in (0.0, 0.1, 0.3, 0.6, 0.9, 1.0)
        ]
        assert all(b >= a for a, b in itertools.pairwise(values)), values


@pytest.mark.parametrize(
    ("n", "delta", "epsilon0", "factor"),
    [
        (1000, 1e-6, 1.0, 1.0),
        (10**5, 1e-8, 2.0, 1.0),
        (10**4, 1e-6, 3.0, 0.3),
        (40, 0.05, 1.0, 1.0),
    ],
)
def test_inverse_delta_for_epsilon_central(
    n: int, delta: float, epsilon0: float, factor: float
) -> None:
    alpha = factor * generic_clone_probability(epsilon0)
    tol = 1e-9
    eps_c = epsilon_central(n=n, delta=delta, epsilon0=epsilon0, clone_probability=alpha, tol=tol)
    assert 0.0 < eps_c < epsilon0
    certified = delta_for(epsilon=eps_c, n=n, epsilon0=epsilon0, clone_probability=alpha)
    assert certified <= delta
    assert certified >= delta * (1 - 1e-3)  # close: eps_c is (nearly) the smallest
    below = delta_for(epsilon=eps_c - 2 * tol, n=n, epsilon0=epsilon0, clone_probability=alpha)
    assert below > delta


@pytest.mark.parametrize(("n", "epsilon0"), [(500, 1.0), (10**5, 2.5)])
def test_round_trip_epsilon_delta_epsilon(n: int, epsilon0: float) -> None:
    alpha = generic_clone_probability(epsilon0)
    for eps in (0.05 * epsilon0, 0.2 * epsilon0, 0.6 * epsilon0):
        delta = delta_for(epsilon=eps, n=n, epsilon0=epsilon0, clone_probability=alpha)
        if delta < 1e-15:
            continue  # below ~1e-23 the bound is the added tail mass: flat in eps
        back = epsilon_central(n=n, delta=delta, epsilon0=epsilon0, clone_probability=alpha)
        assert eps - 1e-6 <= back <= eps + 1e-9


def test_search_agrees_with_plain_bisection() -> None:
    rng = np.random.default_rng(7)
    for _ in range(25):
        n = int(10 ** rng.uniform(0, 5))
        epsilon0 = float(rng.uniform(0.1, 6.0))
        alpha = float(rng.uniform(0.2, 1.0)) * generic_clone_probability(epsilon0)
        delta = float(10 ** rng.uniform(-12, -0.5))
        got = epsilon_central(n=n, delta=delta, epsilon0=epsilon0, clone_probability=alpha)
        slow = bisection_epsilon(n=n, delta=delta, epsilon0=epsilon0, alpha=alpha)
        where = (n, epsilon0, alpha, delta, got, slow)
        assert abs(got - slow) <= 2e-9, where
        assert delta_for(epsilon=got, n=n, epsilon0=epsilon0, clone_probability=alpha) <= delta


# --------------------------------------------------------------------------------------------
# clone probabilities (ERRATA item 4) and edge cases


def test_generic_clone_probability_is_total_variation_over_e_minus_one() -> None:
    for epsilon0 in (0.1, 1.0, 3.0):
        p = math.exp(epsilon0)
        beta = (p - 1) / (p + 1)  # what the paper quotes
        assert generic_clone_probability(epsilon0) == pytest.approx(beta / (p - 1), rel=1e-14)
        assert generic_clone_probability(epsilon0) == pytest.approx(1 / (p + 1), rel=1e-15)


def test_mechanism_specific_clone_probability_orders_like_the_paper() -> None:
    """Collision/CoCo: s / (s e^eps0 + t - s) (ERRATA item 4). See the erratum test above:
    the smaller number is the pair's, not a certified bound for the mechanism."""
    n, delta, epsilon0 = 10**4, 1e-6, 1.0
    generic = epsilon_central(
        n=n, delta=delta, epsilon0=epsilon0, clone_probability=generic_clone_probability(1.0)
    )
    specific = epsilon_central(
        n=n,
        delta=delta,
        epsilon0=epsilon0,
        clone_probability=collision_alpha(epsilon0=epsilon0, s=8, t=40),
    )
    assert specific < 0.9 * generic
    # s = 1, t = 2 is binary randomised response: exactly the generic clone probability
    binary = collision_alpha(epsilon0=epsilon0, s=1, t=2)
    assert binary == generic_clone_probability(epsilon0)
    same = epsilon_central(n=n, delta=delta, epsilon0=epsilon0, clone_probability=binary)
    assert same == generic
    # passing the total-variation parameter beta = (e^eps0 - 1)/(e^eps0 + 1) is rejected
    beta = math.expm1(epsilon0) / (math.exp(epsilon0) + 1)
    with pytest.raises(ValueError, match="ERRATA item 4"):
        epsilon_central(n=n, delta=delta, epsilon0=epsilon0, clone_probability=beta)


def test_edge_cases() -> None:
    generic = generic_clone_probability(1.0)
    # eps >= eps0: post-processing of an eps0-LDP report
    assert hockey_stick(1.0, n=100, epsilon0=1.0, clone_probability=generic) == 0.0
    assert hockey_stick(7.0, n=100, epsilon0=1.0, clone_probability=generic) == 0.0
    assert hockey_stick(1.0 - 1e-6, n=3, epsilon0=1.0, clone_probability=generic) > 0.0
    # alpha = 0 and eps0 = 0: P = Q
    assert hockey_stick(0.0, n=100, epsilon0=1.0, clone_probability=0.0) == 0.0
    assert epsilon_central(n=100, delta=1e-9, epsilon0=1.0, clone_probability=0.0) == 0.0
    assert hockey_stick(0.0, n=100, epsilon0=0.0, clone_probability=0.5) == 0.0
    assert epsilon_central(n=100, delta=1e-9, epsilon0=0.0, clone_probability=0.5) == 0.0
    # a delta above the total variation needs no amplification at all
    tv = hockey_stick(0.0, n=10**4, epsilon0=1.0, clone_probability=generic)
    assert epsilon_central(n=10**4, delta=2 * tv, epsilon0=1.0, clone_probability=generic) == 0
    # rounding above the maximum clone probability is accepted (and clamped)
    slightly = generic * (1 + 1e-15)
    assert hockey_stick(0.1, n=50, epsilon0=1.0, clone_probability=slightly) == hockey_stick(
        0.1, n=50, epsilon0=1.0, clone_probability=generic
    )
    # large n, tiny alpha (the m-window does not start at 0)
    assert 0.0 < epsilon_central(n=10**6, delta=1e-8, epsilon0=4.0, clone_probability=1e-3) < 4


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"n": 0}, ValueError),
        ({"n": 2.5}, TypeError),
        ({"n": True}, TypeError),
        ({"epsilon": -0.1}, ValueError),
        ({"epsilon": math.nan}, ValueError),
        ({"epsilon0": -1.0}, ValueError),
        ({"epsilon0": math.inf}, ValueError),
        ({"clone_probability": -0.01}, ValueError),
        ({"clone_probability": 0.3}, ValueError),  # > 1/(e + 1)
    ],
)
def test_hockey_stick_validation(kwargs: dict[str, float], error: type[Exception]) -> None:
    args: dict[str, float] = {
        "epsilon": 0.1,
        "n": 10,
        "epsilon0": 1.0,
        "clone_probability": generic_clone_probability(1.0),
    }
    args.update(kwargs)
    with pytest.raises(error):
        hockey_stick(
            args["epsilon"],
            n=args["n"],  # type: ignore[arg-type]
            epsilon0=args["epsilon0"],
            clone_probability=args["clone_probability"],
        )


@pytest.mark.parametrize(
    "kwargs", [{"delta": 0.0}, {"delta": 1.5}, {"delta": math.nan}, {"tol": 0.0}, {"n": -3}]
)
def test_epsilon_central_validation(kwargs: dict[str, float]) -> None:
    args: dict[str, float] = {"n": 10, "delta": 1e-6, "epsilon0": 1.0, "tol": 1e-9}
    args.update(kwargs)
    with pytest.raises(ValueError, match=next(iter(kwargs))):
        epsilon_central(
            n=int(args["n"]),
            delta=args["delta"],
            epsilon0=args["epsilon0"],
            clone_probability=0.1,
            tol=args["tol"],
        )


# --------------------------------------------------------------------------------------------
# closed forms


def test_efmrtt19_regime_and_value() -> None:
    value = efmrtt19(epsilon0=0.5, n=10_000, delta=1e-6)
    assert value == pytest.approx(0.5 * math.sqrt(144 * math.log(1e6) / 10_000), rel=1e-14)
    assert efmrtt19(epsilon0=0.51, n=10_000, delta=1e-6) is None  # eps0 > 1/2
    assert efmrtt19(epsilon0=0.5, n=999, delta=1e-6) is None  # n < 1000
    assert efmrtt19(epsilon0=0.5, n=10_000, delta=0.02) is None  # delta > 1/100
    assert efmrtt19(epsilon0=0.5, n=1000, delta=1e-6) is None  # result above eps0
    assert efmrtt19(epsilon0=0.1, n=1000, delta=1e-3) is not None


def test_fmt21_regime_and_value() -> None:
    n, delta, epsilon0 = 10_000, 1e-6, 1.0
    p = math.e
    want = math.log(
        1 + (p - 1) / (p + 1) * (8 * math.sqrt(p * math.log(4 / delta)) / math.sqrt(n) + 8 * p / n)
    )
    assert fmt21(epsilon0=epsilon0, n=n, delta=delta) == pytest.approx(want, rel=1e-14)
    limit = math.log(n / (16 * math.log(2 / delta)))
    assert fmt21(epsilon0=limit * (1 - 1e-12), n=n, delta=delta) is not None
    assert fmt21(epsilon0=limit * (1 + 1e-12), n=n, delta=delta) is None
    assert fmt21(epsilon0=0.1, n=10, delta=1e-6) is None  # n <= 16 log(2/delta)


# --------------------------------------------------------------------------------------------
# the summary record


def test_amplify_record_and_json() -> None:
    record = amplify(n=10_000, delta=1e-6, epsilon0=0.5)
    assert isinstance(record, Amplification)
    generic = generic_clone_probability(0.5)
    # Without a mechanism only the generic stronger-clone bound applies.
    assert record.clone_probability == generic
    assert record.bound == "stronger-clone"
    assert record.mechanism == "generic"
    assert record.epsilon_central == epsilon_central(
        n=10_000, delta=1e-6, epsilon0=0.5, clone_probability=generic
    )
    assert record.epsilon_central_generic == record.epsilon_central
    assert record.efmrtt19 == efmrtt19(epsilon0=0.5, n=10_000, delta=1e-6)
    assert record.fmt21 == fmt21(epsilon0=0.5, n=10_000, delta=1e-6)
    data = record.to_dict()
    assert json.loads(json.dumps(data)) == data
    assert {f.name for f in dataclasses.fields(Amplification)} <= set(data)
    assert data["certified"] is True
    assert "epsilon_central_mechanism" not in data  # the paper's invalid pair is gone
    with pytest.raises(dataclasses.FrozenInstanceError):
        record.n = 3  # type: ignore[misc]
    outside = amplify(n=1000, delta=1e-6, epsilon0=3.0)
    assert outside.to_dict()["efmrtt19"] is None
    assert outside.to_dict()["fmt21"] is None
    with pytest.raises(ValueError, match="bound must be"):
        dataclasses.replace(record, bound="paper")
    with pytest.raises(ValueError, match="epsilon_central must be in"):
        dataclasses.replace(record, epsilon_central=0.6)


# --------------------------------------------------------------------------------------------
# the special-function accuracy the certificate assumes (budget: 1e-10 relative)


def _exact_half_binomial(k: int, m: int) -> tuple[float, float]:
    """Pr[Bin(m, 1/2) = k] and Pr[Bin(m, 1/2) >= k] by exact integer arithmetic."""
    total, term = 0, math.comb(m, k)
    pmf = Fraction(term, 2**m)
    for x in range(k, m + 1):
        total += term
        term = term * (m - x) // (x + 1)
    return float(pmf), float(Fraction(total, 2**m))


def test_boost_binomial_accuracy_against_exact_arithmetic() -> None:
    rng = np.random.default_rng(3)
    worst = 0.0
    for _ in range(120):
        m = int(10 ** rng.uniform(0.3, 3.5))
        k = min(m, int(m / 2 + rng.uniform(0, 12) * math.sqrt(m) / 2))
        pmf, tail = _exact_half_binomial(k, m)
        worst = max(
            worst,
            abs(float(stats.binom.pmf(k, m, 0.5)) / pmf - 1),
            abs(float(stats.binom.sf(k - 1, m, 0.5)) / tail - 1),
        )
    for _ in range(60):
        big_n = int(rng.integers(1, 400))
        q = float(rng.uniform(1e-3, 0.5))
        c = int(rng.integers(0, big_n + 1))
        exact = math.comb(big_n, c) * Fraction(q) ** c * (1 - Fraction(q)) ** (big_n - c)
        if exact < Fraction(1, 10**280):
            continue
        worst = max(worst, abs(float(stats.binom.pmf(c, big_n, q)) / float(exact) - 1))
    assert worst < 1e-11


@pytest.mark.parametrize(("m", "z"), [(10**6, 5.0), (5 * 10**7, 5.0)])
def test_boost_binomial_accuracy_large_m(m: int, z: float) -> None:
    """50-digit Stirling series for the pmf, and the tail as pmf times the ratio series."""
    k = int(m / 2 + z * math.sqrt(m) / 2)
    with localcontext() as ctx:
        ctx.prec = 50

        def lgamma(v: int) -> Decimal:  # ln Gamma(v), v >= 1e5: 4 Stirling terms suffice
            x = Decimal(v)
            two_pi = Decimal("6.2831853071795864769252867665590057683943387987502")
            return (
                (x - Decimal("0.5")) * x.ln()
                - x
                + two_pi.ln() / 2
                + 1 / (12 * x)
                - 1 / (360 * x**3)
                + 1 / (1260 * x**5)
            )

        log_pmf = lgamma(m + 1) - lgamma(k + 1) - lgamma(m - k + 1) - m * Decimal(2).ln()
        pmf = log_pmf.exp()
        ratio_sum, term, x = Decimal(0), Decimal(1), k
        while term > Decimal("1e-30") and x <= m:
            ratio_sum += term
            term = term * (m - x) / (x + 1)
            x += 1
        tail = pmf * ratio_sum
    assert float(stats.binom.pmf(k, m, 0.5)) == pytest.approx(float(pmf), rel=1e-11)
    assert float(stats.binom.sf(k - 1, m, 0.5)) == pytest.approx(float(tail), rel=1e-11)
