"""Upper bounds on the blanket engine's sum over the edges of its windows, one value each.

The engine of :mod:`aggregator.accountant.blanket` sums ``E[(N1 - tau)_+]``, ``tau =
tau0(K) + tau1 N0``, exactly over runs of constant threshold inside windows of ``K`` and
``N0`` holding all but ``1e-20`` of their mass (the rest is added as ``p`` times its mass).
The runs near the windows' edges carry almost nothing but cost as much as the others, so
only an *inner* window (all but :data:`INNER_TAIL` of the mass on each side) is summed run
by run; on each *band* between the inner and the outer window a single value bounds the
sum from above:

    f(tau) = E(N1 - tau)_+ is non-increasing in tau, and tau is non-decreasing in N0,
    so sum_{N0 in band} Pr[N0] f(tau(N0)) <= Pr[N0 in band] f(tau(lowest N0 of the band)),

and ``f`` there is bounded in closed form (:func:`chernoff_bounds`, within about ``z``
times ``f`` at ``z`` standard deviations of ``N1``). A row ``K`` inside the inner window
has two bands (``N0`` below and above its inner window); a row outside it is one band (its
whole ``N0`` window). ``Pr[N0 in band]`` is a difference of two of the engine's
eps-independent cdf values (computed once per pair), given their error budget; the
rounding of ``tau`` and of the bound's exponent are covered (:func:`chernoff_bounds`).

The result is an upper bound whatever the windows; they only decide how close. The engine
uses the bands only where their whole value is at most :data:`BAND_SLACK` of the rest of
the sum, so the curve is then within that fraction of the sum over every run (and never
below the exact value); elsewhere (small batches, far in the tail, where the sum leans on
the windows' edges) it sums the outer window run by run.
"""

from __future__ import annotations

from typing import Final

import numpy as np
from numpy.typing import NDArray

__all__ = ["BAND_SLACK", "INNER_TAIL", "chernoff_bounds", "slope_before"]

FloatArray = NDArray[np.float64]

INNER_TAIL: Final = 1e-12
"""Mass of each side of the inner windows, summed only as bands. (It was ``1e-14``: the
runs of the last two of those orders of magnitude cost 15% of a curve's points and moved
it up by at most ``6.2e-11`` relative, never down, on 50 points of 5 pairs compared with
the engine before the change: the bands bound what the runs summed, so a value can only
grow, each value certified.)"""
BAND_SLACK: Final = 1e-10
"""The bands are used where their whole value is at most this fraction of the sum over the
inner window; elsewhere the outer window is summed run by run. (The bands hold about the
inner tail times the Chernoff bound's looseness, ``z`` at ``z`` standard deviations: this
leaves room, and a curve point that falls back to the outer window costs several times one
that does not.)"""


def slope_before(
    k: FloatArray, ks: FloatArray, head: FloatArray, s_k: FloatArray, rel: float
) -> FloatArray:
    """An upper bound on ``S_(k-1) = Pr[Bin(K, 1/2) >= k - 1]`` from the group formula's
    ``head = (K/4) b(k - 1; K - 1, 1/2)`` and ``s_k = S_k``: ``b(k - 1; K, 1/2) = 2 head /
    (K - k + 1)`` for ``1 <= k <= K``; 1 for ``k <= 0``; ``2^-K`` for ``k = K + 1``. The
    factor covers the values' error budgets and the few roundings here."""
    if k.size and k.min() >= 1.0 and np.all(k <= ks):  # (the usual case, without the masks)
        return np.minimum(1.0, (s_k + 2.0 * head / (ks - k + 1.0)) * (1.0 + 4.0 * rel))
    inner = (k >= 1.0) & (k <= ks)
    denominator = np.where(inner, ks - k + 1.0, 1.0)
    value = np.where(inner, s_k + 2.0 * head / denominator, 0.0)
    value = np.where(k <= 0.0, 1.0, value)
    value = np.where(k > ks, np.ldexp(1.0, -ks.astype(np.int64)), value)
    return np.minimum(1.0, value * (1.0 + 4.0 * rel))


def chernoff_bounds(  # noqa: PLR0917 (the engine's helper)
    tau: FloatArray,
    ks: FloatArray,
    prob: FloatArray,
    prob_mag: FloatArray,
    eta: FloatArray,
    rel: float,
) -> FloatArray:
    """For every row ``ks`` of a band whose lowest threshold is ``tau``: ``Pr[N0 in band]``
    (``prob``, a difference of cdf values, plus ``3 rel prob_mag``, its error budget; both
    0 for an empty band) times an upper bound on ``f(tau)``,
    ``N1 ~ Bin(K, 1/2)``, in closed form: ``(y)_+ <= e^(lambda y - 1) / lambda`` for every
    ``lambda > 0``, so ``f(tau) <= exp(K log((1 + e^lambda)/2) - lambda tau - 1) / lambda``;
    ``lambda = log(x / (1 - x))``, ``x = tau / K`` (the Chernoff point; any positive value
    gives a bound). Within about ``z`` times ``f`` at ``z`` standard deviations. ``tau`` is
    lowered by ``eta`` first (its rounding), the exponent raised by ``1e-12`` of its terms'
    magnitudes (their rounding); ``f <= sqrt(K)/4 + (K/2 - tau)`` where ``tau <= K/2``
    (``E(N1 - K/2)_+ <= sd / 2``), and ``f = 0`` for ``tau >= K``."""
    tau = tau - eta
    x = tau / ks
    above = (x > 0.5) & (x < 1.0)
    xs = np.where(above, x, 0.75)
    lam = np.log(xs) - np.log1p(-xs)
    lam = np.where(lam > 0.0, lam, 1.0)
    first = ks * np.log1p(0.5 * np.expm1(lam))
    second = lam * tau
    exponent = first - second - 1.0 + 1e-12 * (np.abs(first) + np.abs(second)) + 1e-300
    chernoff = np.exp(np.minimum(exponent, 700.0)) / lam * (1.0 + 1e-12)
    flat = 0.25 * np.sqrt(ks) * (1.0 + 1e-12) + np.maximum(0.5 * ks - tau, 0.0)
    f = np.where(above & (lam > 0.0), np.minimum(chernoff, flat), np.where(x >= 1.0, 0.0, flat))
    band = (np.abs(prob) + 3.0 * rel * prob_mag) * f * (1.0 + 1e-12)
    return np.where(prob_mag > 0.0, band, 0.0)
