"""Central privacy of a device over many shuffled batches: ``epsilon_total``.

Why it composes
---------------
The blanket pair ``(P, Q)`` of :mod:`aggregator.accountant.blanket` dominates the shuffled
mechanism of one batch for *every* eps, in both directions (design note, section 5). A
device that takes part in ``T`` batches of sizes ``n_1 .. n_T`` is therefore dominated by
the product of the ``T`` pairs (Zhu, Dong, Wang, AISTATS 2022: dominating pairs compose,
adaptively), whose privacy loss distribution (PLD) is the convolution of the per-batch
PLDs.

Each batch's PLD is :func:`~aggregator.accountant.batch_pld.blanket_pld` (pessimistic
connect-the-dots on certified points of the blanket curve); they are composed by
extended-precision FFT convolutions with an error budget
(:mod:`aggregator.accountant.convolution`), so ``epsilon_total`` is a certified upper bound
with the rounding accounted, never above basic composition ``sum eps0``. The floor down to
which each batch's curve is followed is ``1e-3 delta / T`` (``T`` rounded up to a power of
two), the cuts of all the convolutions together move at most ``1e-7 delta``.

A live ledger
-------------
A ledger asks again after every round, with one count changed. :func:`epsilon_total_counts`
therefore composes in cached parts, each a function of its key alone (the result never
depends on what was asked before): each pair's PLD for a floor and grid, its squarings
``2^i``, its power for a count (the squarings of the count's bits, lowest first), and a
balanced tree of convolutions over the pairs in a fixed order (by size), each node keyed by
its leaves and their counts. One more round of a size already seen recomputes that size's
power (at most one convolution per bit of its count, from cached squarings) and the nodes
above it (as many as the tree is deep, 6 for 33 sizes): tens of milliseconds where the whole
composition takes about half a second. The cut is set from a bound on the number of convolutions
that depends only on the number of sizes and the number of rounds rounded up to a power of
two (:func:`_convolutions_bound`), so the floor and the cut move only when a size appears or
the number of rounds crosses a power of two; then the parts are recomputed (the curve's
points stay cached).


The curve's points are most of the cost of a first composition (0.1-0.3 s per size between
5e5 and 2e6 reports, the composition itself about half a second for 33 sizes), so the
accountant's process keeps them across a restart (:mod:`aggregator.accountant.batch_pld`,
:mod:`aggregator.ledger.curve_file`).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterable, Mapping, Sequence
from fractions import Fraction
from typing import Final

from aggregator.accountant._checks import check_delta, check_n, check_real
from aggregator.accountant.batch_pld import blanket_pld, clear_curves, grid_spacing, pair_order
from aggregator.accountant.blanket import BlanketPair, blanket_epsilon
from aggregator.accountant.convolution import CUT, ComposedPLD, convolve

__all__ = [
    "clear_caches",
    "epsilon_total",
    "epsilon_total_batches",
    "epsilon_total_counts",
]

_INFINITY_FRACTION: Final = 1e-3
"""The caller's floor: points stop where delta(eps) <= this fraction of delta / batches."""
_CUT_FRACTION: Final = 1e-7
"""All the cuts of one composition move at most this fraction of delta to +inf."""


def epsilon_total_batches(*, pairs: Sequence[BlanketPair], delta: float) -> float:
    """Composed central epsilon at ``delta`` of a device present in every batch of ``pairs``
    (one :class:`BlanketPair` per batch, e.g. batches of different sizes): the
    :func:`epsilon_total_counts` of their multiset."""
    if not pairs:
        raise ValueError("pairs must not be empty")
    counts: dict[BlanketPair, int] = {}
    for pair in pairs:
        counts[pair] = counts.get(pair, 0) + 1
    return epsilon_total_counts(counts, delta=delta)


def epsilon_total_counts(counts: Mapping[BlanketPair, int], *, delta: float) -> float:
    """Composed central epsilon at ``delta`` of a device present in ``count`` batches of each
    ``pair`` of ``counts`` (module docstring for what is certified).

    The certified curve's points are cached per pair (up to 256 pairs), so a caller that
    adds one batch at a time pays for new points only when a new pair appears or the floor
    drops (it moves at powers of two of the batch count); the composition is cached in
    parts (module docstring, "A live ledger"), so one more batch costs a few convolutions.
    """
    delta = check_delta(delta)
    counts = {pair: count for pair, count in counts.items() if count > 0}
    if not counts:
        raise ValueError("counts must hold at least one batch")
    total_count = sum(counts.values())
    floor = _INFINITY_FRACTION * delta / 2.0 ** math.ceil(math.log2(total_count))
    spacing = min(grid_spacing(pair) for pair in counts)
    if total_count == 1:  # one batch: the single-batch bound is exact where the PLD is not
        (pair,) = counts
        single = blanket_epsilon(pair, delta=delta)
    else:
        single = math.inf
    cut = max(CUT, _CUT_FRACTION * delta / _convolutions_bound(len(counts), total_count))
    basic = _sum_upper(Fraction(pair.epsilon0) * count for pair, count in counts.items())
    leaves = tuple(sorted(counts.items(), key=lambda item: pair_order(item[0])))
    composed = _product(leaves, floor, spacing, cut)
    return min(composed.epsilon_for_delta(delta), basic, single)


def _convolutions_bound(pairs: int, total_count: int) -> int:
    """An upper bound on the convolutions composing ``pairs`` counts summing to
    ``total_count`` (at most ``2 bitlength(count)`` for each power, ``pairs - 1`` for the
    tree): ``bitlength(c) <= log2 c + 1`` and, ``log`` being concave, ``sum log2 c_i <= L
    log2(T / L)``; ``T`` is rounded up to a power of two, so the bound (and the cut it sets)
    moves only when a size appears or the number of rounds crosses a power of two, not
    whenever one count does (which would recompute every cached part)."""
    rounded = 2 ** math.ceil(math.log2(total_count))
    return math.ceil(2 * pairs * (math.log2(rounded / pairs) + 1.0)) + pairs + 1


# The composition of a history, cached in parts so that a ledger adding one round pays for
# a few convolutions (module docstring, "A live ledger"). Every cached value is a function
# of its key alone, so the result never depends on what was computed before.


@functools.lru_cache(maxsize=256)
def _pair_pld(pair: BlanketPair, floor: float, spacing: float) -> ComposedPLD:
    return blanket_pld(pair, delta_floor=floor, spacing=spacing)


@functools.lru_cache(maxsize=1024)
def _square(pair: BlanketPair, floor: float, spacing: float, cut: float, i: int) -> ComposedPLD:
    """The pair's PLD composed ``2^i`` times, by squaring."""
    if i == 0:
        return _pair_pld(pair, floor, spacing)
    half = _square(pair, floor, spacing, cut, i - 1)
    return convolve(half, half, cut)


@functools.lru_cache(maxsize=512)
def _power_cached(
    pair: BlanketPair, count: int, floor: float, spacing: float, cut: float
) -> ComposedPLD:
    """``count`` copies of the pair's PLD: the products of its squarings for the bits of
    ``count``, lowest first (as :func:`~aggregator.accountant.convolution.power`)."""
    result: ComposedPLD | None = None
    for i in range(count.bit_length()):
        if count >> i & 1:
            base = _square(pair, floor, spacing, cut, i)
            result = base if result is None else convolve(result, base, cut)
    assert result is not None
    return result


@functools.lru_cache(maxsize=512)
def _product(
    leaves: tuple[tuple[BlanketPair, int], ...], floor: float, spacing: float, cut: float
) -> ComposedPLD:
    """The composition of ``leaves`` (pairs in a fixed order, with their counts) as a
    balanced tree of convolutions: a changed count recomputes only the nodes above it (as
    many convolutions as the tree is deep), a node's shape depends only on its leaves."""
    if len(leaves) == 1:
        ((pair, count),) = leaves
        return _power_cached(pair, count, floor, spacing, cut)
    mid = len(leaves) // 2
    left = _product(leaves[:mid], floor, spacing, cut)
    right = _product(leaves[mid:], floor, spacing, cut)
    return convolve(left, right, cut)


def _sum_upper(terms: Iterable[Fraction]) -> float:
    """The exact sum of ``terms`` rounded up to a float (basic composition is reported as
    an upper bound: a sum rounded to nearest may be an ulp below it)."""
    exact = sum(terms, Fraction(0))
    value = float(exact)
    return math.nextafter(value, math.inf) if Fraction(value) < exact else value


def epsilon_total(pair: BlanketPair, *, rounds: int, delta: float) -> float:
    """Composed central epsilon at ``delta`` of a device present in ``rounds`` batches of
    ``pair.n`` reports each (module docstring for what is certified). Non-decreasing in
    ``rounds``; at most ``rounds * eps0`` (basic composition of eps0-LDP reports)."""
    rounds = check_n(rounds)
    delta = check_real("delta", delta)
    return epsilon_total_batches(pairs=[pair] * rounds, delta=delta)


def clear_caches() -> None:
    """Forget every cached point and part (as a process that just started)."""
    clear_curves()
    for cached in (_pair_pld, _square, _power_cached, _product):
        cached.cache_clear()
