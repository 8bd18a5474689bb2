"""Central privacy of a device over many shuffled batches: ``epsilon_total``.

Why it composes
---------------
The blanket pair ``(P, Q)`` of :mod:`aggregator.accountant.blanket` dominates the shuffled
mechanism of one batch for *every* eps, in both directions (design note, section 5). A
device that reports in ``T`` batches of sizes ``n_1 .. n_T`` is therefore dominated by the
product of the ``T`` pairs (Zhu, Dong, Wang, AISTATS 2022: dominating pairs compose), whose
privacy loss distribution (PLD) is the convolution of the per-batch PLDs.

How the PLD is built: pessimistic connect-the-dots
--------------------------------------------------
A PLD is determined by its hockey-stick curve ``eps -> delta(eps)``. For a grid
``eps_j = j h`` (``h`` a twentieth of the loss's standard deviation
``(p - 1) sqrt(2a / n)``), the certified values ``delta(eps_j) >= H_{e^eps_j}(P || Q)`` from
:func:`~aggregator.accountant.blanket.blanket_delta` are turned into a PLD on the grid by
Google's ``dp_accounting`` (``pld_pmf.create_pmf_pessimistic_connect_dots``; Doroshenko,
Ghazi, Kamath, Kumar, Manurangsi, PETS 2022). Its curve passes through the given points and
is linear in ``e^eps`` between them; the true curve is convex in ``e^eps`` and below the
points, so the PLD's curve lies above it everywhere: it is a pessimistic (dominating)
discretisation. Negative losses come from the identity
``H_{e^-eps}(P || Q) = 1 - e^-eps + e^-eps H_{e^eps}(Q || P)`` and the symmetry of the pair.
The grid stops at the first ``eps_J`` whose delta is at most ``1e-3 delta / T``; the mass
beyond it goes to the PLD's infinity mass (it composes additively, so at most
``1e-3 delta`` over ``T`` batches).

The ``T``-fold composition and the final ``eps`` for ``delta`` are ``dp_accounting``'s (FFT
convolution in float64 with truncated tails moved to the infinity mass, pessimistic
estimate). The result is certified up to the floating-point accuracy of that convolution.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Final

import numpy as np

from aggregator.accountant._checks import check_delta, check_n, check_real
from aggregator.accountant.blanket import BlanketPair, blanket_delta_curve, tail_for

if TYPE_CHECKING:  # dp_accounting is imported on first use: it costs ~0.3 s at start-up
    from dp_accounting.pld import privacy_loss_distribution

__all__ = [
    "blanket_pld",
    "epsilon_total",
    "epsilon_total_batches",
    "epsilon_total_counts",
    "grid_spacing",
]

_POINTS_PER_SD: Final = 20
"""Grid points per standard deviation of one batch's privacy loss."""
_INFINITY_FRACTION: Final = 1e-3
"""The grid stops where delta(eps) <= this fraction of delta / rounds."""
_MAX_POINTS: Final = 4000


def grid_spacing(pair: BlanketPair) -> float:
    """``h``: a twentieth of the loss's standard deviation ``(p - 1) sqrt(2a / n)``, at most
    ``eps0 / 8`` and at least ``eps0 / 4000``."""
    eps0 = pair.epsilon0
    sd = math.expm1(eps0) * math.sqrt(2.0 * pair.hot / pair.n)
    return max(min(sd / _POINTS_PER_SD, eps0 / 8.0), eps0 / _MAX_POINTS)


def blanket_pld(
    pair: BlanketPair, *, delta_floor: float, spacing: float | None = None
) -> privacy_loss_distribution.PrivacyLossDistribution:
    """A pessimistic PLD of the blanket pair on the grid ``j * spacing`` (module docstring).

    ``delta_floor``: the grid stops at the first point whose certified delta is at most this
    (that delta becomes the PLD's infinity mass). ``spacing`` defaults to
    :func:`grid_spacing`; PLDs composed together must share it.
    """
    from dp_accounting.pld import pld_pmf, privacy_loss_distribution  # noqa: PLC0415

    delta_floor = check_delta(delta_floor)
    eps0 = pair.epsilon0
    if eps0 == 0.0:
        return privacy_loss_distribution.identity()
    h = grid_spacing(pair) if spacing is None else check_real("spacing", spacing)
    if not h > 0:
        raise ValueError(f"spacing must be > 0, got {h}")
    curve = blanket_delta_curve(pair, tail=tail_for(delta_floor, pair.exp_epsilon0))
    deltas = [min(1.0, curve(0.0))]
    while deltas[-1] > delta_floor and (len(deltas) - 1) * h < eps0:
        deltas.append(curve(len(deltas) * h))
    upper = np.minimum.accumulate(np.asarray(deltas))  # the true curve is non-increasing
    eps = h * np.arange(upper.size)
    lower = -np.expm1(-eps[:0:-1]) + np.exp(-eps[:0:-1]) * upper[:0:-1]  # eps_j < 0
    rounded = np.arange(-(upper.size - 1), upper.size)
    curve = np.minimum(1.0, np.concatenate((lower, upper)))
    pmf = pld_pmf.create_pmf_pessimistic_connect_dots(h, rounded, curve)
    return privacy_loss_distribution.PrivacyLossDistribution(pmf)


@functools.lru_cache(maxsize=256)
def _cached_pld(
    pair: BlanketPair, floor: float, spacing: float
) -> privacy_loss_distribution.PrivacyLossDistribution:
    """:func:`blanket_pld`, memoised: building a PLD (about 60 evaluations of the certified
    curve) is the whole cost of a composition; composing and querying take milliseconds."""
    return blanket_pld(pair, delta_floor=floor, spacing=spacing)


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
    ``pair`` of ``counts``.

    The per-size PLDs are cached (up to 256 distinct pairs), so a caller that adds one batch
    at a time pays for a PLD only when a new batch size appears (or the batch count crosses
    a power of two); composing is cheap. Pure: the cache holds only deterministic results.
    """
    delta = check_delta(delta)
    counts = {pair: count for pair, count in counts.items() if count > 0}
    if not counts:
        raise ValueError("counts must hold at least one batch")
    total_count = sum(counts.values())
    # Quantised so that repeated calls (a service adding one batch at a time) reuse the cached
    # PLDs: the floor only moves at powers of two of the batch count, the spacing at powers of
    # two (a lower floor and a finer grid are both still pessimistic, only tighter or slower).
    floor = _INFINITY_FRACTION * delta / 2.0 ** math.ceil(math.log2(total_count))
    spacing = 2.0 ** math.floor(math.log2(min(grid_spacing(pair) for pair in counts)))
    total: privacy_loss_distribution.PrivacyLossDistribution | None = None
    for pair, count in counts.items():
        pld = _cached_pld(pair, floor, spacing)
        part = pld.self_compose(count) if count > 1 else pld
        total = part if total is None else total.compose(part)
    assert total is not None
    basic = sum(pair.epsilon0 * count for pair, count in counts.items())
    return min(float(total.get_epsilon_for_delta(delta)), basic)


def epsilon_total(pair: BlanketPair, *, rounds: int, delta: float) -> float:
    """Composed central epsilon at ``delta`` of a device present in ``rounds`` batches of
    ``pair.n`` reports each (module docstring for what is certified). Non-decreasing in
    ``rounds``; at most ``rounds * eps0`` (basic composition of eps0-LDP reports)."""
    rounds = check_n(rounds)
    delta = check_real("delta", delta)
    return epsilon_total_batches(pairs=[pair] * rounds, delta=delta)
