"""Tests of the composed central epsilon over batches (aggregator/accountant/composition.py).

Independent second computation: the exact privacy loss distribution of the blanket pair by
enumerating the class counts of a small batch, composed exactly (all combinations of the
per-batch losses), whose hockey-stick divergence is compared with the PLD built from the
certified delta curve and composed by dp_accounting. Plus the independent reference table
``composition-blanket.tsv`` (tests/aggregator/reference.py).
"""

from __future__ import annotations

import math
from collections import defaultdict

import numpy as np
import pytest
from dp_accounting.pld import pld_pmf, privacy_loss_distribution

from aggregator.accountant import (
    BlanketPair,
    blanket_epsilon,
    blanket_pld,
    composition,
    epsilon_total,
    epsilon_total_batches,
    epsilon_total_counts,
)
from aggregator.accountant.batch_pld import _curve
from aggregator.accountant.blanket import blanket_delta_curve_and_floor, blanket_pair_for_spec
from aggregator.accountant.convolution import ComposedPLD, compose
from edge.spec import MechanismSpec
from tests.aggregator.reference import reference_rows


def exact_loss_pmf(pair: BlanketPair) -> dict[float, float]:
    """Law of the privacy loss log(P/Q) under P, by enumerating (N1, N2, N0, NR)."""
    n, p, c0 = pair.n, pair.exp_epsilon0, pair.neutral_weight
    a, b = pair.hot, pair.neutral
    r = 1.0 - 2.0 * a - b
    out: dict[float, float] = defaultdict(float)
    for n1 in range(n + 1):
        for n2 in range(n + 1 - n1):
            for n0 in range(n + 1 - n1 - n2):
                nr = n - n1 - n2 - n0
                up, down = p * n1 + n2 + c0 * n0, n1 + p * n2 + c0 * n0
                if up == 0:
                    continue
                mult = (
                    math.factorial(n)
                    / (
                        math.factorial(n1)
                        * math.factorial(n2)
                        * math.factorial(n0)
                        * math.factorial(nr)
                    )
                    * a ** (n1 + n2)
                    * b**n0
                    * r**nr
                )
                out[round(math.log(up / down), 12)] += mult * up / n
    return dict(out)


def compose_exact(pmf: dict[float, float], rounds: int) -> dict[float, float]:
    total = {0.0: 1.0}
    for _ in range(rounds):
        nxt: dict[float, float] = defaultdict(float)
        for x, px in total.items():
            for y, py in pmf.items():
                nxt[round(x + y, 12)] += px * py
        total = dict(nxt)
    return total


def exact_delta(pmf: dict[float, float], epsilon: float) -> float:
    return sum(m * -math.expm1(epsilon - loss) for loss, m in pmf.items() if loss > epsilon)


def exact_epsilon(pmf: dict[float, float], delta: float) -> float:
    lo, hi = 0.0, max(pmf)
    while hi - lo > 1e-12:
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if exact_delta(pmf, mid) > delta else (lo, mid)
    return hi


@pytest.mark.parametrize(
    ("s", "t", "n", "epsilon0"), [(1, 3, 8, 1.0), (2, 9, 7, 0.7), (3, 5, 6, 1.5)]
)
@pytest.mark.parametrize("rounds", [1, 2, 3])
def test_composition_against_exact_enumeration(
    s: int, t: int, n: int, epsilon0: float, rounds: int
) -> None:
    pair = BlanketPair(n=n, exp_epsilon0=math.exp(epsilon0), s=s, t=t)
    exact = compose_exact(exact_loss_pmf(pair), rounds)
    assert sum(exact.values()) == pytest.approx(1.0, abs=1e-12)
    for delta in (1e-2, 1e-4):
        truth = exact_epsilon(exact, delta)
        ours = epsilon_total(pair, rounds=rounds, delta=delta)
        # pessimistic: never below the exact composition; the grid (a twentieth of a
        # standard deviation, at most eps0 / 8) keeps it within 3% (+ 1e-3 absolute)
        assert ours >= truth
        assert ours <= truth * 1.03 + 1e-3


def test_single_batch_pld_is_pessimistic_for_the_curve() -> None:
    pair = BlanketPair(n=40, exp_epsilon0=math.exp(1.2), s=2, t=7)
    pld = blanket_pld(pair, delta_floor=1e-9)
    exact = exact_loss_pmf(pair)
    for eps in (0.0, 0.05, 0.2, 0.5, 1.0):
        assert pld.delta_for_epsilon(eps) >= exact_delta(exact, eps)
    # one batch: the PLD's epsilon is the single-batch bound up to its grid
    single = blanket_epsilon(pair, delta=1e-6, rtol=1e-9)
    assert single <= epsilon_total(pair, rounds=1, delta=1e-6) <= single * 1.02


def test_reference_composition_blanket_tsv() -> None:
    """Within 1% of the reference (dp_accounting on the exact counts, 1e-4 rounding up; ours
    is connect-the-dots on a grid of 1/20 of a standard deviation: both pessimistic)."""
    rows = reference_rows("composition-blanket.tsv")
    assert len(rows) == 6
    for row in rows:
        pair = BlanketPair(
            n=int(row["n"]),
            exp_epsilon0=math.exp(float(row["eps0"])),
            s=int(row["s"]),
            t=int(row["t"]),
        )
        ours = epsilon_total(pair, rounds=int(row["rounds"]), delta=float(row["delta"]))
        assert ours == pytest.approx(float(row["eps_total"]), rel=0.01), row


def test_monotone_in_rounds_and_n() -> None:
    p = math.exp(1.0)
    by_rounds = [
        epsilon_total(BlanketPair(n=1000, exp_epsilon0=p, s=2, t=8), rounds=t, delta=1e-6)
        for t in (1, 2, 5, 20, 100)
    ]
    assert by_rounds == sorted(by_rounds)
    assert by_rounds[-1] <= 100 * 1.0
    by_n = [
        epsilon_total(BlanketPair(n=n, exp_epsilon0=p, s=2, t=8), rounds=10, delta=1e-6)
        for n in (100, 1_000, 10_000, 100_000)
    ]
    assert by_n == sorted(by_n, reverse=True)


def test_mixed_batch_sizes_between_the_uniform_ones() -> None:
    p = math.exp(1.0)
    small = BlanketPair(n=500, exp_epsilon0=p, s=2, t=8)
    large = BlanketPair(n=5_000, exp_epsilon0=p, s=2, t=8)
    mixed = epsilon_total_batches(pairs=[small, large, small, large], delta=1e-6)
    assert epsilon_total(large, rounds=4, delta=1e-6) <= mixed
    assert mixed <= epsilon_total(small, rounds=4, delta=1e-6)


def test_validation() -> None:
    pair = BlanketPair(n=100, exp_epsilon0=2.0, s=1, t=3)
    with pytest.raises(ValueError, match="n must be >= 1"):
        epsilon_total(pair, rounds=0, delta=1e-6)
    with pytest.raises(ValueError, match="delta must be in"):
        epsilon_total(pair, rounds=3, delta=0.0)
    with pytest.raises(ValueError, match="pairs must not be empty"):
        epsilon_total_batches(pairs=[], delta=1e-6)


def test_adding_a_batch_reuses_the_cached_curve() -> None:
    """A service adding one batch at a time pays for the certified curve only for a new
    batch size (or a lower floor); composing is cheap."""
    p = math.exp(1.0)
    sizes = [700, 900, 700, 900, 700]
    pairs = [BlanketPair(n=n, exp_epsilon0=p, s=2, t=8) for n in sizes]
    first = epsilon_total_batches(pairs=pairs, delta=1e-6)
    before = {pair: len(_curve(pair).deltas) for pair in set(pairs)}
    again = epsilon_total_batches(pairs=[*pairs, pairs[0]], delta=1e-6)  # 6 batches: same floor
    assert {pair: len(_curve(pair).deltas) for pair in set(pairs)} == before
    assert again >= first


def _clear_composition_caches() -> None:
    for cached in (
        composition._pair_pld,
        composition._square,
        composition._power_cached,
        composition._product,
    ):
        cached.cache_clear()


def test_a_ledger_adding_rounds_gets_what_a_cold_start_gets() -> None:
    """The composition is cached in parts keyed by what they are, so a history reached one
    round at a time (every count crossing powers of two, a new size half way) gives exactly
    what a fresh process computes for it, and one more round recomputes only the nodes
    above the changed size (one leaf, as many inner nodes as the tree is deep)."""
    p = math.exp(1.0)
    sizes = [600, 800, 1000, 1200, 1400]
    history = [sizes[i % 4] for i in range(40)] + [sizes[4]] * 9
    counts: dict[BlanketPair, int] = {}
    live = []
    for n in history:
        pair = BlanketPair(n=n, exp_epsilon0=p, s=2, t=8)
        counts[pair] = counts.get(pair, 0) + 1
        live.append(epsilon_total_counts(dict(counts), delta=1e-6))
    _clear_composition_caches()
    cold = epsilon_total_counts(dict(counts), delta=1e-6)
    assert cold == live[-1]
    # 49 -> 50 rounds (no power of two crossed), one more round of the last size
    before = composition._product.cache_info().misses
    counts[BlanketPair(n=sizes[4], exp_epsilon0=p, s=2, t=8)] += 1
    epsilon_total_counts(dict(counts), delta=1e-6)
    depth = math.ceil(math.log2(len(sizes)))
    assert composition._product.cache_info().misses - before <= depth + 1


def _dp_accounting_pld(pld: ComposedPLD) -> privacy_loss_distribution.PrivacyLossDistribution:
    """The same masses as a dp_accounting PLD (an independent composition and query)."""
    losses = {pld.lower + i: float(m) for i, m in enumerate(pld.probs) if m > 0}
    pmf = pld_pmf.create_pmf(
        losses, discretization=pld.spacing, infinity_mass=pld.infinity, pessimistic_estimate=True
    )
    return privacy_loss_distribution.PrivacyLossDistribution(pmf)


def test_connect_the_dots_agrees_with_dp_accounting() -> None:
    """Our extended-precision Algorithm 1 against dp_accounting's on the same points."""
    pair = BlanketPair(n=2_000, exp_epsilon0=math.exp(1.0), s=2, t=8)
    ours = blanket_pld(pair, delta_floor=1e-12)
    indices, deltas = _curve(pair).points(1e-12)
    h = ours.spacing
    top = math.ceil(pair.epsilon0 / h)
    grid = [*indices, top]
    upper = np.minimum.accumulate([*deltas, 0.0])
    eps = np.asarray(grid[1:]) * h
    lower = -np.expm1(-eps) + np.exp(-eps) * upper[1:]
    theirs = pld_pmf.create_pmf_pessimistic_connect_dots(
        h,
        [*(-np.asarray(grid[1:])[::-1]).tolist(), *grid],
        [*np.minimum(1.0, lower[::-1]).tolist(), *upper.tolist()],
    )
    # the same curve, at the points and between them (ours adds its rounding budget: 1e-12
    # relative, and at most the hull's lowering where a point was above it)
    for e in [*(k * h for k in grid), *np.linspace(0.0, pair.epsilon0, 37)]:
        ref = float(theirs.get_delta_for_epsilon(float(e)))
        assert ours.delta_for_epsilon(float(e)) == pytest.approx(ref, rel=1e-9, abs=1e-16)


@pytest.mark.parametrize(("n", "rounds"), [(1_000, 100), (20_000, 1_000)])
def test_composition_agrees_with_dp_accounting_where_float64_suffices(n: int, rounds: int) -> None:
    pair = BlanketPair(n=n, exp_epsilon0=math.exp(1.0), s=2, t=8)
    pld = blanket_pld(pair, delta_floor=1e-13)
    ours = compose([(pld, rounds)])
    theirs = _dp_accounting_pld(pld).self_compose(rounds)
    for delta in (1e-3, 1e-6):
        mine = ours.epsilon_for_delta(delta)
        assert mine == pytest.approx(float(theirs.get_epsilon_for_delta(delta)), rel=1e-5)
        assert ours.delta_for_epsilon(mine) <= delta


def test_the_error_budget_covers_the_extended_precision_fft() -> None:
    """Against a direct (non-negative, so accurate) convolution: the FFT's error, the cut
    ends and the roundings stay within the budget, far in the tail too."""
    pair = BlanketPair(n=60, exp_epsilon0=math.exp(1.0), s=1, t=3)
    pld = blanket_pld(pair, delta_floor=1e-18)
    rounds = 37
    ours = compose([(pld, rounds)], cut=1e-40)
    direct = pld.probs.copy()
    for _ in range(rounds - 1):
        direct = np.convolve(direct, pld.probs)
    lower = pld.lower * rounds
    losses = (np.arange(direct.size) + lower) * np.longdouble(pld.spacing)
    assert ours.error > 0
    checked = 0
    for eps in np.linspace(0.0, 0.95 * rounds * pair.epsilon0, 40):
        above = losses > eps
        exact = float(np.dot(-np.expm1(np.longdouble(eps) - losses[above]), direct[above]))
        assert ours.delta_for_epsilon(float(eps)) >= exact
        if 0 < exact < 1e-15:
            checked += 1
    assert checked >= 5
    # the budget is a worst-case bound, far above the error met here and far below the
    # deltas deployments ask for
    assert ours.error < 1e-13


def test_epsilon_for_delta_is_the_smallest_checked_value() -> None:
    pair = BlanketPair(n=5_000, exp_epsilon0=math.exp(0.8), s=2, t=8)
    composed = compose([(blanket_pld(pair, delta_floor=1e-14), 300)])
    for delta in (1e-2, 1e-5, 1e-9, 1e-12):
        eps = composed.epsilon_for_delta(delta)
        assert composed.delta_for_epsilon(eps) <= delta
        assert composed.delta_for_epsilon(eps * (1 - 1e-6) - 1e-9) > delta


@pytest.mark.parametrize("delta", [1e-8, 1e-12, 1e-20])
def test_composition_finishes_for_any_delta_with_few_evaluations(delta: float) -> None:
    """The issue's stall: the grid had to reach 1e-3 delta / 2^ceil(log2 T) and the curve
    stopped falling above it. Now the points end at (eps0, 0) and the certified curve falls
    far below any such floor: a handful of evaluations, whatever delta. Below the
    floating-point budget (about 1e-14 here) the answer is basic composition: certified,
    finished, and useless, as it should be."""
    pair = BlanketPair(n=50_000, exp_epsilon0=math.exp(1.0), s=8, t=32)
    total = epsilon_total(pair, rounds=1_000, delta=delta)
    basic = 1_000 * pair.epsilon0
    assert 0 < total <= basic
    if delta >= 1e-12:
        assert total < 0.01 * basic
    assert len(_curve(pair).deltas) <= 40
    looser = epsilon_total(pair, rounds=1_000, delta=delta * 100)
    assert looser <= total


@pytest.mark.parametrize("n", [500_000, 622_592, 1_000_000, 2_000_000])
def test_the_pld_of_a_large_batch_passes_through_fresh_evaluations_of_its_points(n: int) -> None:
    """At every point of a live ledger's schedule, the tail's sparse points (past a delta of
    1e-10) included, the per-batch PLD is at or above a fresh evaluation of the certified
    curve (with the floor of 1,000 rounds at delta 1e-8). The exact enumerations above cannot
    reach sizes whose schedule has a sparse tail; this catches a cached, stored or scheduled
    point that is not the engine's value (a deliberately halved tail passed every other
    test of the bound). On these sizes the engine's values are convex, so the hull keeps
    every point and the PLD passes through each, up to its error budget."""
    pair = blanket_pair_for_spec(MechanismSpec(mechanism="coco", d=128, s=8, epsilon=1.0), n=n)
    floor = 1e-3 * 1e-8 / 1024
    curve = _curve(pair)
    indices, deltas = curve.points(floor)
    assert any(d <= 1e-10 for d in deltas[:-1])  # the sparse tail is reached
    pld = blanket_pld(pair, delta_floor=floor)
    fresh = blanket_delta_curve_and_floor(pair, tail=1e-20)
    for k in indices:
        eps = k * curve.step
        if eps >= pair.epsilon0:
            continue
        value, _ = fresh(eps)
        assert pld.delta_for_epsilon(eps) >= value * (1 - 1e-12), (n, k, eps)
