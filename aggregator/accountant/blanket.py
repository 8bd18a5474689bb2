"""Certified mechanism-specific central privacy of n shuffled CoCo / Collision reports.

The privacy-blanket bound of ``shared/design/blanket-amplification.md`` (proof outline in
``docs/privacy-model.md``). It is what the product reports as ``epsilon_central``.

What is certified, and why
--------------------------
``p = e^eps0`` (the realised ``E/U`` of a deployment), ``Omega = s p + t - s``. Every report
``(h, z)`` of CoCo (``t >= 2s``) and Collision (every ``t > s``) satisfies

    (P)  1/Omega <= P(z | x, h) <= p/Omega    for every input x, seed h and bucket z.

So each report is, with probability ``gamma = t/Omega``, uniform (a *blanket* report), and
the blanket lemma of Balle, Bell, Gascon and Nissim (CRYPTO 2019) reduces the shuffled
mechanism to a sum of i.i.d. terms; a convex-order argument shows that disjoint,
collision-free hot sets are the worst case for every pair of inputs, every hash family and
every order of CoCo's overwrites (design note, sections 1-4). The result is a *dominating
pair* on class counts ``c = (N1, N2, N0, NR) ~ Multinomial(n; a, a, b, r)``:

    P(c) = Mult(c) (p N1 + N2 + c0 N0) / n,     Q(c) = Mult(c) (N1 + p N2 + c0 N0) / n,

with, for ``t >= 2s`` (CoCo, Collision, k-ary randomised response as ``s = 1, t = k``),
``a = s/Omega``, ``b = (t - 2s)/Omega``, ``c0 = 1``, and for Collision with ``s < t < 2s``
(hot sets must overlap; design note, end of section 4) ``a = (t - s)/Omega``,
``b = (2s - t)/Omega``, ``c0 = p`` (class 0 is then "hot for both inputs"). In both cases
``r = s (p - 1)/Omega`` and ``p a + a + c0 b = 1``. For every ``E = e^eps > 0``

    H_E(S(R(D)) || S(R(D'))) <= H_E(P || Q)
        = (1/n) E[((p - E) N1 + (1 - p E) N2 - c0 (E - 1) N0)_+]   (design note, section 5)

in both directions (``Q`` is ``P`` with classes 1 and 2 swapped, so the two directions of
the pair are equal). The paper's pair merges classes 0 and R (an observed neutral report
is then wrongly treated as carrying nothing) and is *not* an upper bound.

Computing ``H_E(P || Q)`` (design note, section 6)
-------------------------------------------------
``K = N1 + N2 ~ Bin(n, 2a)``; given ``K``, ``N1 ~ Bin(K, 1/2)`` and independently
``N0 ~ Bin(n - K, q0)``, ``q0 = b / (1 - 2a)``. The integrand is
``(p - 1)(1 + E)(N1 - tau)_+`` with ``tau = tau0(K) + tau1 N0``,
``tau0 = K (p E - 1) / ((p - 1)(1 + E))``, ``tau1 = c0 (E - 1) / ((p - 1)(1 + E))``, and for
``k = floor(tau) + 1``

    E[(N1 - tau)_+ | K] = (K/4) b(k - 1; K - 1, 1/2) + (K/2 - tau) Pr[N1 >= k].

``k`` is constant over runs of ``N0``; over such a run ``[i, j]`` the sum is
``P_g ((K/4) b + (K/2 - tau0) S_k) - tau1 S_k M_g`` with ``P_g = Pr[i <= N0 <= j]`` and
``M_g = E[N0; i <= N0 <= j] = (n - K) q0 Pr[i - 1 <= Bin(n - K - 1, q0) <= j - 1]``, each a
difference of two binomial cdf values (or sf values above the mean, so nothing is computed
as ``1 - x``).

Numerical certificate (every item is *added* to the result)
-----------------------------------------------------------
* Truncation: only ``K`` in a window of ``Bin(n, 2a)`` and, for each ``K``, ``N0`` in a
  window of ``Bin(n - K, q0)`` are summed. On the rest, ``(P - E Q)_+ <= P <= p Mult``, so
  ``p`` times the skipped multinomial mass (exact, from binomial cdf/sf values) is added.
  ``K = 0`` contributes exactly 0 and is skipped for free. Inside these windows, runs are
  summed only over an inner window (all but ``1e-12`` of the mass on each side); each
  band between the two is bounded by one value, ``Pr[N0 in band]`` times a Chernoff bound
  on ``f`` at the band's lowest ``N0`` (``f`` falls as ``N0`` grows), its rounding
  covered (:mod:`aggregator.accountant.bands`); where the bands add more than ``1e-10``
  of the total the outer window is summed by runs instead.
* Special functions: scipy's Boost binomial pmf/cdf/sf, each given a relative error budget
  ``1e-10`` (measured below ``1e-11``; the test-suite re-checks against exact arithmetic).
  A group's value is a signed combination of such values; ``3e-10`` times the sum of the
  absolute values of its terms is added (products of two values carry ``2 eps + eps^2``;
  the margin over that also covers the binary64 rounding of the combination). The class
  probabilities ``a, b, q0`` are computed in binary64 (a few ulps); their effect on the
  binomial values, at most ``|k - m q| dq / (q (1 - q))`` relative (about ``z sqrt(n) u``
  at ``z`` standard deviations, more where ``1 - q`` is tiny), is computed for the
  windows and added to that budget (:func:`_special_rel_err`). Boost's own error grows
  like ``sqrt(n)`` (2e-11 at ``n = 2^30``): batches above :data:`MAX_N` are refused.
  The cdf and sf values at the run boundaries are chained from one Boost value each
  (:mod:`aggregator.accountant.chains`: sums of non-negative pmf terms, never a
  difference), their pmf values from one Boost value per 32 points (ratios of exact
  integers), the threshold's pmf and tail at each row's top from one pair per block of
  256 rows (:mod:`aggregator.accountant.tails`: a ratio and a non-negative sum per row);
  the rounding bounds of all of these are added to the same budget.
* Rounding of ``tau``: ``f(tau) = E(N1 - tau)_+`` is convex and piecewise linear with
  kinks at the integers, slope ``-S_k`` on ``[k - 1, k]`` (``S_k = Pr[N1 >= k]``), and the
  group formula for ``k`` is its tangent ``g_k`` there. ``tau0`` is computed from
  ``p E - 1 = (p - 1) + p expm1(eps)`` (no cancellation, so it is within a few ``u K`` of its
  exact value for the exact ``e^eps``; ``p E - 1`` formed directly is off by about
  ``u / (eps0 + eps)`` relative, which for ``eps0`` near the smallest a spec accepts,
  ``2^-24``, is far outside the budget). The run boundaries are computed
  from ``tau`` to within ``eta = 64 u (K + hi0 + 2)`` (``u = 2^-53``), so the ``k`` used
  for an ``N0`` is the right one or a neighbour while ``tau`` is within ``eta`` of the
  shared kink. A neighbouring tangent lies below ``f`` (a supporting line of a convex
  function) by at most ``eta`` times the change of slope at the kink, ``Pr[N1 = k - 1]`` or
  ``Pr[N1 = k]``; evaluating ``g_k`` at a ``tau`` off by ``eta`` moves it by at most
  ``eta S_k``. Both together are at most ``2 eta S_(k-1)``, added per unit of probability
  of the run, with ``S_(k-1) = S_k + 2 head / (K - k + 1)`` from the values the group
  formula already has (``S_(k-1) = 1`` for ``k <= 0``, ``2^-K`` for ``k = K + 1``). The
  budget is relative to the tail it is in: where ``delta(eps)`` is tiny, so is it (a
  budget of ``2 eta`` per unit of probability put a floor of about ``4e-14 p^2`` under
  the certified curve, which stalled compositions aiming below it).
* Each group value is clipped at 0 from below (the true one is non-negative), and the total
  is multiplied by ``1 + 1e-9`` for the remaining few-ulp products and the summation.
* ``eps >= eps0`` gives exactly 0: the likelihood ratio of the pair is at most ``p``.

:func:`blanket_epsilon` inverts the bound with the bracketing search of
:mod:`aggregator.accountant.search` and returns the upper end of a verified bracket: a value
at which the certified ``delta(eps)`` was evaluated and found ``<= delta``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

import numpy as np
from numpy.typing import NDArray
from scipy import special, stats

from aggregator.accountant._checks import check_delta, check_n, check_real
from aggregator.accountant.bands import BAND_SLACK, INNER_TAIL, chernoff_bounds
from aggregator.accountant.bands import slope_before as _slope_before
from aggregator.accountant.chains import chained_lower_cdf
from aggregator.accountant.chains import lower_cdf as _lower_cdf
from aggregator.accountant.chains import shifted_cdf as _shifted_cdf
from aggregator.accountant.search import gaussian_guess, search_epsilon
from aggregator.accountant.tails import threshold_tails as _threshold_tails
from edge.spec import MechanismSpec, log_upper

__all__ = [
    "MAX_N",
    "BlanketPair",
    "blanket_delta",
    "blanket_delta_curve",
    "blanket_delta_curve_and_floor",
    "blanket_epsilon",
    "blanket_pair_for_spec",
    "tail_for",
]

FloatArray = NDArray[np.float64]

_SPECIAL_REL_ERR: Final = 1e-10
"""Relative error budget of one Boost binomial pmf / cdf / sf value."""
_UNIT_ROUNDOFF: Final = 2.0**-53
_REL_SLACK: Final = 1e-9
"""Final relative slack for summation and the few-ulp arithmetic not budgeted elsewhere."""
MAX_N: Final = 2**30
"""Largest batch size the certificate is validated for: Boost's binomial values were checked
against 40-digit arithmetic up to here (below ``2e-11`` relative, inside the ``1e-10``
budget; their error grows like ``sqrt(n)``). A :class:`BlanketPair` of more reports is
refused; the ledger composes a larger release as one of ``MAX_N`` reports, which is
pessimistic (:func:`aggregator.accountant.history.accounting_size`)."""
DEFAULT_TAIL: Final = 1e-20
"""Default mass of each side of a truncation window (``p`` times it is added back)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class BlanketPair:
    """The blanket dominating pair of ``n`` shuffled CoCo / Collision reports.

    ``exp_epsilon0`` is ``p = e^eps0`` (for a deployment the realised ``E/U``, see
    :func:`blanket_pair_for_spec`), ``s`` the non-zeros per vector and ``t`` the output
    domain size; k-ary randomised response is ``s = 1, t = k``. Certified for Collision with
    any ``t > s`` and for CoCo with ``t >= 2s`` (its only admissible values): both satisfy
    property (P) of the module docstring. The class probabilities ``a, b, r`` and the
    neutral weight ``c0`` are the module docstring's.
    """

    n: int
    exp_epsilon0: float
    s: int
    t: int

    def __post_init__(self) -> None:
        check_n(self.n)
        if self.n > MAX_N:
            raise ValueError(
                f"n={self.n} is above {MAX_N}, the largest batch the certified bound is "
                "validated for (its binomial values' error budget); account a larger batch "
                f"as one of {MAX_N} reports (pessimistic)"
            )
        p = check_real("exp_epsilon0", self.exp_epsilon0)
        if p < 1.0:
            raise ValueError(f"exp_epsilon0 must be >= 1, got {p}")
        for name in ("s", "t"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int):
                raise TypeError(f"{name} must be an integer, got {value!r}")
        if self.s < 1:
            raise ValueError(f"s must be >= 1, got {self.s}")
        if self.t <= self.s:
            raise ValueError(f"t must be > s={self.s}, got {self.t}")

    @property
    def epsilon0(self) -> float:
        """``ln p``, rounded up (:func:`edge.spec.log_upper`): the bound is 0 from here on,
        and composition never goes above its multiples, so it must not be below ``ln p``."""
        return log_upper(self.exp_epsilon0)

    @property
    def omega(self) -> float:
        """``Omega = s p + t - s``."""
        return self.s * self.exp_epsilon0 + (self.t - self.s)

    @property
    def hot(self) -> float:
        """``a``: probability of each of classes 1 and 2 (hot for one input only)."""
        return min(self.s, self.t - self.s) / self.omega

    @property
    def neutral(self) -> float:
        """``b``: probability of class 0 (neutral if ``t >= 2s``, hot for both otherwise)."""
        return abs(self.t - 2 * self.s) / self.omega

    @property
    def neutral_weight(self) -> float:
        """``c0``: 1 for ``t >= 2s``, ``p`` for ``t < 2s``."""
        return 1.0 if self.t >= 2 * self.s else self.exp_epsilon0

    def likelihood_ratio_terms(
        self, n1: FloatArray, n2: FloatArray, n0: FloatArray
    ) -> tuple[FloatArray, FloatArray]:
        """``(p N1 + N2 + c0 N0, N1 + p N2 + c0 N0)``: ``P/Mult`` and ``Q/Mult`` times n."""
        p, c0 = self.exp_epsilon0, self.neutral_weight
        return p * n1 + n2 + c0 * n0, n1 + p * n2 + c0 * n0


def blanket_pair_for_spec(spec: MechanismSpec, *, n: int) -> BlanketPair:
    """The pair of a deployment: ``p`` is the realised ``E/U <= e^epsilon`` (exact in
    binary), so the bound holds for the weights the devices actually use."""
    return BlanketPair(n=n, exp_epsilon0=spec.exp_epsilon, s=spec.s, t=spec.t)


@dataclass(frozen=True, slots=True)
class _Window:
    """A window of ``N0`` for the rows ``rows`` of an engine, its eps-independent values:
    the cdf and pmf at its ends (the clipped boundaries of its runs) and the shifted cdf
    at its first end."""

    rows: slice
    lo: FloatArray
    hi: FloatArray
    ends: tuple[FloatArray, FloatArray]
    pmf_ends: tuple[FloatArray, ...]
    c_ends: tuple[FloatArray, FloatArray]
    d_first: tuple[FloatArray, FloatArray]
    pk: FloatArray
    eta: FloatArray


class _Engine:
    """Eps-independent parts of ``H_E(P || Q)`` for one pair (windows and ``K``'s pmf)."""

    def __init__(self, pair: BlanketPair, tail: float) -> None:
        self.pair = pair
        n, p = pair.n, pair.exp_epsilon0
        self.trivial = p == 1.0  # then P = Q
        q1 = 2.0 * pair.hot
        self.q0 = pair.neutral / (1.0 - q1) if pair.neutral > 0 else 0.0
        k_lo = max(1, int(stats.binom.ppf(tail, n, q1)))
        # Boost's isf is unreliable for tiny tails; use the mirrored ppf instead.
        k_hi = min(n, n - int(stats.binom.ppf(tail, n, 1.0 - q1)) + 1)
        ks = np.arange(k_lo, k_hi + 1, dtype=np.float64)
        self.k = ks
        m0 = n - ks
        self.m0 = m0
        if self.q0 > 0.0:
            z = 0.5 - float(special.ndtri(tail))
            mean = m0 * self.q0
            sd = np.sqrt(mean * (1.0 - self.q0))
            self.lo0 = np.maximum(0.0, np.floor(mean - z * sd - 1.0))
            self.hi0 = np.minimum(m0, np.ceil(mean + z * sd + z * z))
        else:
            self.lo0 = np.zeros_like(ks)
            self.hi0 = np.zeros_like(ks)
        self.rel = (
            _SPECIAL_REL_ERR  # (P = Q: nothing is computed)
            if self.trivial
            else _special_rel_err(n, q1, ks, self.q0, m0, self.lo0, self.hi0)
        )
        self.pk = np.asarray(stats.binom.pmf(ks, n, q1)) * (1.0 + self.rel)
        # K = 0 contributes exactly 0, so nothing is skipped below a window starting at 1.
        skipped = float(stats.binom.cdf(k_lo - 1, n, q1)) if k_lo > 1 else 0.0
        skipped += float(stats.binom.sf(k_hi, n, q1))
        if self.q0 > 0.0:
            outside = np.asarray(stats.binom.cdf(self.lo0 - 1.0, m0, self.q0)) + np.asarray(
                stats.binom.sf(self.hi0, m0, self.q0)
            )
            skipped += _dot(self.pk, outside) * (1.0 + self.rel)
        self.skipped = p * skipped * (1.0 + self.rel) * (1.0 + 4 * _UNIT_ROUNDOFF)
        # Rounding of tau (module docstring): 2 eta S_(k-1) per unit of probability.
        self.eta = 64.0 * _UNIT_ROUNDOFF * (ks + self.hi0 + 2.0)
        if self.q0 > 0.0:
            self._inner_windows(tail)

    def _inner_windows(self, tail: float) -> None:
        """The outer and the inner window (:mod:`aggregator.accountant.bands`), the bands
        between them and their probabilities (all eps-independent)."""
        n, q0, q1 = self.pair.n, self.q0, 2.0 * self.pair.hot
        ks, m0, lo0, hi0 = self.k, self.m0, self.lo0, self.hi0
        self.outer = self._window(slice(0, ks.size), lo0, hi0)
        inner_tail = max(INNER_TAIL, tail)
        k_lo = max(int(ks[0]), int(stats.binom.ppf(inner_tail, n, q1)))
        k_hi = min(int(ks[-1]), n - int(stats.binom.ppf(inner_tail, n, 1.0 - q1)) + 1)
        rows = slice(k_lo - int(ks[0]), max(k_hi, k_lo - 1) - int(ks[0]) + 1)
        z = 0.5 - float(special.ndtri(inner_tail))
        m = m0[rows]
        mean = m * q0
        sd = np.sqrt(mean * (1.0 - q0))
        lo1 = np.maximum(lo0[rows], np.floor(mean - z * sd - 1.0))
        hi1 = np.minimum(hi0[rows], np.ceil(mean + z * sd + z * z))
        self.inner = self._window(rows, lo1, hi1)
        # the bands' probabilities: below the inner window (the whole window outside the
        # inner rows), and above it
        c_lo0, c_hi0 = self.outer.c_ends
        c_lo1 = c_hi0.copy()  # a row outside the inner rows: its band ends at hi0
        c_lo1[rows] = self.inner.c_ends[0]
        top = hi0.copy()
        top[rows] = lo1 - 1.0
        low = _band_prob(lo0 - 1.0, top, m0, q0, c_lo0, c_lo1)
        high = _band_prob(hi1, hi0[rows], m, q0, self.inner.c_ends[1], c_hi0[rows])
        # every row's band below, then the inner rows' bands above, as one set of rows
        everything = np.arange(ks.size)
        self.bands = (
            np.concatenate((everything, everything[rows])),
            np.concatenate((lo0, hi1 + 1.0)),  # the bands' lowest N0
            np.concatenate((low[0], high[0])),
            np.concatenate((low[1], high[1])),
            np.concatenate((self.eta, self.inner.eta)),
            np.concatenate((self.pk, self.inner.pk)),
        )

    def _window(self, rows: slice, lo: FloatArray, hi: FloatArray) -> _Window:
        m = self.m0[rows]
        ends = (lo - 1.0, hi)
        c_ends = (_lower_cdf(ends[0], m, self.q0), _lower_cdf(ends[1], m, self.q0))
        return _Window(
            rows=rows,
            lo=lo,
            hi=hi,
            ends=ends,
            pmf_ends=tuple(np.asarray(stats.binom.pmf(x, m, self.q0)) for x in ends),
            c_ends=c_ends,
            d_first=_shifted_cdf(ends[0], m, self.q0, c_ends[0]),
            pk=self.pk[rows],
            eta=self.eta[rows],
        )

    @property
    def floor(self) -> float:
        """What :meth:`divergence` adds whatever ``eps`` (the skipped mass): where the curve
        comes within a few times this, further points carry no information."""
        return self.skipped * (1.0 + _REL_SLACK)

    def divergence(self, epsilon: float) -> float:
        """Certified upper bound on ``H_{e^eps}(P || Q) = H_{e^eps}(Q || P)``."""
        pair = self.pair
        if self.trivial or epsilon >= pair.epsilon0:
            return 0.0  # likelihood ratio <= p <= e^eps
        p, c0, n = pair.exp_epsilon0, pair.neutral_weight, pair.n
        big_e = math.exp(epsilon)
        coef = (p - 1.0) * (1.0 + big_e)
        tau1 = c0 * math.expm1(epsilon) / coef
        ks = self.k
        # p E - 1 as (p - 1) + p (E - 1): two non-negative terms, each to an ulp or two, so
        # tau0 is within a few u K of its exact value (module docstring, rounding of tau);
        # p * big_e - 1 cancels and is off by about u / (eps0 + eps) relative.
        tau0 = ks * (((p - 1.0) + p * math.expm1(epsilon)) / coef)
        if self.q0 == 0.0 or tau1 == 0.0:
            # One run per K: N0 does not move the threshold (or is always 0).
            # (the threshold's values chained across rows, as for the runs below)
            kk = np.clip(np.floor(tau0) + 1.0, 0.0, ks + 1.0)
            rows = np.arange(ks.size)
            head, s_k, rel = _threshold_tails(kk, ks, kk, np.ones_like(rows), rows, self.rel)
            lin = (0.5 * ks - tau0) * s_k
            value = np.maximum(head + lin, 0.0)
            err = 3.0 * rel * (head + np.abs(lin))
            err += 2.0 * self.eta * _slope_before(kk, ks, head, s_k, rel)
            inside = _dot(self.pk, value + err)
        else:
            inside = self._banded(tau0, tau1)
        total = (coef / n) * inside + self.skipped
        return min(total * (1.0 + _REL_SLACK), 1.0)

    def _banded(self, tau0: FloatArray, tau1: float) -> float:
        """The inner window by runs and the bands around it, if the bands add at most
        :data:`~aggregator.accountant.bands.BAND_SLACK` of the inner sum; else the outer
        window by runs (:mod:`aggregator.accountant.bands`)."""
        inner, ks, rel = self.inner, self.k, self.rel
        rows = inner.rows
        total = self._grouped(inner, tau0[rows], tau1) if inner.lo.size else 0.0
        b_rows, bottom, prob, mag, eta, pk = self.bands
        band = chernoff_bounds(tau0[b_rows] + tau1 * bottom, ks[b_rows], prob, mag, eta, rel)
        upper = _dot(pk, band)
        if upper <= BAND_SLACK * total:
            return total + upper
        return self._grouped(self.outer, tau0, tau1)

    def _grouped(self, window: _Window, tau0: FloatArray, tau1: float) -> float:
        """``sum_K Pr[K] E[(N1 - tau)_+ ; N0 in window]`` by runs of constant ``k``, over
        the rows of ``window`` (``tau0`` of those rows)."""
        q0 = self.q0
        ks, m0, lo0, hi0 = self.k[window.rows], self.m0[window.rows], window.lo, window.hi
        k_first = np.clip(np.floor(tau0 + tau1 * lo0) + 1.0, 0.0, ks + 1.0)
        k_last = np.clip(np.floor(tau0 + tau1 * hi0) + 1.0, 0.0, ks + 1.0)
        counts = (k_last - k_first).astype(np.int64) + 1
        offsets = np.concatenate(([0], np.cumsum(counts)[:-1]))
        which = np.repeat(np.arange(ks.size), counts)

        def per_run(values: FloatArray) -> FloatArray:
            """``values[which]`` (a row's value at each of its runs), by a repeat."""
            return np.repeat(values, counts)

        k = per_run(k_first) + (np.arange(which.size) - per_run(offsets))
        kk, t0, m, lo, hi = per_run(ks), per_run(tau0), per_run(m0), per_run(lo0), per_run(hi0)
        # Run of k: N0 in [previous end + 1, end], end = ceil((k - tau0)/tau1) - 1 (the last run
        # ends at hi0, the first starts at lo0). Adjacent runs share their boundary, so each
        # cdf value is computed once.
        end = np.where(k == per_run(k_last), hi, np.ceil((k - t0) / tau1) - 1.0)
        end = np.clip(end, lo - 1.0, hi)
        prev = np.empty_like(end)
        prev[1:] = end[:-1]
        prev[offsets] = lo0 - 1.0
        empty = end <= prev
        m1 = np.maximum(m - 1.0, 0.0)
        # cdf values chained along diagonals (aggregator.accountant.chains), their extra
        # rounding added to the budget of every value
        c_end, pmf_end = np.empty_like(end), np.empty_like(end)
        inner = np.ones(end.shape, dtype=bool)
        for side, bound in enumerate(window.ends):
            at = end == per_run(bound)
            c_end[at] = window.c_ends[side][which[at]]
            pmf_end[at] = window.pmf_ends[side][which[at]]
            inner &= ~at
        c_end[inner], pmf_end[inner], extra = chained_lower_cdf(
            end[inner], m[inner], q0, 2.0 * k[inner] - kk[inner], kk[inner]
        )
        c_prev = np.empty_like(c_end)
        c_prev[1:], c_prev[offsets] = c_end[:-1], window.c_ends[0]
        d_end, d_end_mag = _shifted_cdf(end, m, q0, c_end, pmf_end)
        d_prev, d_prev_mag = np.empty_like(d_end), np.empty_like(d_end)
        d_prev[1:], d_prev_mag[1:] = d_end[:-1], d_end_mag[:-1]
        d_prev[offsets], d_prev_mag[offsets] = window.d_first
        prob = (c_end - c_prev) + ((end >= m * q0).astype(np.float64) - (prev >= m * q0))
        # magnitudes for the error budget; |prob| also covers the rounding of 1 - small
        prob_mag = np.abs(c_end) + np.abs(c_prev) + np.abs(prob)
        scale = m * q0
        above = (end - 1.0 >= m1 * q0).astype(np.float64) - (prev - 1.0 >= m1 * q0)
        mass = scale * ((d_end - d_prev) + above)
        mass_mag = scale * (d_end_mag + d_prev_mag) + np.abs(mass)
        head, s_k, rel = _threshold_tails(k, ks, k_last, counts, which, self.rel + extra)
        lin = (0.5 * kk - t0) * s_k
        value = prob * (head + lin) - tau1 * s_k * mass
        value = np.where(empty, 0.0, np.maximum(value, 0.0))
        err = 3.0 * rel * (prob_mag * (head + np.abs(lin)) + tau1 * s_k * mass_mag)
        # rounding of tau: 2 eta S_(k-1) per unit of the run's probability (an upper bound
        # on it: |prob| plus its own error budget)
        run_prob = np.abs(prob) + 3.0 * rel * prob_mag
        err += np.where(
            empty, 0.0, 2.0 * per_run(window.eta) * _slope_before(k, kk, head, s_k, rel) * run_prob
        )
        return _dot(per_run(window.pk), value + err)


def _band_prob(  # noqa: PLR0917 (private helper)
    bottom: FloatArray,
    top: FloatArray,
    m: FloatArray,
    q: float,
    c_bottom: FloatArray,
    c_top: FloatArray,
) -> tuple[FloatArray, FloatArray]:
    """``(Pr[bottom < Bin(m, q) <= top], magnitude)`` from the ``lower_cdf`` values at the
    two ends (as a run's probability in :meth:`_Engine._grouped`); ``(0, 0)`` where the band
    is empty."""
    prob = (c_top - c_bottom) + ((top >= m * q).astype(np.float64) - (bottom >= m * q))
    mag = np.abs(c_top) + np.abs(c_bottom) + np.abs(prob)
    empty = top <= bottom
    return np.where(empty, 0.0, prob), np.where(empty, 0.0, mag)


def _dot(a: FloatArray, b: FloatArray) -> float:
    """``sum a_i b_i`` of non-negative terms: the products rounded once, summed pairwise
    (``numpy.add.reduce`` over one contiguous array, within ``(log2 N + 1) u`` relative,
    inside the final ``1e-9`` slack). Its order depends only on the length, so the value
    is the same in every process, whatever BLAS and its thread count would make of
    ``np.dot`` (its partial sums differed in the last bits between the accountant's
    single-threaded process and the rest); ``math.fsum`` did the same at 100 times the
    cost (a tenth of the engine's time)."""
    products = np.ascontiguousarray(np.multiply(a, b), dtype=np.float64)
    return float(np.add.reduce(products))


def _special_rel_err(  # noqa: PLR0917 (private helper)
    n: int,
    q1: float,
    ks: FloatArray,
    q0: float,
    m0: FloatArray,
    lo0: FloatArray,
    hi0: FloatArray,
) -> float:
    """Relative error budget of one binomial pmf / cdf / sf value of the engine: Boost's
    own (:data:`_SPECIAL_REL_ERR`, checked up to :data:`MAX_N`) plus the effect of the
    binary64 class probabilities. ``q`` off by ``dq`` moves ``log b(k; m, q)`` by at most
    ``|k - m q| dq / (q (1 - q))`` (its derivative in ``q``; a tail's log moves less than
    its boundary's); ``q1 = 2a`` is within ``8 u q1`` of its exact value, ``q0 = b / (1 -
    q1)`` within ``8 u q0 / (1 - q1)`` (``1 - q1`` cancels), and Boost forms ``1 - q``
    with one more absolute ``u``. ``|k - m q|`` is at most the window's extent around the
    mean. Where that is far from negligible (``1 - q1`` tiny: ``t = 2s`` at eps0 near
    zero) the budget grows with it; beyond ``1e-3`` the first-order argument is refused."""
    u = _UNIT_ROUNDOFF
    rel = _SPECIAL_REL_ERR
    if 0.0 < q1 < 1.0:
        reach = float(np.max(np.abs(np.concatenate(([ks[0]], [ks[-1]])) - n * q1)))
        rel += (reach + 1.0) * (8.0 * u * q1 + u) / (q1 * (1.0 - q1))
    if 0.0 < q0 < 1.0:
        mean = m0 * q0
        reach = float(np.max(np.maximum(mean - lo0, hi0 - mean)))
        rel += (reach + 2.0) * (8.0 * u * q0 / (1.0 - q1) + u) / (q0 * (1.0 - q0))
    if not rel <= 1e-3:
        raise ValueError(
            f"the binomial values' error budget ({rel:.3g} relative) is too large to certify "
            f"n={n} at these class probabilities (q1={q1!r}, q0={q0!r})"
        )
    return rel * (1.0 + 1e-6)


def tail_for(delta: float, p: float) -> float:
    """Window tail mass: the added ``4 p tail`` is ``1e-7`` of delta (epsilon moves ~1e-9)."""
    return min(DEFAULT_TAIL * 1e4, 1e-7 * delta / (4.0 * p))


def blanket_delta_curve(
    pair: BlanketPair, *, tail: float = DEFAULT_TAIL
) -> Callable[[float], float]:
    """``eps -> blanket_delta(pair, epsilon=eps, tail=tail)`` with the eps-independent work
    (windows, the pmf of ``K``) done once: for evaluating the certified curve at many eps."""
    tail = check_real("tail", tail)
    if not 0 < tail < 0.5:
        raise ValueError(f"tail must be in (0, 0.5), got {tail}")
    return _Engine(pair, tail).divergence


def blanket_delta_curve_and_floor(
    pair: BlanketPair, *, tail: float = DEFAULT_TAIL
) -> Callable[[float], tuple[float, float]]:
    """``eps -> (blanket_delta(pair, epsilon=eps, tail=tail), floor)`` for ``0 <= eps <
    eps0``, where ``floor`` is the part of the certified value added whatever ``eps`` (the
    skipped mass): a curve within a few times it carries no further information."""
    tail = check_real("tail", tail)
    if not 0 < tail < 0.5:
        raise ValueError(f"tail must be in (0, 0.5), got {tail}")
    engine = _Engine(pair, tail)

    def curve(epsilon: float) -> tuple[float, float]:
        return engine.divergence(epsilon), engine.floor

    return curve


def blanket_delta(pair: BlanketPair, *, epsilon: float, tail: float = DEFAULT_TAIL) -> float:
    """Certified upper bound on the shuffled mechanism's ``delta`` at ``epsilon``.

    ``max(H_{e^eps}(S(R(D)) || S(R(D'))), H_{e^eps}(S(R(D')) || S(R(D))))`` over all
    neighbouring datasets is at most the returned value (module docstring for the proof
    and the numerical certificate). ``tail`` is the mass of each side of the truncation
    windows (``p`` times the skipped mass is added, so it only trades speed for tightness).
    Exactly 0 for ``epsilon >= eps0``.
    """
    epsilon = check_real("epsilon", epsilon)
    if epsilon < 0:
        raise ValueError(f"epsilon must be >= 0, got {epsilon}")
    curve = blanket_delta_curve(pair, tail=tail)
    return 0.0 if epsilon >= pair.epsilon0 else curve(epsilon)


def blanket_epsilon(pair: BlanketPair, *, delta: float, rtol: float = 1e-5) -> float:
    """Certified central epsilon of the shuffled mechanism at ``delta``.

    The smallest ``eps`` in ``[0, eps0]`` with ``blanket_delta(eps) <= delta``, returned as
    the upper end of a final bracket of relative width about ``rtol``: the certified bound
    was evaluated there and found ``<= delta``. Never above ``eps0`` (where the bound is
    exactly 0). The Gaussian first guess is usually within ``rtol / 2``, so the default
    ``rtol = 1e-5`` (five significant digits, more than any report prints) costs two
    evaluations of the bound.
    """
    delta = check_delta(delta)
    rtol = check_real("rtol", rtol)
    if not 0 < rtol < 1:
        raise ValueError(f"rtol must be in (0, 1), got {rtol}")
    if pair.exp_epsilon0 == 1.0:
        return 0.0  # P = Q
    engine = _Engine(pair, tail_for(delta, pair.exp_epsilon0))
    eps0 = pair.epsilon0
    guess = gaussian_guess(n=pair.n, epsilon0=eps0, alpha=pair.hot, delta=delta)
    tol = rtol * (guess if guess > 0 else eps0)
    return search_epsilon(engine.divergence, epsilon0=eps0, delta=delta, tol=tol, guess=guess)
