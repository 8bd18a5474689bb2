"""Central privacy of a device over many shuffled batches: ``epsilon_total``.

Why it composes
---------------
The blanket pair ``(P, Q)`` of :mod:`aggregator.accountant.blanket` dominates the shuffled
mechanism of one batch for *every* eps, in both directions (design note, section 5). A
device that takes part in ``T`` batches of sizes ``n_1 .. n_T`` is therefore dominated by
the product of the ``T`` pairs (Zhu, Dong, Wang, AISTATS 2022: dominating pairs compose,
adaptively), whose privacy loss distribution (PLD) is the convolution of the per-batch
PLDs.

One batch: a pessimistic PLD from certified points
--------------------------------------------------
A PLD is determined by its hockey-stick curve ``eps -> delta(eps)``, which is convex and
non-increasing in ``E = e^eps``. The certified values ``delta(eps_j) >= H_{e^eps_j}(P||Q)``
of :func:`~aggregator.accountant.blanket.blanket_delta_curve` are taken at points
``eps_j`` on a schedule in units of the loss's standard deviation
``sd = (p - 1) sqrt(2a / n)``: every quarter ``sd`` up to ``2 sd``, every half up to
``4 sd``, every ``sd`` beyond (rounded to the pair's grid step, a power of two near
``sd / 4``), until ``delta(eps_j) <= floor`` (the caller's, about ``1e-3 delta / T``), or
the curve is within four times its certificate's additive part, or ``eps_j >= eps0``. The
last point is always ``(eps0, 0)`` (rounded up to the grid): the likelihood ratio of the
pair is at most ``p = e^eps0``, so ``delta(eps0) = 0`` exactly. Negative losses come from
``H_{e^-eps}(P || Q) = 1 - e^-eps + e^-eps H_{e^eps}(Q || P)`` and the symmetry of the
pair. Then:

* the points are replaced by their lower convex hull in ``(E, delta)``: every hull point
  is a convex combination of points above the true convex curve, so it is above it too
  (and the masses below are non-negative);
* the PLD is the *pessimistic connect-the-dots* distribution on those points (Doroshenko,
  Ghazi, Kamath, Kumar, Manurangsi, PETS 2022, Algorithm 1): its curve passes through the
  points and is linear in ``E`` between them, above the true convex curve everywhere, so it
  dominates the pair. With the ``(eps0, 0)`` end point it has no infinity mass and the
  construction always ends: a curve that stops falling (the old certificate's floor) or a
  tiny ``delta`` only make it pessimistic, never stall it. The masses are computed in
  extended precision with an error budget (below).

Evaluations of the certified curve are the whole cost (up to ~0.15 s each at n = 10^6); they
are cached per pair and extended when a lower floor needs more points, so every call gets
the same points for the same floor whatever came before.

T batches: extended-precision convolution with an error budget
---------------------------------------------------------------
The composed PLD is computed here (dp_accounting's float64 FFT power understates ``delta``
by ~0.5% at ``delta = 1e-12``): repeated squaring and products of the per-batch arrays with
real FFTs in ``numpy.longdouble`` (64-bit significand on x86-64, ``u = 2^-64``), each array
carrying a bound ``e`` on the 1-norm of its error. For one convolution of computed ``a``
and ``b`` of length sum ``< N`` (``N`` the least power of two above it, no wrap-around), the
standard error model of the FFT (Higham, *Accuracy and Stability of Numerical Algorithms*,
Thm. 24.2: relative 2-norm error ``rho = log2(N) (mu + gamma_4 (sqrt 2 + mu))`` per
transform, twiddle factors accurate to ``mu ~ u``) gives
``||fl(a * b) - a * b||_2 <= (3 rho + 3u) max(|a|_1 |b|_2, |a|_2 |b|_1)``; twice that,
times ``sqrt(N)``, is added to the 1-norm budget, plus ``e_a |b|_1 + e_b |a|_1 + e_a e_b``
for the inputs' own errors. After each convolution, the ends holding little mass are
cut: the low end's mass moves up to the first entry kept, the high end's to the
infinity mass (both pessimistic: a larger loss never lowers ``delta``); together the cuts
of one composition move at most ``1e-7 delta``, and they also drop the rounding noise far
out in the tails, which would otherwise keep every array as long as the whole support. At the end
``delta(eps) <= computed delta(eps) + e`` (each loss's weight ``1 - e^(eps - l)`` is in
``[0, 1]``), and ``epsilon_total`` is the smallest ``eps`` at which
``computed delta(eps) + e <= delta`` was evaluated, found on the composed PLD exactly (a
closed form inside each grid interval, then checked). So the result is a certified upper
bound, with floating-point error accounted, not only "up to" it; it is never above basic
composition ``sum eps0``.

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
composition takes about a second. The cut is set from a bound on the number of convolutions
that depends only on the number of sizes and the number of rounds rounded up to a power of
two (:func:`_convolutions_bound`), so the floor and the cut move only when a size appears or
the number of rounds crosses a power of two; then the parts are recomputed (the curve's
points stay cached).

The curve's points are most of the cost of a first composition (about 0.4 s per size at
10^6 reports, the composition itself a few seconds for 33 sizes), and a function of the
pair and this module's constants alone, so the accountant's process also keeps them
across a restart, in a file beside the ledger (:mod:`aggregator.ledger.curve_file`). Here
that is :func:`curve_points` (what was evaluated), :func:`check_curve_points` and
:func:`recompute_curve_point` (what a file is checked with) and :func:`seed_curve_points`
(points read back, the same bits as computed: the result is the uncached one exactly).
"""

from __future__ import annotations

import collections
import functools
import math
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Final

import numpy as np
from numpy.typing import NDArray

from aggregator.accountant._checks import check_delta, check_n, check_real
from aggregator.accountant.blanket import (
    BlanketPair,
    blanket_delta_curve_and_floor,
    blanket_epsilon,
)

__all__ = [
    "CURVE_PINS",
    "ComposedPLD",
    "CurvePoints",
    "blanket_pld",
    "check_curve_points",
    "clear_caches",
    "compose",
    "curve_points",
    "epsilon_total",
    "epsilon_total_batches",
    "epsilon_total_counts",
    "grid_spacing",
    "recompute_curve_point",
    "seed_curve_points",
]

LongArray = NDArray[np.longdouble]

_SCHEDULE: Final = ((2.0, 0.25), (4.0, 0.5), (math.inf, 1.0))
"""(up to this many sd, step in sd) of the points of the certified curve."""
_INFINITY_FRACTION: Final = 1e-3
"""The caller's floor: points stop where delta(eps) <= this fraction of delta / batches."""
_PLATEAU: Final = 4.0
"""Points stop where the curve is within this factor of its certificate's additive part."""
_CURVE_TAIL: Final = 1e-20
"""Window tail of the curve's engine (4 p times it is added to every value)."""
_MIN_STEP_FRACTION: Final = 2.0**-18
"""The grid step is at least eps0 / 2^18 (PLD arrays of at most 2^19 entries)."""
_CUT: Final = 2.0**-110
"""Least mass cut from each end of a composed array (moved pessimistically)."""
_CUT_FRACTION: Final = 1e-7
"""All the cuts of one composition move at most this fraction of delta to +inf."""
_SUM_SLACK: Final = 1e-12
"""Relative slack on a sum of up to 2^19 non-negative extended-precision terms."""
_U: Final = float(np.finfo(np.longdouble).eps) / 2.0
"""Unit roundoff of the extended precision used (2^-64 on x86-64, 2^-53 where long
double is binary64: the budget then grows, the result stays certified)."""


def grid_spacing(pair: BlanketPair) -> float:
    """The pair's grid step: the largest power of two at most ``sd / 4`` and ``eps0 / 8``
    (``sd = (p - 1) sqrt(2a / n)``), at least ``eps0 / 2^18``. Powers of two nest, so pairs
    of different sizes compose on the finest of their grids."""
    eps0 = pair.epsilon0
    sd = math.expm1(eps0) * math.sqrt(2.0 * pair.hot / pair.n)
    step = min(sd / 4.0, eps0 / 8.0)
    step = max(step, eps0 * _MIN_STEP_FRACTION)
    return 2.0 ** math.floor(math.log2(step))


class _Curve:
    """The certified curve of one pair at its schedule's points, evaluated on demand and
    kept (each evaluation is deterministic, so the points of a floor never depend on what
    was asked before). Thread-safe; the curve's engine (its windows: megabytes at large n)
    is kept only while points are being added, the points for ever."""

    def __init__(self, pair: BlanketPair) -> None:
        self.pair = pair
        self.step = grid_spacing(pair)
        self.sd = math.expm1(pair.epsilon0) * math.sqrt(2.0 * pair.hot / pair.n)
        self.indices: list[int] = [0]  # points in units of step
        self.deltas: list[float] = []
        self.finished = False  # reached eps0 or the plateau: no point below adds anything
        self._lock = threading.Lock()

    def _next_index(self, k: int) -> int:
        z = k * self.step / self.sd
        for limit, step_sd in _SCHEDULE:
            if z < limit:
                return k + max(1, round(step_sd * self.sd / self.step))
        raise AssertionError("unreachable")  # the last limit is infinite

    def points(self, floor: float) -> tuple[list[int], list[float]]:
        """Indices (units of :attr:`step`) and certified deltas, up to the first point at
        or below ``floor`` (or the end)."""
        with self._lock:
            return self._points(floor)

    def _points(self, floor: float) -> tuple[list[int], list[float]]:
        eps0 = self.pair.epsilon0
        engine: Callable[[float], tuple[float, float]] | None = None
        while True:
            for j, value in enumerate(self.deltas):
                if value <= floor:
                    return self.indices[: j + 1], self.deltas[: j + 1]
            if self.finished:
                return list(self.indices), list(self.deltas)
            if len(self.deltas) == len(self.indices):
                self.indices.append(self._next_index(self.indices[-1]))
            eps = self.indices[len(self.deltas)] * self.step
            if eps < eps0:
                if engine is None:
                    engine = blanket_delta_curve_and_floor(self.pair, tail=_CURVE_TAIL)
                value, additive = engine(eps)
            else:
                value, additive = 0.0, 0.0
            self.deltas.append(min(1.0, value))
            if eps >= eps0 or value <= _PLATEAU * additive:
                self.finished = True

    def record(self) -> CurvePoints:
        """The points evaluated so far (a consistent copy)."""
        with self._lock:
            done = len(self.deltas)
            return CurvePoints(
                pair=self.pair,
                step=self.step,
                indices=tuple(self.indices[:done]),
                deltas=tuple(self.deltas),
                finished=self.finished,
            )

    def seed(self, points: CurvePoints) -> bool:
        """Take ``points`` (checked by :func:`check_curve_points`) if they extend what is
        evaluated; whether they did."""
        with self._lock:
            if len(points.deltas) <= len(self.deltas):
                return False
            self.indices = list(points.indices)
            self.deltas = list(points.deltas)
            self.finished = points.finished
            return True


_CURVES_KEPT: Final = 256
_curves: collections.OrderedDict[BlanketPair, _Curve] = collections.OrderedDict()
_curves_lock = threading.Lock()


def _curve(pair: BlanketPair) -> _Curve:
    """The pair's curve (the :data:`_CURVES_KEPT` most recently used are kept)."""
    with _curves_lock:
        curve = _curves.get(pair)
        if curve is None:
            curve = _curves[pair] = _Curve(pair)
            while len(_curves) > _CURVES_KEPT:
                _curves.popitem(last=False)
        else:
            _curves.move_to_end(pair)
        return curve


# The certified curve's points, kept across a restart (aggregator.ledger.curve_file): they
# are a deterministic function of the pair and the constants of CURVE_PINS alone, so points
# read back are the points this process would compute, bit for bit, and a cache can only
# save time. Nothing here reads or writes a file.


CURVE_PINS: Final = {
    "tail": _CURVE_TAIL,
    "plateau": _PLATEAU,
    "schedule": [[limit if math.isfinite(limit) else None, step] for limit, step in _SCHEDULE],
    "min_step_fraction": _MIN_STEP_FRACTION,
}
"""The constants the curve's points depend on besides the pair (a file of points records
them, and is not used under others)."""


@dataclass(frozen=True, slots=True)
class CurvePoints:
    """The certified curve of ``pair`` evaluated at its schedule's first points:
    ``deltas[j]`` at ``indices[j] * step``; ``finished`` once no later point adds anything
    (the ``(eps0, 0)`` end or the plateau was reached)."""

    pair: BlanketPair
    step: float
    indices: tuple[int, ...]
    deltas: tuple[float, ...]
    finished: bool


def curve_points(select: Callable[[BlanketPair], bool] | None = None) -> list[CurvePoints]:
    """The points evaluated so far of every kept pair (``select``: of those it accepts),
    in a fixed order (by pair); pairs with no point are left out."""
    with _curves_lock:
        curves = list(_curves.values())
    records = [curve.record() for curve in curves if select is None or select(curve.pair)]
    return sorted((r for r in records if r.deltas), key=lambda r: _order(r.pair))


def check_curve_points(points: CurvePoints) -> str | None:
    """What is wrong with ``points`` as the pair's curve (``None``: nothing), from their
    structure alone: the grid step, the indices of the schedule, values in ``[0, 1]``, the
    last point ``(eps0, 0)`` and ``finished`` only at the end. It cannot tell a value that
    is not the engine's (:func:`recompute_curve_point` can, one point at a time)."""
    curve = _Curve(points.pair)
    if points.step != curve.step:
        return f"grid step {points.step!r}, not {curve.step!r}"
    if not points.deltas or len(points.indices) != len(points.deltas):
        return "indices and deltas differ in number (or are empty)"
    index = 0
    eps0 = points.pair.epsilon0
    for j, (k, value) in enumerate(zip(points.indices, points.deltas, strict=True)):
        if j:
            index = curve._next_index(index)
        if k != index:
            return f"point {j} at index {k}, not the schedule's {index}"
        if not (isinstance(value, float) and 0.0 <= value <= 1.0):
            return f"point {j} holds {value!r}, not a delta in [0, 1]"
        at_end = k * curve.step >= eps0
        if at_end and (value != 0.0 or j != len(points.deltas) - 1):
            return f"point {j} is at or above eps0 but not the last, at delta 0"
    if points.indices[-1] * curve.step >= eps0 and not points.finished:
        return "ends at eps0 but is not finished"
    return None


def recompute_curve_point(points: CurvePoints, j: int) -> tuple[float, bool]:
    """Point ``j`` of the pair's curve computed afresh (its delta, and whether the curve
    would finish there): what :class:`_Curve` computes, bit for bit."""
    eps = points.indices[j] * points.step
    if eps >= points.pair.epsilon0:
        return 0.0, True
    value, additive = blanket_delta_curve_and_floor(points.pair, tail=_CURVE_TAIL)(eps)
    return min(1.0, value), value <= _PLATEAU * additive


def clear_caches() -> None:
    """Forget every cached point and part (as a process that just started)."""
    with _curves_lock:
        _curves.clear()
    for cached in (_pair_pld, _square, _power_cached, _product):
        cached.cache_clear()


def seed_curve_points(points: CurvePoints) -> bool:
    """Use ``points`` (checked by the caller with :func:`check_curve_points`, each value
    the engine's: read back from a file of this module's own points) as the pair's
    evaluated points, if they extend what this process has; whether they did. Later
    points, for a lower floor, are computed as usual from where they end."""
    return _curve(points.pair).seed(points)


@dataclass(frozen=True, slots=True)
class ComposedPLD:
    """A (composed) pessimistic PLD on the grid ``spacing``: ``probs[i]`` is the mass at the
    loss ``(lower + i) * spacing``, ``infinity`` the mass at ``+inf``, ``error`` a bound on
    the 1-norm of the floating-point error of ``probs``."""

    spacing: float
    lower: int
    probs: LongArray
    infinity: float
    error: float

    def _losses(self) -> LongArray:
        return (np.arange(self.probs.size) + self.lower) * np.longdouble(self.spacing)

    def _finite(self, epsilon: float, losses: LongArray) -> float:
        """``sum over losses > epsilon of (1 - e^(epsilon - l)) p_l``, rounded up."""
        above = losses > epsilon
        weights = -np.expm1(np.longdouble(epsilon) - losses[above])
        return float(np.dot(weights, self.probs[above])) * (1.0 + _SUM_SLACK)

    def delta_for_epsilon(self, epsilon: float) -> float:
        """A certified upper bound on ``delta(epsilon)`` of what this PLD dominates."""
        finite = self._finite(epsilon, self._losses())
        return min(1.0, finite + self.infinity + self.error)

    def epsilon_for_delta(self, delta: float) -> float:
        """The smallest ``eps >= 0`` at which :meth:`delta_for_epsilon` was evaluated and
        found ``<= delta`` (``inf`` if there is none): the grid point where the curve
        crosses ``delta`` by bisection, then the closed form inside the grid interval
        before it (``delta`` is ``U - e^eps V`` there), checked."""
        target = delta - self.infinity - self.error
        if target <= 0:
            return math.inf
        losses = self._losses()
        if self._finite(0.0, losses) <= target:
            return 0.0
        lo = max(0, 1 - self.lower)  # the first grid point above 0
        hi = self.probs.size - 1  # nothing lies above the last loss: delta there is 0
        if lo > hi:
            return math.inf  # unreachable: every loss <= 0 gives delta(0) = 0
        while lo < hi:  # the first k with finite delta at loss k <= target
            mid = (lo + hi) // 2
            if self._finite(float(losses[mid]), losses) <= target:
                hi = mid
            else:
                lo = mid + 1
        k = lo
        grid_point = float(losses[k])
        below = max(0.0, float(losses[k - 1])) if k >= 1 else 0.0
        tail = self.probs[k:]
        upper_mass = np.sum(tail)
        tilted = np.dot(tail, np.exp(losses[k] - losses[k:]))
        ratio = (upper_mass - np.longdouble(target)) / tilted if tilted > 0 else -1
        if ratio > 0:
            inside = float(losses[k] + np.log(ratio))
            candidate = max(below, inside) * (1.0 + 1e-12) + 1e-15
            if candidate < grid_point and self._finite(candidate, losses) <= target:
                return candidate
        return grid_point


def _connect_the_dots(
    indices: Sequence[int], deltas: Sequence[float], h: float
) -> tuple[LongArray, float]:
    """Masses of the pessimistic connect-the-dots PLD on the points ``indices * h`` (every
    index of ``[indices[0], indices[-1]]``), after the lower convex hull in ``(E, delta)``
    (module docstring), and a bound on their error's 1-norm. The last delta must be 0 (no
    infinity mass)."""
    eps = np.asarray(indices, dtype=np.longdouble) * np.longdouble(h)
    big_e = np.exp(eps)
    d = np.asarray(deltas, dtype=np.longdouble)
    hull: list[int] = []
    for i in range(eps.size):  # monotone chain, lower hull
        while len(hull) >= 2:
            a, b = hull[-2], hull[-1]
            cross = (big_e[b] - big_e[a]) * (d[i] - d[a]) - (d[b] - d[a]) * (big_e[i] - big_e[a])
            if cross <= 0:
                hull.pop()
            else:
                break
        hull.append(i)
    eps, d = eps[hull], d[hull]
    diffs = np.diff(d)
    gaps = np.diff(eps)
    first = np.concatenate(([1.0 - d[0]], diffs / np.expm1(-gaps)))  # y_{i-1}
    second = np.concatenate((diffs / np.expm1(gaps), [np.longdouble(0)]))  # z_i
    masses = np.maximum(first + second, np.longdouble(0))
    out = np.zeros(int(indices[-1]) - int(indices[0]) + 1, dtype=np.longdouble)
    out[np.asarray(indices, dtype=np.int64)[hull] - int(indices[0])] = masses
    # each mass is two quotients of differences, each within a few ulps of its magnitude
    error = 8.0 * _U * float(np.sum(np.abs(first)) + np.sum(np.abs(second)))
    return out, error


def blanket_pld(
    pair: BlanketPair, *, delta_floor: float, spacing: float | None = None
) -> ComposedPLD:
    """The pessimistic PLD of the blanket pair (module docstring) on the grid ``spacing``
    (default :func:`grid_spacing`; a power of two at most it: PLDs composed together share
    one). ``delta_floor``: the certified curve is followed down to this delta."""
    delta_floor = check_delta(delta_floor)
    curve = _curve(pair)
    h = curve.step if spacing is None else check_real("spacing", spacing)
    ratio = curve.step / h
    if not (h > 0 and ratio >= 1 and ratio == 2.0 ** round(math.log2(ratio))):
        raise ValueError(f"spacing must be {curve.step} divided by a power of two, got {h}")
    eps0 = pair.epsilon0
    if eps0 == 0.0:
        return ComposedPLD(
            spacing=h, lower=0, probs=np.ones(1, dtype=np.longdouble), infinity=0.0, error=0.0
        )
    indices, deltas = curve.points(delta_floor)
    scale = round(ratio)
    grid = [k * scale for k in indices]
    top = math.ceil(eps0 / h)
    if grid[-1] < top and deltas[-1] > 0.0:
        grid.append(top)
        deltas = [*deltas, 0.0]
    upper = np.minimum.accumulate(np.asarray(deltas))  # the true curve is non-increasing
    positive = np.asarray(grid, dtype=np.int64)
    eps = positive[1:] * h
    # at -eps_j: 1 - e^-eps + e^-eps delta(eps), rounded up (a few ulps of 1, the size of
    # every term; a curve above the true one only makes the PLD pessimistic)
    lower = -np.expm1(-eps) + np.exp(-eps) * upper[1:]
    lower = np.minimum(1.0, lower + 4.0 * np.finfo(np.float64).eps)
    all_indices = [*(-positive[1:][::-1]).tolist(), *positive.tolist()]
    all_deltas = [*np.minimum(1.0, lower[::-1]).tolist(), *upper.tolist()]
    probs, error = _connect_the_dots(all_indices, all_deltas, h)
    return ComposedPLD(spacing=h, lower=all_indices[0], probs=probs, infinity=0.0, error=error)


def _fft_size(n: int) -> int:
    """The least power of two ``>= n``: the error model (Higham, Thm. 24.2) is that of a
    radix-2 FFT of ``log2 N`` stages; mixed-radix sizes (3, 5, 7 factors) are outside it."""
    return 1 << max(0, n - 1).bit_length()


def _convolve(a: ComposedPLD, b: ComposedPLD, cut: float) -> ComposedPLD:
    """``a * b`` with its error budget, ends holding at most ``cut`` moved (module
    docstring)."""
    length = a.probs.size + b.probs.size - 1
    size = _fft_size(length)
    transform = np.fft.rfft(a.probs, n=size)
    # a squaring transforms its array once: the same bits as transforming it twice
    product = transform * (transform if b is a else np.fft.rfft(b.probs, n=size))
    probs = np.maximum(np.fft.irfft(product, n=size)[:length], np.longdouble(0))
    s_a, s_b = float(np.sum(a.probs)), float(np.sum(b.probs))
    r_a = float(np.sqrt(np.sum(a.probs * a.probs)))
    r_b = float(np.sqrt(np.sum(b.probs * b.probs)))
    rho = math.log2(size) * 7.1 * _U
    rounding = 2.0 * (3.0 * rho + 3.0 * _U) * max(s_a * r_b, r_a * s_b) * math.sqrt(size)
    error = a.error * s_b + b.error * s_a + a.error * b.error + rounding
    lower = a.lower + b.lower
    infinity = (a.infinity + b.infinity) * (1.0 + 4e-16)
    # cut the ends holding at most ``cut``: the low end up to the first entry kept, the high
    # end to +inf (also the floating-point noise far out in the tails, which would otherwise
    # keep every array as long as the whole support)
    low = int(np.searchsorted(np.cumsum(probs), cut, side="right"))
    high = probs.size - int(np.searchsorted(np.cumsum(probs[::-1]), cut, side="right"))
    if low >= high:  # everything is below the cut (cannot happen for a probability vector)
        low, high = 0, probs.size
    kept = probs[low:high].copy()
    kept[0] += np.sum(probs[:low])
    infinity += float(np.sum(probs[high:])) * (1.0 + 1e-15)
    return ComposedPLD(
        spacing=a.spacing, lower=lower + low, probs=kept, infinity=infinity, error=error
    )


def _power(pld: ComposedPLD, count: int, cut: float) -> ComposedPLD:
    result: ComposedPLD | None = None
    base = pld
    while True:
        if count & 1:
            result = base if result is None else _convolve(result, base, cut)
        count >>= 1
        if not count:
            break
        base = _convolve(base, base, cut)
    assert result is not None
    return result


def compose(
    parts: Mapping[ComposedPLD, int] | Sequence[tuple[ComposedPLD, int]], *, cut: float = _CUT
) -> ComposedPLD:
    """The composition of ``count`` copies of each PLD (all on one grid). After each
    convolution the ends holding at most ``cut`` are moved pessimistically (the high end to
    the infinity mass): :func:`epsilon_total_counts` takes ``1e-7 delta`` over all of them."""
    items = list(parts.items()) if isinstance(parts, Mapping) else list(parts)
    spacings = {pld.spacing for pld, _ in items}
    if len(spacings) != 1:
        raise ValueError(f"PLDs composed together must share one grid, got {sorted(spacings)}")
    total: ComposedPLD | None = None
    for pld, count in items:
        if count < 1:
            continue
        part = _power(pld, count, cut)
        total = part if total is None else _convolve(total, part, cut)
    if total is None:
        raise ValueError("nothing to compose")
    return total


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
    cut = max(_CUT, _CUT_FRACTION * delta / _convolutions_bound(len(counts), total_count))
    basic = _sum_upper(Fraction(pair.epsilon0) * count for pair, count in counts.items())
    leaves = tuple(sorted(counts.items(), key=lambda item: _order(item[0])))
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


def _order(pair: BlanketPair) -> tuple[int, float, int, int]:
    return (pair.n, pair.exp_epsilon0, pair.s, pair.t)


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
    return _convolve(half, half, cut)


@functools.lru_cache(maxsize=512)
def _power_cached(
    pair: BlanketPair, count: int, floor: float, spacing: float, cut: float
) -> ComposedPLD:
    """``count`` copies of the pair's PLD: the products of its squarings for the bits of
    ``count``, lowest first (as :func:`_power`)."""
    result: ComposedPLD | None = None
    for i in range(count.bit_length()):
        if count >> i & 1:
            base = _square(pair, floor, spacing, cut, i)
            result = base if result is None else _convolve(result, base, cut)
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
    return _convolve(left, right, cut)


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
