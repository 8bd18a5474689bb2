"""Central privacy of n shuffled eps0-LDP reports: the generic stronger-clone bound.

What is certified
-----------------
Every device applies an ``epsilon0``-LDP randomiser R (CoCo or Collision) and a shuffler
permutes the n reports. For neighbouring datasets ``D = (x_1, x_2, ..., x_n)`` and
``D' = (x_1', x_2, ..., x_n)`` the analyst's view is ``S(R(D))`` versus ``S(R(D'))``. By the
stronger clone reduction (Feldman, McMillan, Talwar 2023; the paper's Theorem "Stronger clone
reduction", ``lemma:strongerclone``) every divergence satisfying data processing obeys

    D(S(R(D)) || S(R(D'))) <= D(P_alpha || Q_alpha)

whenever R admits the mixture decomposition of that theorem with *clone probability*
``alpha`` (but see "Scope of the certificate" below). ERRATA item 4: ``alpha`` is a clone
probability and must satisfy ``alpha <= 1 / (e^eps0 + 1)``; the paper's quoted values
``(e^eps0 - 1)/(e^eps0 + 1)`` and ``s (e^eps0 - 1)/(s e^eps0 + t - s)`` are total-variation
parameters ``beta`` and the clone probability is ``beta / (e^eps0 - 1)``: ``1 / (e^eps0 + 1)``
for any eps0-LDP randomiser (:func:`generic_clone_probability`), ``s / (s e^eps0 + t - s)``
for Collision and CoCo.

Scope of the certificate (read this before passing a mechanism-specific alpha)
------------------------------------------------------------------------------
The reduction above is a theorem only for ``alpha = 1/(e^eps0 + 1)``. Feldman, McMillan and
Talwar published an erratum to the stronger-clone paper (arXiv 2208.04591): the proof of
their Lemma 3.5 fails when the clone probability is below ``1/(e^eps0 + 1)`` (then
``gamma = 1 - alpha - e^eps0 alpha > 0``), and the lemma only holds with a different
decomposition. The test-suite exhibits a counterexample: 3-ary randomised response with
``alpha = 1/(e^eps0 + 2)`` (its clone probability by ERRATA item 4), n = 2, eps0 = 0.5,
whose shuffled output has ``D_e^0.3125 = 0.0349 > D(P_alpha || Q_alpha) = 0.0285``
(neighbours ``(0, 0)`` vs ``(1, 0)``). So:

* with the generic clone probability every number here is a certified upper bound for any
  eps0-LDP randomiser (and for Collision/CoCo in particular);
* with a smaller, mechanism-specific ``alpha`` the numbers are the divergence of the pair
  ``(P_alpha, Q_alpha)`` exactly as the paper's Theorem "Amplification Upper Bounds" states
  them, but they are *not* certified for the shuffled mechanism.

The pair (P, Q)
---------------
With ``p = e^eps0``, ``C ~ Bin(n - 1, 2 alpha)``, ``A | C ~ Bin(C, 1/2)`` and
``(Delta1, Delta2) = (1, 0)`` w.p. ``p alpha``, ``(0, 1)`` w.p. ``alpha``, ``(0, 0)`` w.p.
``gamma = 1 - alpha - p alpha``:

    P = (A + Delta1, C - A + Delta2),        Q = (A + Delta2, C - A + Delta1).

(The paper writes ``Delta2 = Bernoulli(1 - Delta1, alpha / (1 - e^eps alpha))``, the same law.)

Conditioning on the total (ERRATA item 5)
-----------------------------------------
``M = C + Delta1 + Delta2`` has the same law under P and Q, so the hockey-stick divergence
splits over ``m``. Write ``B(x; m) = C(m, x) / 2^m`` and ``b(m) = Pr[Bin(n - 1, 2 alpha) = m]``
(``b(n) = 0``). Using ``B(x - 1; m - 1) = (2x/m) B(x; m)`` and
``B(x; m - 1) = (2(m - x)/m) B(x; m)``, for ``m >= 1``

    P(m, x) = B(x; m) [ b(m-1) (2/m) (p alpha x + alpha (m - x)) + gamma b(m) ]
    Q(m, x) = P(m, m - x).

The swap ``x -> m - x`` maps P to Q, hence ``D_e^eps(P||Q) = D_e^eps(Q||P)`` exactly and the
``max`` of the two directions is either one. For ``m = 0``, ``P = Q`` and nothing is lost.

``P(m, x) - e^eps Q(m, x) = B(x; m) c1(m) (x - x*(m))`` is linear in x with
``c1 = (2 alpha b(m-1)/m) (p - 1)(e^eps + 1) >= 0`` and root

    x*(m) = (m/2) (1 + w(m)),
    w(m)  = tanh(eps/2) / (e^eps0 - 1) * [ (p + 1) + 2 gamma (n - m) / (m (1 - 2 alpha)) ]

(the ``gamma b(m)`` term enters through ``b(m) / b(m-1) = (n - m) 2 alpha / (m (1 - 2 alpha))``,
so no ratio of tiny pmfs is ever formed). The positive part is the tail ``x >= x0``,
``x0 = floor(x*) + 1``. The identity
``sum_{x >= x0} (x - m/2) B(x; m) = (m/4) B(x0 - 1; m - 1)`` turns it into

    D_m = alpha (e^eps0 - 1)(e^eps + 1) b(m-1) [ B(x0-1; m-1)/2 - w(m) Pr[Bin(m, 1/2) >= x0] ],

one binomial pmf and one binomial tail per m, with a cancellation of only about ``1/z^2``
(``z`` the tail's standard score) instead of the ``1/m`` of the naive
``sum x B - x* sum B`` form. Tails of fewer than 8 points (``x*`` close to m, i.e. eps close
to eps0, where even that difference cancels) are summed term by term,
``(2/m) sum_{x >= x0} B(x; m)(x - x*)``, all terms non-negative. ``D_e^eps(P||Q) = sum_m D_m``.

Numerical certification
-----------------------
* Only ``m`` in a window ``[lo, hi + 1]`` with ``lo``/``hi`` the ``1e-24`` lower/upper quantiles
  of C is summed; the probability ``Pr[M < lo] + Pr[M > hi + 1]`` (exact from binomial cdf/sf:
  ``M = C`` w.p. ``gamma`` and ``M = C + 1`` w.p. ``1 - gamma``) is *added*, valid because
  ``D_m <= Pr[M = m]``.
* Floating point: the special functions are scipy's Boost binomial pmf/sf (relative error
  measured below ``6e-13`` against exact integer arithmetic for m up to ``2e4`` and about
  ``5e-12`` for m up to ``5e7``; Cephes ``bdtrc`` is off by up to ``1e-7`` there, so it is
  not used; the test-suite re-checks these accuracies). Each pmf/tail value gets a relative
  error budget of ``1e-10`` in the direction that increases ``D_m``. The root ``x*`` is
  computed to a few ulps; a relative error ``u`` (``64 * 2^-52``) shifts the kept terms and
  can misplace the threshold by one point, together at most
  ``(2/m)(2 T + B(x0 - 1; m)) |x*| u`` (the last term only if ``x*`` is within ``u x*`` of
  the integer ``x0 - 1``), also added. Every ``D_m`` is clipped at 0 from below (never from
  above) and the total is multiplied by ``1 + 1e-9`` for the remaining few-ulp products and
  the summation. The result is a certified upper bound on the pair's divergence under the
  stated assumption on the library's special functions.
* Consequently the bound never drops below the added tail mass (at most ``2e-24``): a delta
  below about ``1e-23`` yields ``epsilon0``.
* ``eps >= eps0`` gives exactly 0: the likelihood ratio of the pair is at most
  ``(p x + m - x) / (p (m - x) + x) <= p`` (shuffling post-processes an eps0-LDP output).

:func:`epsilon_central` inverts this with a bracketing root search on ``log D`` and returns
the upper end of the final bracket, a value at which the bound was evaluated and is
``<= delta``.

This is the *generic* bound of the accountant (``epsilon_central_generic``); the bound the
product reports for CoCo and Collision is the mechanism-specific blanket bound of
:mod:`aggregator.accountant.blanket`. Closed forms for comparison are in
:mod:`aggregator.accountant.closed_forms`.
"""

from __future__ import annotations

import math
from typing import Final

import numpy as np
from numpy.typing import NDArray
from scipy import stats

from aggregator.accountant._checks import check_delta, check_epsilon0, check_n, check_real
from aggregator.accountant.search import gaussian_guess, search_epsilon

__all__ = [
    "delta_for",
    "epsilon_central",
    "generic_clone_probability",
    "hockey_stick",
]

_TAIL_MASS: Final = 1e-24
"""Each side of C's law left out of the m-window has mass below this; it is added back."""
_SPECIAL_REL_ERR: Final = 1e-10
"""Relative error budget of one Boost binomial pmf / sf value (observed <= 5e-12)."""
_ROOT_REL_ERR: Final = 64 * 2.0**-52
"""Relative error budget of the computed root x* (a handful of correctly rounded operations)."""
_SHORT_TAIL: Final = 8
"""Tails with fewer points than this are summed term by term instead of by the identity."""
_REL_SLACK: Final = 1e-9
"""Final relative slack on the divergence for summation and argument rounding."""
_ALPHA_REL_TOL: Final = 1e-12
"""Relative excess over 1/(e^eps0 + 1) accepted as rounding (then clamped to the maximum)."""

FloatArray = NDArray[np.float64]


# --------------------------------------------------------------------------------------------
# clone probabilities


def generic_clone_probability(epsilon0: float) -> float:
    """Clone probability ``1 / (e^eps0 + 1)`` of an arbitrary eps0-LDP randomiser.

    ERRATA item 4: the paper quotes the total-variation parameter ``(e^eps0 - 1)/(e^eps0 + 1)``;
    the clone probability of the stronger clone theorem is that divided by ``e^eps0 - 1``.
    """
    epsilon0 = check_epsilon0(epsilon0)
    return 1.0 / (math.exp(epsilon0) + 1.0)


def _check_alpha(clone_probability: float, epsilon0: float) -> float:
    """Validate ``0 <= alpha <= 1/(e^eps0 + 1)`` (ERRATA item 4).

    A value above the maximum by at most a relative ``1e-12`` is rounding (e.g. ``e^eps0`` and
    ``ln`` round trips) and is clamped to the maximum, which is a valid clone probability for
    every eps0-LDP randomiser. Anything larger is almost certainly a total-variation parameter
    ``beta`` passed by mistake, and is rejected.
    """
    alpha = check_real("clone_probability", clone_probability)
    alpha_max = generic_clone_probability(epsilon0)
    if alpha < 0:
        raise ValueError(f"clone_probability must be >= 0, got {alpha}")
    if alpha > alpha_max * (1 + _ALPHA_REL_TOL):
        raise ValueError(
            f"clone_probability must be <= 1/(e^epsilon0 + 1) = {alpha_max} for "
            f"epsilon0={epsilon0}, got {alpha}; a total-variation parameter beta converts to "
            "the clone probability beta / (e^epsilon0 - 1) (ERRATA item 4)"
        )
    return min(alpha, alpha_max)


# --------------------------------------------------------------------------------------------
# the hockey-stick divergence of the stronger-clone pair


class _StrongerClonePair:
    """The pair (P_alpha, Q_alpha) for fixed (n, eps0, alpha) with the eps-free parts cached.

    Local to one call of the public functions (nothing global can go stale). ``divergence``
    implements the module docstring's ``sum_m D_m`` plus the skipped mass of M.
    """

    def __init__(self, *, n: int, epsilon0: float, alpha: float) -> None:
        self.n = n
        self.epsilon0 = epsilon0
        self.alpha = alpha
        self.trivial = alpha == 0.0 or epsilon0 == 0.0  # then P = Q
        self.m: FloatArray = np.zeros(0)
        self.b_prev: FloatArray = np.zeros(0)
        self.skipped = 0.0
        self.gamma = 0.0
        if self.trivial:
            return
        p = math.exp(epsilon0)
        self.gamma = max(0.0, 1.0 - alpha * (1.0 + p))  # 0 at alpha = 1/(p + 1)
        big_n = n - 1  # C ~ Bin(n - 1, q)
        q = 2.0 * alpha
        lo_c, hi_c = 0, big_n
        if big_n > 0:
            lo_f = float(stats.binom.ppf(_TAIL_MASS, big_n, q))
            hi_f = float(stats.binom.ppf(_TAIL_MASS, big_n, 1.0 - q))
            if math.isfinite(lo_f):
                lo_c = max(0, int(lo_f))
            if math.isfinite(hi_f):
                hi_c = min(big_n, big_n - int(hi_f))
        # M = C (prob gamma) or C + 1 (prob 1 - gamma): window m in [lo_c, hi_c + 1], m >= 1.
        m_lo, m_hi = max(lo_c, 1), hi_c + 1
        self.m = np.arange(m_lo, m_hi + 1, dtype=np.float64)
        self.b_prev = np.asarray(stats.binom.pmf(self.m - 1.0, big_n, q), dtype=np.float64)
        g, one_minus_g = self.gamma, 1.0 - self.gamma
        # Pr[M <= lo_c - 1] (m = 0 contributes nothing, but counting it is harmless) and
        # Pr[M >= hi_c + 2]; sf(k) = Pr[C > k].
        below = g * float(stats.binom.cdf(lo_c - 1, big_n, q)) + one_minus_g * float(
            stats.binom.cdf(lo_c - 2, big_n, q)
        )
        above = g * float(stats.binom.sf(hi_c + 1, big_n, q)) + one_minus_g * float(
            stats.binom.sf(hi_c, big_n, q)
        )
        self.skipped = (below + above) * (1.0 + _SPECIAL_REL_ERR)

    def divergence(self, epsilon: float) -> float:
        """Certified upper bound on the pair's ``D_e^eps(P||Q) = D_e^eps(Q||P)``."""
        if self.trivial or epsilon >= self.epsilon0:
            return 0.0  # likelihood ratio <= e^eps0 <= e^eps
        alpha, n, m = self.alpha, self.n, self.m
        em1 = math.expm1(self.epsilon0)
        p = em1 + 1.0
        # w(m) = tanh(eps/2)/(e^eps0 - 1) [(p + 1) + 2 gamma (n - m) / (m (1 - 2 alpha))];
        # 1 - 2 alpha is exact for alpha >= 1/4 (Sterbenz) and > 0 since eps0 > 0.
        r = math.tanh(0.5 * epsilon) / em1
        w = r * ((p + 1.0) + 2.0 * self.gamma * (n - m) / (m * (1.0 - 2.0 * alpha)))
        x_star = 0.5 * m * (1.0 + w)
        x0 = np.floor(x_star) + 1.0
        # bracket = B(x0-1; m-1)/2 - w Pr[Bin(m, 1/2) >= x0] = (2/m) sum_{x>=x0} B(x;m)(x - x*)
        head = 0.5 * np.asarray(stats.binom.pmf(x0 - 1.0, m - 1.0, 0.5), dtype=np.float64)
        t0 = np.asarray(stats.binom.sf(x0 - 1.0, m, 0.5), dtype=np.float64)
        bracket = head * (1.0 + _SPECIAL_REL_ERR) - (w * t0) * (1.0 - _SPECIAL_REL_ERR)
        short = (m - x0) < _SHORT_TAIL
        if np.any(short):
            # Tails of fewer than _SHORT_TAIL points (x* near m, i.e. eps near eps0, where the
            # difference above cancels badly): sum the non-negative terms directly.
            ms, x0s, xs = m[short], x0[short], x_star[short]
            direct = np.zeros_like(ms)
            for j in range(_SHORT_TAIL):
                x = x0s + j  # pmf is 0 beyond m
                direct += np.asarray(stats.binom.pmf(x, ms, 0.5), dtype=np.float64) * (x - xs)
            bracket[short] = (2.0 / ms) * direct * (1.0 + _SPECIAL_REL_ERR)
        np.maximum(bracket, 0.0, out=bracket)
        # Rounding of x* (|error| <= u x*, u = _ROOT_REL_ERR) shifts every kept term, by at
        # most (2/m) T u x* = (1 + w) T u, and can misplace the threshold by one point k: k = x0
        # (at most B(x0; m) <= T more) or, only if x* - (x0 - 1) <= u x*, k = x0 - 1 with
        # B(x0 - 1; m) = B(x0 - 1; m - 1) m / (2 (m - x0 + 1)) (x0 <= m) or 2^-m (x0 = m + 1).
        near = (x_star - (x0 - 1.0)) <= 2.0 * _ROOT_REL_ERR * x_star
        b_k = np.where(
            near & (x0 <= m),
            head * m / np.maximum(m - x0 + 1.0, 1.0),
            np.where(near & (x0 == m + 1.0), np.exp2(-m), 0.0),
        )
        bracket += _ROOT_REL_ERR * (1.0 + w) * (2.0 * t0 + b_k) * (1.0 + _SPECIAL_REL_ERR)
        weight = alpha * em1 * (math.exp(epsilon) + 1.0) * (1.0 + _SPECIAL_REL_ERR)
        inside = weight * math.fsum(np.multiply(self.b_prev, bracket).tolist())  # (BLAS-free)
        total = (inside + self.skipped) * (1.0 + _REL_SLACK)
        return min(total, 1.0)


def hockey_stick(epsilon: float, *, n: int, epsilon0: float, clone_probability: float) -> float:
    """Certified upper bound on ``max(D_e^eps(P||Q), D_e^eps(Q||P))`` for the stronger-clone pair.

    Implements the paper's Theorem "Stronger clone reduction" (``lemma:strongerclone``) with
    ``alpha = clone_probability`` (ERRATA item 4) and the conditioning on
    ``M = C + Delta1 + Delta2`` of ERRATA item 5; the formulas and the error budget are in the
    module docstring. In short, for ``m >= 1``::

        P(m, x) = B(x; m) [ b(m-1) (2/m)(e^eps0 alpha x + alpha (m - x)) + gamma b(m) ]
        Q(m, x) = P(m, m - x)
        D = sum_m alpha (e^eps0 - 1)(e^eps + 1) b(m-1)
                  [ B(x0-1; m-1)/2 - w(m) Pr[Bin(m, 1/2) >= x0] ]
            + Pr[M outside the summed window]

    plus the floating-point budget (``1e-10`` relative per special-function value, the
    rounding of the root ``x*``, and ``1e-9`` relative on the total). The two directions are
    equal by the swap ``x -> m - x``. Returns 0 for ``epsilon >= epsilon0`` (post-processing
    of an eps0-LDP output), for ``alpha = 0`` and for ``epsilon0 = 0``.

    It bounds the shuffled mechanism's divergence for ``clone_probability =
    1/(e^epsilon0 + 1)``; for smaller values it is only the pair's divergence (module
    docstring, "Scope of the certificate").

    Raises ``ValueError`` unless ``epsilon >= 0``, ``n >= 1``, ``epsilon0 >= 0`` and
    ``0 <= clone_probability <= 1/(e^epsilon0 + 1)``.
    """
    epsilon = check_real("epsilon", epsilon)
    if epsilon < 0:
        raise ValueError(f"epsilon must be >= 0, got {epsilon}")
    n = check_n(n)
    epsilon0 = check_epsilon0(epsilon0)
    alpha = _check_alpha(clone_probability, epsilon0)
    if epsilon >= epsilon0:
        return 0.0
    return _StrongerClonePair(n=n, epsilon0=epsilon0, alpha=alpha).divergence(epsilon)


def delta_for(*, epsilon: float, n: int, epsilon0: float, clone_probability: float) -> float:
    """The delta certified at ``epsilon``: :func:`hockey_stick` (the inverse of
    :func:`epsilon_central`)."""
    return hockey_stick(epsilon, n=n, epsilon0=epsilon0, clone_probability=clone_probability)


def epsilon_central(
    *, n: int, delta: float, epsilon0: float, clone_probability: float, tol: float = 1e-9
) -> float:
    """Certified central epsilon of n shuffled eps0-LDP reports at ``delta``.

    The smallest ``eps`` in ``[0, epsilon0]`` with ``hockey_stick(eps) <= delta`` (the paper's
    Section "Privacy Amplification in Shuffle Model": fix delta, search eps; ERRATA item 5),
    returned as the *upper* end of a final bracket of width at most ``tol``: the returned
    value is one at which the certified bound was evaluated and found ``<= delta`` (or
    ``epsilon0``, where the divergence is exactly 0). Never above ``epsilon0``; equal to it
    when amplification cannot reach ``delta`` (in particular for ``delta`` below about
    ``1e-23``: the bound never drops below the added tail mass of M, at most ``2e-24``).

    ``clone_probability`` is ``alpha`` of the stronger clone theorem (ERRATA item 4). Only
    :func:`generic_clone_probability` gives a certified central epsilon for the shuffled
    mechanism; a smaller, mechanism-specific value (``s / (s e^eps0 + t - s)`` for Collision
    and CoCo) is outside the corrected stronger-clone theorem (see the module docstring).
    """
    n = check_n(n)
    delta = check_delta(delta)
    epsilon0 = check_epsilon0(epsilon0)
    alpha = _check_alpha(clone_probability, epsilon0)
    tol = check_real("tol", tol)
    if tol <= 0:
        raise ValueError(f"tol must be > 0, got {tol}")
    pair = _StrongerClonePair(n=n, epsilon0=epsilon0, alpha=alpha)
    if pair.trivial:
        return 0.0  # P = Q
    guess = gaussian_guess(n=n, epsilon0=epsilon0, alpha=alpha, delta=delta)
    return search_epsilon(pair.divergence, epsilon0=epsilon0, delta=delta, tol=tol, guess=guess)
