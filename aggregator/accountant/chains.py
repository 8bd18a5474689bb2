"""Binomial cdf and pmf values at the blanket engine's run boundaries, chained across rows.

The engine of :mod:`aggregator.accountant.blanket` needs, for every run ``(K, k)`` of one
``eps``, the cdf of the neutral count ``Bin(m, q)`` (``m = n - K``) at the run's end
``x = ceil((k - tau0(K)) / tau1) - 1``: tens of thousands of values per ``eps``, which
were three quarters of its time as one special-function value each. They are not
independent. With ``c0 = 1`` (``t >= 2s``), ``tau0(K + 2) - tau0(K) - 1 = -(p + 1) tau1``,
so the run ``(K + 2, k + 1)`` ends ``p + 1`` (rounded: 3 or 4 at ``eps0 = 1``) below the
run ``(K, k)``: runs with the same ``2k - K`` (a *diagonal*) two rows apart end a few
values apart, and their cdf values differ by a short sum of pmf values.

The identity (exact): ``Bin(m, q) = Bin(m - 2, q) + Bin(2, q)``, so for ``x' <= x - 2``

    F_m(x) - F_(m-2)(x') = D = sum_{y = x'+1}^{x} b_(m-2)(y) Pr[Bin(2, q) <= x - y],

a sum of non-negative terms (the weights are ``(1 - q)^2``, ``1 - q^2`` and ``1``). The
same ``D`` is ``G_(m-2)(x') - G_m(x)`` for the survival function ``G = 1 - F``. So along a
diagonal (``K`` rising), the sf grows by ``D`` and the cdf falls by it: above the mean
(where the engine uses ``-G``) a chain starts from one special-function value at its first
point and adds the ``D``s forwards; below the mean (where it uses ``F``) from one at its
last point, adding them backwards. Every value is an anchor plus non-negative terms:
nothing cancels. The pmf values in ``D`` come from the next point's pmf by the ratio
``b(y) = b(y - 1) (m' - y + 1) / y * q / (1 - q)``, and the pmf values themselves are
chained the same way: ``b_m(x) = b_(m-2)(x') R`` with ``R`` the product of those ratios
up to ``x`` and ``b_m(x) / b_(m-2)(x) = m (m - 1) (1 - q)^2 / ((m - x)(m - x - 1))``, one
Boost value per :data:`PMF_SPAN` points (at the end the chain's cdf starts from).

A link is used only where it is exact and well conditioned: same diagonal, rows ``K`` and
``K + 2``, both points on the same side of the mean (the engine's own test ``x < m q``),
``2 <= x - x' <= CAP``, ``0 <= x' < x <= m - 2`` and pmf values and sums far from
underflow; elsewhere a chain ends and the next point is an anchor (a Collision pair with
``t < 2s``, whose diagonal step is below 2, gets one special-function value per point, as
before).

Error bound (relative to the value, which is what the engine's budget multiplies): the
anchors carry the special functions' budget ``rel``; each ratio step adds at most ``5 u``
(a quotient of exact integers, the constant ``q / (1 - q)`` with two roundings, two
products), so a link's ``R`` is within ``(5 CAP + 7) u`` (the two-trial factor: two
quotients, their product, ``(1 - q)^2`` and two products) and a chained pmf value,
``PMF_SPAN`` links at most from its anchor (a division and a product more per link),
within ``rel + PMF_SPAN (5 CAP + 9) u``; the weights and their products add ``4 u`` and the
sum of at most ``CAP`` terms ``CAP u``, so a ``D`` is within that plus ``(6 CAP + 5) u``;
the running sum of ``L`` non-negative terms adds ``L u`` (recursive summation).
:func:`chained_lower_cdf` returns ``1.01 (PMF_SPAN (5 CAP + 9) + 6 CAP + 5 + L_max) u`` as
the extra relative error of its values (cdf and pmf), to be added to ``rel`` (the factor
covers the second-order terms for ``rel <= 1e-3``).
"""

from __future__ import annotations

from typing import Final

import numpy as np
from numpy.typing import NDArray
from scipy import stats

from aggregator.accountant._accumulate import cumulative_product

__all__ = ["CAP", "PMF_SPAN", "chained_lower_cdf", "lower_cdf", "shifted_cdf"]

FloatArray = NDArray[np.float64]

CAP: Final = 8
"""Longest step ``x - x'`` of a link (``p + 1`` rounded up: ``eps0`` up to about 1.9)."""
PMF_SPAN: Final = 32
"""Longest chain of pmf values from one Boost value (their ratios' rounding grows with it,
and every value's budget carries the longest)."""
_TINY: Final = 2.0**-900
"""A link needs pmf values and sums above this (no subnormal products)."""
_U: Final = 2.0**-53


def lower_cdf(x: FloatArray, m: FloatArray, q: float) -> FloatArray:
    """``Pr[Bin(m, q) <= x] - [x >= m q]``: the cdf below the mean, minus the sf above it
    (one Boost value each)."""
    out = np.empty_like(x)
    below = x < m * q
    out[below] = stats.binom.cdf(x[below], m[below], q)
    out[~below] = -stats.binom.sf(x[~below], m[~below], q)
    return out


def shifted_cdf(
    x: FloatArray, m: FloatArray, q: float, c: FloatArray, pmf: FloatArray | None = None
) -> tuple[FloatArray, FloatArray]:
    """``lower_cdf(x - 1, m - 1, q)`` from ``c = lower_cdf(x, m, q)`` and one pmf value
    (Boost's, computed here or given as ``pmf``: the same values),
    with a magnitude ``mag`` such that its error is at most ``rel * mag`` whenever ``c``'s
    and the pmf's are at most ``rel`` relative (``rel >= 1e-15``).

    With ``F_m``, ``G_m = 1 - F_m`` the cdf and sf of ``Bin(m, q)`` and ``b_m`` its pmf:
    ``F_m(x) = (1 - q) F_(m-1)(x) + q F_(m-1)(x - 1)`` (the last trial fails or succeeds)
    and ``F_(m-1)(x) - F_(m-1)(x - 1) = b_(m-1)(x) = b_m(x) (m - x) / (m (1 - q))`` give
    ``F_(m-1)(x - 1) = F_m(x) - t`` and ``G_(m-1)(x - 1) = G_m(x) + t`` with ``t = b_m(x)
    (m - x) / m`` (no cancellation against ``1``). Below the mean (``x < m q``, so also
    ``x - 1 < (m - 1) q``) both sides are cdf values, above it (``x - 1 >= (m - 1) q``,
    so also ``x >= m q``) both are minus sf values: in both cases the result is ``c - t``,
    in error by at most ``rel |c| + (rel + 2u) t + u |c - t|`` (the pmf value, two
    roundings of ``t``, one of the difference), which ``mag = (|c| + t)(1 + 1e-5)``
    covers. The few values in between (``m q <= x < m q + 1 - q``, next to the mean) are
    computed directly, as is ``m < 1`` (then the value is 0). The pmf costs a fifth of a
    cdf value at ``m = 10^6``, which is why the engine shifts its cdf values rather than
    computing the second set."""
    direct = (m < 1.0) | ((x >= m * q) & (x - 1.0 < (m - 1.0) * q))
    where = np.flatnonzero(direct)
    if pmf is not None and where.size < x.size and not np.any(m[where] < 1.0):
        # (the engine's case, a few values next to the mean: the shifted formula everywhere,
        # the same arithmetic as below without the masks, then those few overwritten)
        t = pmf * ((m - x) / m)
        out, mag = c - t, (np.abs(c) + t) * (1.0 + 1e-5)
        if where.size:
            out[where] = lower_cdf(x[where] - 1.0, m[where] - 1.0, q)
            mag[where] = np.abs(out[where])
        return out, mag
    if not where.size:  # (the usual case: the same arithmetic without the masks)
        b = np.asarray(stats.binom.pmf(x, m, q)) if pmf is None else pmf
        t = b * ((m - x) / m)
        return c - t, (np.abs(c) + t) * (1.0 + 1e-5)
    out = np.empty_like(c)
    mag = np.empty_like(c)
    shift = ~direct
    xs, ms = x[shift], m[shift]
    b = np.asarray(stats.binom.pmf(xs, ms, q)) if pmf is None else pmf[shift]
    t = b * ((ms - xs) / ms)
    out[shift] = c[shift] - t
    mag[shift] = (np.abs(c[shift]) + t) * (1.0 + 1e-5)
    if np.any(direct):
        m1 = np.maximum(m[direct] - 1.0, 0.0)
        out[direct] = lower_cdf(x[direct] - 1.0, m1, q)
        mag[direct] = np.abs(out[direct])
    return out, mag


def _link_factors(
    x: FloatArray, x_next: FloatArray, m_next: FloatArray, q: float
) -> tuple[FloatArray, FloatArray]:
    """``(W, R)`` of each link from ``(x, m_next + 2)`` to ``(x_next, m_next)``: the link's
    ``D = b_(m_next)(x_next) W`` (module docstring) and ``R = b_(m_next + 2)(x) /
    b_(m_next)(x_next)``, both from ratios of exact integers; requires ``2 <= x - x_next
    <= CAP`` and ``x <= m_next``."""
    rho = q / (1.0 - q)
    one_minus = 1.0 - q
    weights = (one_minus * one_minus, one_minus * (1.0 + q))
    step = x - x_next
    ratio = np.ones_like(x)  # b(y) / b(x_next) for y = x_next + j
    total = np.zeros_like(x)
    steps = step.astype(np.int64)
    by_gap = np.asarray((0.0, weights[0], weights[1], 1.0))
    shortest = int(step.min())
    for j in range(1, int(step.max()) + 1):
        y = x_next + j
        factor = (m_next - y + 1.0) / y
        if j <= shortest:  # (every link: the same values without the masks)
            ratio = ratio * factor * rho
        else:
            ratio = np.where(step >= j, ratio * factor * rho, ratio)
        if j <= shortest - 2:  # x - y >= 2 for every link: weight 1
            total += ratio
            continue
        # the weight of x - y (0 below 0, then (1 - q)^2, 1 - q^2, 1 from 2 on)
        total += ratio * by_gap[np.clip(steps - j, -1, 2) + 1]
    # b_(m + 2)(x) = b_m(x) (m + 2)(m + 1) (1 - q)^2 / ((m + 2 - x)(m + 1 - x)), m = m_next
    two = ((m_next + 2.0) / (m_next + 2.0 - x)) * ((m_next + 1.0) / (m_next + 1.0 - x))
    return total, ratio * (two * weights[0])


def _segments(link: NDArray[np.bool_]) -> tuple[NDArray[np.int64], NDArray[np.int64]]:
    """``[start, stop)`` of the maximal runs of links (in sorted order)."""
    starts = np.flatnonzero(np.concatenate(([True], ~link)))
    stops = np.concatenate((starts[1:], [link.size + 1]))
    return starts, stops


def _chained_pmf(  # noqa: PLR0917 (private helper)
    xs: FloatArray,
    ms: FloatArray,
    q: float,
    below: NDArray[np.bool_],
    ratios: FloatArray,
    starts: NDArray[np.int64],
    stops: NDArray[np.int64],
) -> FloatArray:
    """``b_m(x)`` at every (sorted) point: one Boost value per segment, at the end its
    cdf chain starts from (the last point below the mean, the first above), the rest by
    the links' ratios ``b_i = b_(i+1) R_i``."""
    low = below[starts]
    anchors = np.where(low, stops - 1, starts)
    first = np.zeros(xs.size, dtype=np.int64)
    first[starts] = 1
    seg = np.cumsum(first) - 1  # segment of each point
    index = np.arange(xs.size)
    # position along the chain, from its anchor: back from the last point below the mean,
    # on from the first above
    pos = np.where(low[seg], stops[seg] - 1 - index, index - starts[seg])
    factors = np.ones_like(xs)
    back = low[seg] & (pos >= 1)  # b_i = b_(i+1) R_i
    factors[back] = ratios[index[back]]
    on = ~low[seg] & (pos >= 1)  # b_i = b_(i-1) / R_(i-1)
    factors[on] = 1.0 / ratios[index[on] - 1]
    factors[anchors] = stats.binom.pmf(xs[anchors], ms[anchors], q)
    grid = np.ones((starts.size, int(pos.max()) + 1))
    grid[seg, pos] = factors
    pmf: FloatArray = cumulative_product(grid)[seg, pos]
    return pmf


def _diagonal_order(diagonal: FloatArray, big_k: FloatArray) -> NDArray[np.intp]:
    """The points sorted by diagonal, then ``K``. The engine's points come sorted by ``K``
    and span a few hundred diagonals, so a stable sort of the diagonals as 16-bit integers
    (numpy's radix sort) does it in linear time; otherwise a lexicographic sort."""
    low, high = float(diagonal.min()), float(diagonal.max())
    if high - low < 2**15 and np.all(big_k[1:] >= big_k[:-1]):
        order: NDArray[np.intp] = np.argsort((diagonal - low).astype(np.int16), kind="stable")
        return order
    return np.lexsort((big_k, diagonal))


def chained_lower_cdf(
    x: FloatArray, m: FloatArray, q: float, diagonal: FloatArray, big_k: FloatArray
) -> tuple[FloatArray, FloatArray, float]:
    """``(lower_cdf(x, m, q), pmf, extra)`` at every point, with ``pmf = b_m(x)``, both
    chained along diagonals (module docstring); ``extra`` is the relative error the chains
    add to the special functions' budget, for both.

    ``diagonal`` is ``2k - K`` of each point's run, ``big_k`` its ``K`` (``m = n - K``)."""
    if x.size == 0:
        return np.empty_like(x), np.empty_like(x), 0.0
    order = _diagonal_order(diagonal, big_k)
    xs, ms, ds, ks = x[order], m[order], diagonal[order], big_k[order]
    below = xs < ms * q
    link = (
        (ds[1:] == ds[:-1])
        & (ks[1:] == ks[:-1] + 2.0)
        & (ms[1:] == ms[:-1] - 2.0)
        & (below[1:] == below[:-1])
        & (xs[:-1] - xs[1:] >= 2.0)
        & (xs[:-1] - xs[1:] <= CAP)
        & (xs[1:] >= 0.0)
        & (xs[:-1] <= ms[1:])
    )
    weights = np.zeros(link.size)
    ratios = np.ones(link.size)
    if np.any(link):
        weights[link], ratios[link] = _link_factors(xs[:-1][link], xs[1:][link], ms[1:][link], q)
    # the pmf's chains are at most PMF_SPAN points long (one more Boost value each)
    span = np.arange(link.size) % PMF_SPAN != PMF_SPAN - 1
    while True:  # a link whose values come near underflow is cut, and the chains redone
        starts, stops = _segments(link)
        pmf = _chained_pmf(xs, ms, q, below, ratios, *_segments(link & span))
        sums = pmf[1:] * weights
        cut = link & ((pmf[1:] <= _TINY) | (pmf[:-1] <= _TINY) | (sums <= _TINY))
        if not np.any(cut):
            break
        link &= ~cut
    seg_below = below[starts]
    anchors = np.where(seg_below, stops - 1, starts)  # last point below, first above
    values = np.empty_like(xs)
    values[anchors] = np.abs(lower_cdf(xs[anchors], ms[anchors], q))
    longest = 1
    for start, stop, low in zip(starts.tolist(), stops.tolist(), seg_below.tolist(), strict=True):
        if stop - start < 2:
            continue
        longest = max(longest, stop - start)
        if low:  # F at i = F at i + 1 + D_i, from the last point back
            terms = np.concatenate(([values[stop - 1]], sums[start : stop - 1][::-1]))
            values[start:stop] = np.cumsum(terms)[::-1]
        else:  # G at i + 1 = G at i + D_i, from the first point on
            terms = np.concatenate(([values[start]], sums[start : stop - 1]))
            values[start:stop] = np.cumsum(terms)
    out = np.empty_like(x)
    pmf_out = np.empty_like(x)
    out[order] = np.where(below, values, -values)
    pmf_out[order] = pmf
    extra = 1.01 * (PMF_SPAN * (5 * CAP + 9) + 6 * CAP + 5 + longest) * _U
    return out, pmf_out, extra
