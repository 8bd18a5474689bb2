"""The bracketing epsilon search shared by the accountant's bounds.

Every bound here is a certified, non-increasing ``delta(eps)`` on ``[0, eps0]`` with
``delta(eps0) = 0``. :func:`search_epsilon` returns the upper end of a verified bracket: an
``eps`` at which the bound was evaluated and found ``<= delta``.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from scipy import special

__all__ = ["gaussian_guess", "search_epsilon"]


def search_epsilon(
    divergence: Callable[[float], float],
    *,
    epsilon0: float,
    delta: float,
    tol: float,
    guess: float,
) -> float:
    """Smallest eps in [0, eps0] with ``divergence(eps) <= delta``, to within ``tol``.

    ``divergence`` must be a certified upper bound, non-increasing, and 0 at ``epsilon0``;
    ``guess`` is a heuristic starting point (not part of the certificate).

    Keeps a bracket ``[lo, hi]`` with ``D(hi) <= delta`` (``D(eps0) = 0``) and ``D(lo) > delta``
    (``lo = 0`` is never evaluated: it is only the lower end of the search range). Probes
    follow a secant on ``f = log D - log delta`` through the two latest finite evaluations,
    started from ``guess``, offset by ``0.4 tol`` towards the side of the root
    that has not just moved (so a converged estimate closes the bracket in one probe), kept
    ``tol/4`` inside the bracket, and replaced by bisection when the secant is undefined,
    leaves the bracket, or the bracket has not halved over three probes (so at most about
    ``4 log2(eps0 / tol)`` probes). Only evaluated points become ``hi``, so the returned
    upper end is certified; ``eps = 0`` is returned only after evaluating ``D(0) <= delta``.
    """
    log_delta = math.log(delta)
    lo, hi = 0.0, epsilon0
    points: list[tuple[float, float]] = []  # finite (eps, f) evaluations, latest last
    widths: list[float] = []
    x = guess
    if x == 0.0 and divergence(0.0) <= delta:
        return 0.0  # no amplification needed; probing towards 0 would only be slow
    while hi - lo > tol:
        x = min(max(x, lo + 0.25 * tol), hi - 0.25 * tol)
        d = divergence(x)
        f = math.log(d) - log_delta if d > 0 else -math.inf
        hi_moved = d <= delta
        if hi_moved:
            hi = x
        else:
            lo = x
        if math.isfinite(f):
            points.append((x, f))
        widths.append(hi - lo)
        proposal = math.nan
        if len(points) >= 2:
            (x1, f1), (x2, f2) = points[-2], points[-1]
            if f1 != f2:
                proposal = x2 - f2 * (x2 - x1) / (f2 - f1)
        elif len(points) == 1:
            # A good guess is usually within tol of the root: probe 0.4 tol beyond it (the
            # offset below), which closes the bracket if it was; otherwise the secant
            # through two close points is a derivative estimate.
            proposal = points[0][0]
        slow = len(widths) >= 4 and widths[-1] > 0.5 * widths[-4]
        if slow or not lo <= proposal <= hi:  # also catches nan
            x = 0.5 * (lo + hi)
        else:  # clamped into [lo + tol/4, hi - tol/4] at the top of the loop
            x = proposal + (-0.4 * tol if hi_moved else 0.4 * tol)
    return hi


def gaussian_guess(*, n: int, epsilon0: float, alpha: float, delta: float) -> float:
    """Heuristic starting point for the search (not part of the certificate).

    For large n the privacy loss of both pairs is close to Gaussian, about
    ``(e^eps0 - 1)(X1 - X2) / n`` with ``X1 - X2`` the difference of two class counts of
    probability ``alpha`` each (the clone probability, or the blanket bound's hot-class
    probability), i.e. mu-GDP with ``mu = (e^eps0 - 1) sqrt(2 alpha / n)``. Solve the GDP
    hockey-stick ``Phi(-eps/mu + mu/2) - e^eps Phi(-eps/mu - mu/2) = delta`` by bisection.
    """
    mu = math.expm1(epsilon0) * math.sqrt(2.0 * alpha / n)

    def gdp_delta(eps: float) -> float:
        a = float(special.ndtr(-eps / mu + 0.5 * mu))
        b = float(special.ndtr(-eps / mu - 0.5 * mu))
        return a - math.exp(eps) * b

    lo, hi = 0.0, epsilon0
    if not (mu > 0 and math.isfinite(mu)) or gdp_delta(hi) > delta:
        return 0.5 * epsilon0
    if gdp_delta(0.0) <= delta:
        return 0.0
    for _ in range(60):
        mid = 0.5 * (lo + hi)
        if gdp_delta(mid) > delta:
            lo = mid
        else:
            hi = mid
    return hi
