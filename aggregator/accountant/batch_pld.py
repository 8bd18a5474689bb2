"""One batch's privacy loss distribution: the certified curve at a few points, made pessimistic.

The blanket pair ``(P, Q)`` of :mod:`aggregator.accountant.blanket` dominates the shuffled
mechanism of one batch for every eps (:mod:`aggregator.accountant.composition` composes
these per-batch PLDs; :mod:`aggregator.accountant.convolution` holds the extended-precision
arithmetic both use).

From certified points to a pessimistic PLD
------------------------------------------
A PLD is determined by its hockey-stick curve ``eps -> delta(eps)``, which is convex and
non-increasing in ``E = e^eps``. The certified values ``delta(eps_j) >= H_{e^eps_j}(P||Q)``
of :func:`~aggregator.accountant.blanket.blanket_delta_curve` are taken at points
``eps_j`` on a schedule in units of the loss's standard deviation
``sd = (p - 1) sqrt(2a / n)``: every quarter ``sd`` up to ``2 sd``, every half up to
``4 sd``, every ``sd`` beyond, and every two ``sd`` after a point whose delta is at most
``1e-10`` (rounded to the pair's grid step, a power of two near ``sd / 4``; why these:
below), until ``delta(eps_j) <= floor`` (the caller's, about ``1e-3 delta / T``), or the
curve is within four times its certificate's additive part, or ``eps_j >= eps0``. The
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
  extended precision with an error budget (:mod:`aggregator.accountant.convolution`).

Where the points are, and what they cost
----------------------------------------
Evaluations of the certified curve are the whole cost of a PLD: 1-50 ms each between 5e5
and 2e6 reports, growing with eps (the engine sums the neutral count in runs of constant
threshold, and there are more runs further out: :mod:`aggregator.accountant.blanket`),
15-17 per size. They are cached per pair and extended when a lower floor needs more points,
so every call gets the same points for the same floor whatever came before.

Every schedule of certified points gives a certified PLD: each point is above the true
curve, so the connect-the-dots curve through any set of them (with ``(eps0, 0)``) is above
it too and dominates the pair. The schedule only trades tightness for evaluations, and
a change of it moves ``epsilon_total`` either way while it stays an upper bound (other
points, not a subset). ``epsilon_total`` is sensitive to the points of the bulk: halving
their density below ``1 sd`` raises it by about 1%, below ``4 sd`` by 0.2%, and a few
rounds of small batches lean on the points out to ``6 sd`` (the reference table's 10
rounds of 150 reports move by 2e-4 with steps of ``2 sd`` from ``4 sd`` on). Once the
curve is below ``1e-10`` it carries almost no weight in any composition while each point
there costs the most (the engine's runs grow with eps), so the steps double there: for the
ledger of 33 sizes between 5e5 and 2e6 reports at ``delta = 1e-8`` over 1,000 rounds that
is 547 evaluations instead of 574 (one fewer for most sizes, each among the most expensive:
about a tenth of a first composition), and ``epsilon_total`` moved by ``-3.5e-6`` relative
(``bench/bench_composition.py``); the reference tables did not move (below ``1e-8``).

Kept across a restart
---------------------
The points are a function of the pair and this module's constants alone (:data:`CURVE_PINS`),
so the accountant's process also keeps them in a file beside the ledger
(:mod:`aggregator.ledger.curve_file`). Here that is :func:`curve_points` (what was
evaluated), :func:`check_curve_points` and :func:`recompute_curve_point` (what a file is
checked with), :func:`seed_curve_points` (points read back, the same bits as computed: the
result is the uncached one exactly) and :func:`on_new_points` (told after each pair's new
points, so a file can take them as they come rather than after a whole composition: a first
start killed halfway keeps what it computed). Nothing here reads or writes a file.
"""

from __future__ import annotations

import collections
import math
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Final

import numpy as np

from aggregator.accountant._checks import check_delta, check_real
from aggregator.accountant.blanket import BlanketPair, blanket_delta_curve_and_floor
from aggregator.accountant.convolution import UNIT_ROUNDOFF, ComposedPLD, LongArray

__all__ = [
    "CURVE_PINS",
    "CurvePoints",
    "blanket_pld",
    "check_curve_points",
    "clear_curves",
    "curve_points",
    "grid_spacing",
    "on_new_points",
    "pair_order",
    "recompute_curve_point",
    "seed_curve_points",
]

_SCHEDULE: Final = ((2.0, 0.25), (4.0, 0.5), (math.inf, 1.0))
"""(up to this many sd, step in sd) of the points of the certified curve."""
_SPARSE_BELOW: Final = 1e-10
"""Past a point whose delta is at most this, steps are at least :data:`_SPARSE_STEP` sd."""
_SPARSE_STEP: Final = 2.0
_PLATEAU: Final = 4.0
"""Points stop where the curve is within this factor of its certificate's additive part."""
_CURVE_TAIL: Final = 1e-20
"""Window tail of the curve's engine (4 p times it is added to every value)."""
_MIN_STEP_FRACTION: Final = 2.0**-18
"""The grid step is at least eps0 / 2^18 (PLD arrays of at most 2^19 entries)."""


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

    def _next_index(self, k: int, value: float) -> int:
        """The schedule's index after ``k``, where the curve is ``value``."""
        z = k * self.step / self.sd
        for limit, step_sd in _SCHEDULE:
            if z < limit:
                step = max(step_sd, _SPARSE_STEP) if value <= _SPARSE_BELOW else step_sd
                return k + max(1, round(step * self.sd / self.step))
        raise AssertionError("unreachable")  # the last limit is infinite

    def points(self, floor: float) -> tuple[list[int], list[float]]:
        """Indices (units of :attr:`step`) and certified deltas, up to the first point at
        or below ``floor`` (or the end). Tells :func:`on_new_points`'s listeners if it
        evaluated any (after releasing the lock)."""
        with self._lock:
            before = len(self.deltas)
            result = self._points(floor)
            added = len(self.deltas) > before
        if added:
            _tell(self.pair)
        return result

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
                self.indices.append(self._next_index(self.indices[-1], self.deltas[-1]))
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


def clear_curves() -> None:
    """Forget every pair's points (as a process that just started)."""
    with _curves_lock:
        _curves.clear()


def pair_order(pair: BlanketPair) -> tuple[int, float, int, int]:
    """The fixed order of pairs (by size first) in which points are listed and composed."""
    return (pair.n, pair.exp_epsilon0, pair.s, pair.t)


_listeners: list[Callable[[BlanketPair], None]] = []
_listeners_lock = threading.Lock()


def on_new_points(listener: Callable[[BlanketPair], None]) -> Callable[[], None]:
    """Call ``listener(pair)`` after each evaluation of a pair's points that added some
    (once per pair and call: all the points one PLD needs), in the thread that computed
    them, holding no lock; returns the function that removes it. An exception it raises
    propagates to the computation (the listener handles its own failures)."""
    with _listeners_lock:
        _listeners.append(listener)

    def remove() -> None:
        with _listeners_lock:
            if listener in _listeners:
                _listeners.remove(listener)

    return remove


def _tell(pair: BlanketPair) -> None:
    with _listeners_lock:
        listeners = list(_listeners)
    for listener in listeners:
        listener(pair)


# The certified curve's points, kept across a restart (aggregator.ledger.curve_file): they
# are a deterministic function of the pair and the constants of CURVE_PINS alone, so points
# read back are the points this process would compute, bit for bit, and a cache can only
# save time. Nothing here reads or writes a file.


CURVE_PINS: Final = {
    "tail": _CURVE_TAIL,
    "plateau": _PLATEAU,
    "schedule": [[limit if math.isfinite(limit) else None, step] for limit, step in _SCHEDULE],
    "sparse": [_SPARSE_BELOW, _SPARSE_STEP],
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
    return sorted((r for r in records if r.deltas), key=lambda r: pair_order(r.pair))


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
            index = curve._next_index(index, points.deltas[j - 1])
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


def seed_curve_points(points: CurvePoints) -> bool:
    """Use ``points`` (checked by the caller with :func:`check_curve_points`, each value
    the engine's: read back from a file of this module's own points) as the pair's
    evaluated points, if they extend what this process has; whether they did. Later
    points, for a lower floor, are computed as usual from where they end."""
    return _curve(points.pair).seed(points)


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
    error = 8.0 * UNIT_ROUNDOFF * float(np.sum(np.abs(first)) + np.sum(np.abs(second)))
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
