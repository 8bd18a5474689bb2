"""Empirical tightness audit of the shuffle amplification bounds on the paper's worst case.

The construction (paper, Theorem "Amplification Lower Bounds", ``the:lower``)
-------------------------------------------------------------------------------
``(d, s, eps0, t)``-Collision with ``t >= 3s``, neighbouring datasets
``D = (x1, x*, ..., x*)`` and ``D' = (x1', x*, ..., x*)`` of ``n`` users, and a hash family in
which, for every hash function ``H``, the images ``H(Y_x1)``, ``H(Y_x1')`` and ``H(Y_x*)`` are
pairwise disjoint sets of ``s`` buckets (the theorem chooses the family; with the product's
seeded XXH32 this holds for some seeds only, and the tests realise it by keeping those seeds).

Under such an ``H`` a report's bucket ``z`` falls in one of four *classes*: ``H(Y_x1)``,
``H(Y_x1')``, ``H(Y_x*)`` or elsewhere. Write ``p = e^eps0``, ``Omega = s p + t - s`` and
``a = s / Omega`` (ERRATA item 4's clone probability). Every bucket of a user's own image has
probability ``p / Omega`` and every other bucket ``1 / Omega`` (no collisions inside an
image), so the class laws are

====================  ==========  ==========  ==========  ====================
input                 H(Y_x1)     H(Y_x1')    H(Y_x*)     elsewhere
====================  ==========  ==========  ==========  ====================
``x1``                ``p a``     ``a``       ``a``       ``r = 1 - (p + 2) a``
``x1'``               ``a``       ``p a``     ``a``       ``r``
``x*``                ``a``       ``a``       ``p a``     ``r``
====================  ==========  ==========  ==========  ====================

and, given its class, a report's ``(H, z)`` has the same law whatever the input.

Reduction to counts
-------------------
Let ``(N1, N2, N3, N0)`` count the shuffled reports per class. The shuffled view under ``D``
has probability ``prod_j R(x*)(m_j) * (1/n) sum_j r(m_j)`` (the changed user sits at a
uniform position), with ``r = p, 1, 1/p, 1`` on the four classes; so relative to the
all-``x*`` reference dataset the likelihood of the view is

    L_D  = (p N1 + N2 + N3 / p + N0) / n,        L_D' = (N1 + p N2 + N3 / p + N0) / n,

a function of the class counts only: **the counts are a sufficient statistic** of the
shuffled view for ``(D, D')``, hence ``D_e^eps(view_D || view_D') = D_e^eps(counts_D ||
counts_D')`` exactly and the counts can be simulated directly (one multinomial per run)
instead of n reports. Under the reference ``(N1, N2, N3, N0) ~ Mult(n; a, a, p a, r)``.

The theorem post-processes further, into the *pair of counts* ``(N1, N2)``, whose law under
``D`` / ``D'`` is exactly the stronger-clone pair ``(P_a, Q_a)`` with the mechanism-specific
clone probability (``C = N1 + N2 - [first user in class 1 or 2]``). The pair drops ``N3``,
which carries information about which dataset was used (it enters ``L_D`` and ``L_D'``
alike, but their *ratio* depends on it). By data processing the view's divergence is at
least the pair's, and it is strictly larger whenever the ratio is not a function of
``(N1, N2)`` alone: the construction of the lower bound theorem itself exceeds the paper's
upper bound of Theorem "Amplification Upper Bounds" (which is the pair's divergence).

Exact divergences
-----------------
With ``f = n (L_D - e^eps L_D')``, ``D_e^eps(view) = E_ref[f_+] / n`` and
``D_e^eps(pair) = E_ref[(E[f | N1, N2])_+] / n``. Conditioning on ``K = N1 + N2 ~ Bin(n, 2a)``,
``N1 | K ~ Bin(K, 1/2)`` and ``N3 | K ~ Bin(n - K, q3)``, ``q3 = p a / (1 - 2a)``:

    f = (p - 1)(1 + e^eps) N1 + (1 - p e^eps) K + (1 - e^eps)(n - K) + c3 N3,
    c3 = (e^eps - 1)(1 - 1/p) >= 0,

linear in ``N3``. Per cell ``(K, N1)`` the pair's term is ``(E f)_+`` and the view exceeds
it by the Jensen gap ``E[f_+] - (E f)_+`` = ``E[f_-]`` if ``E f >= 0`` else ``E[f_+]``, a
binomial tail expectation computed in closed form (no cancellation between the two
divergences: the excess is summed from non-negative terms). The lattice window keeps
``K`` and ``N1`` within their ``1e-24`` quantiles (the dropped mass, at most ``4e-24``,
bounds the truncation error). Both directions are equal by the swap of classes 1 and 2.

Monte Carlo
-----------
Counts are simulated under ``D`` and ``D'`` (``runs`` each, seeded). For each eps the
estimate is the plug-in ``P^(S) - e^eps Q^(S)`` on the optimal event ``S = {f > 0}`` (for the
view) or ``{E[f | N1, N2] > 0}`` (for the pair): ``S`` is fixed by the theory, not fitted to
the samples, so the estimate is unbiased with standard error
``sqrt(P(1-P)/runs + e^(2 eps) Q(1-Q)/runs)``, and the Clopper-Pearson lower bound of
``P(S)`` minus ``e^eps`` times the upper bound of ``Q(S)`` (each at ``(1 - level)/2``) is a
lower confidence bound on the divergence at level ``level``: any event gives a lower bound.
(Summing ``(P^ - e^eps Q^)_+`` over all cells of the histogram instead would be biased
upwards by the noise of ~1e5 cells.)

The audit of the paper's settings is :mod:`sim.experiments.tightness_audit`; the files it
writes (``coco experiment tightness``) are :mod:`sim.experiments.tightness_report`'s.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

import numpy as np
from numpy.typing import NDArray
from scipy import stats

from edge.spec import MechanismSpec

__all__ = [
    "MonteCarlo",
    "WorstCase",
    "class_laws",
    "epsilon_at",
    "exact_divergences",
    "monte_carlo",
    "sample_counts",
]

FloatArray = NDArray[np.float64]
IntArray = NDArray[np.int64]

_QUANTILE: Final = 1e-24
"""Each side of every binomial window drops at most this mass."""


@dataclass(frozen=True, kw_only=True, slots=True)
class WorstCase:
    """The lower bound theorem's neighbouring datasets for ``(s, eps0, t)``-Collision.

    ``exp_epsilon0`` is ``p = e^eps0`` (the realised ``E/U`` when built from a spec) and
    ``clone_probability`` is ``a = s / (s p + t - s)``; ``t >= 3s`` (``r >= 0``) is required.
    """

    n: int
    exp_epsilon0: float
    clone_probability: float

    def __post_init__(self) -> None:
        if self.n < 2:
            raise ValueError(f"n must be >= 2, got {self.n}")
        if not self.exp_epsilon0 > 1.0:
            raise ValueError(f"exp_epsilon0 must be > 1, got {self.exp_epsilon0}")
        a = self.clone_probability
        if not a > 0.0 or (self.exp_epsilon0 + 2.0) * a > 1.0 + 1e-12:
            raise ValueError(f"clone_probability must be in (0, 1/(e^eps0 + 2)] (t >= 3s), got {a}")

    @classmethod
    def for_collision(cls, *, n: int, s: int, t: int, epsilon0: float) -> WorstCase:
        """The construction for real-valued ``e^eps0`` (the paper's figures)."""
        if t < 3 * s:
            raise ValueError(f"the construction needs t >= 3s, got s={s}, t={t}")
        p = math.exp(epsilon0)
        return cls(n=n, exp_epsilon0=p, clone_probability=s / (s * p + t - s))

    @classmethod
    def from_spec(cls, spec: MechanismSpec, *, n: int) -> WorstCase:
        """The construction for a Collision spec, with its realised ``E/U`` and ``s U/Omega``."""
        if spec.mechanism != "collision":
            raise ValueError(f"the construction is for Collision, got {spec.mechanism}")
        if spec.t < 3 * spec.s:
            raise ValueError(f"the construction needs t >= 3s, got s={spec.s}, t={spec.t}")
        a = spec.s * spec.unit_weight / spec.omega_weight
        return cls(n=n, exp_epsilon0=spec.exp_epsilon, clone_probability=a)

    @property
    def epsilon0(self) -> float:
        return math.log(self.exp_epsilon0)

    @property
    def rest(self) -> float:
        """``r``: probability of a bucket outside the three images."""
        return max(0.0, 1.0 - (self.exp_epsilon0 + 2.0) * self.clone_probability)


def class_laws(wc: WorstCase) -> tuple[FloatArray, FloatArray, FloatArray]:
    """Class probabilities (H(Y_x1), H(Y_x1'), H(Y_x*), elsewhere) of ``x1``, ``x1'``, ``x*``."""
    p, a, r = wc.exp_epsilon0, wc.clone_probability, wc.rest
    return (
        np.array([p * a, a, a, r]),
        np.array([a, p * a, a, r]),
        np.array([a, a, p * a, r]),
    )


# --------------------------------------------------------------------------------------------
# exact divergences


def _window(n: FloatArray | float, q: float) -> tuple[FloatArray, FloatArray]:
    """``[lo, hi]`` quantile window of ``Bin(n, q)`` dropping at most ``_QUANTILE`` per side."""
    # the upper quantile as n minus the lower quantile of the complement (isf loses accuracy)
    lo = np.asarray(stats.binom.ppf(_QUANTILE, n, q), dtype=np.float64)
    lo_c = np.asarray(stats.binom.ppf(_QUANTILE, n, 1.0 - q), dtype=np.float64)
    lo = np.where(np.isfinite(lo), np.maximum(lo - 1.0, 0.0), 0.0)
    hi = np.where(np.isfinite(lo_c), np.minimum(n - lo_c + 1.0, n), n)
    return lo, hi


def _upper_partial(c: FloatArray, big_n: FloatArray, q: float) -> tuple[FloatArray, FloatArray]:
    """``E[(X - c)_+]`` and ``E[(c - X)_+]`` for ``X ~ Bin(big_n, q)``, elementwise.

    ``sum_{x >= x0} x Pr[X = x] = big_n q Pr[Bin(big_n - 1, q) >= x0 - 1]`` gives the upper
    tail from one survival function pair; the lower part is the same with cdfs. Each is
    clipped at 0 (the exact values are non-negative).
    """
    x0 = np.floor(c) + 1.0  # first x with x - c > 0 (x - c = 0 at an integer c adds nothing)
    mean = big_n * q
    m1 = np.maximum(big_n - 1.0, 0.0)  # big_n = 0: X = 0 and the mean terms vanish
    up = mean * stats.binom.sf(x0 - 2.0, m1, q) - c * stats.binom.sf(x0 - 1.0, big_n, q)
    # E[(c - X)_+] = sum_{x <= x0 - 1} (c - x) Pr[X = x]
    down = c * stats.binom.cdf(x0 - 1.0, big_n, q) - mean * stats.binom.cdf(x0 - 2.0, m1, q)
    return np.maximum(np.asarray(up, dtype=np.float64), 0.0), np.maximum(
        np.asarray(down, dtype=np.float64), 0.0
    )


def exact_divergences(wc: WorstCase, epsilon: float) -> tuple[float, float]:
    """``(D_e^eps(pair), D_e^eps(view))`` of the construction, exactly (module docstring).

    ``pair`` is the law of ``(N1, N2)``, i.e. the stronger-clone pair ``(P_a, Q_a)``: the
    paper's mechanism-specific delta. ``view`` is the whole shuffled output. Computed by
    sums over the lattice (not a certified bound: special functions in float64, window
    truncation: at most ``4e-24 e^eps0`` absolute).
    """
    if epsilon < 0:
        raise ValueError(f"epsilon must be >= 0, got {epsilon}")
    n, p, a = wc.n, wc.exp_epsilon0, wc.clone_probability
    if epsilon >= wc.epsilon0:
        return 0.0, 0.0
    e = math.exp(epsilon)
    q3 = p * a / (1.0 - 2.0 * a)
    c3 = (e - 1.0) * (1.0 - 1.0 / p)
    k_lo, k_hi = _window(float(n), 2.0 * a)
    ks = np.arange(float(k_lo), float(k_hi) + 1.0)
    w_k = np.asarray(stats.binom.pmf(ks, n, 2.0 * a), dtype=np.float64)
    lo, hi = _window(ks, 0.5)
    sizes = (hi - lo + 1.0).astype(np.int64)
    k = np.repeat(ks, sizes)
    offsets = np.arange(int(sizes.sum())) - np.repeat(np.cumsum(sizes) - sizes, sizes)
    n1 = np.repeat(lo, sizes) + offsets
    weight = np.repeat(w_k, sizes) * np.asarray(stats.binom.pmf(n1, k, 0.5), dtype=np.float64)
    rest = n - k  # reports outside the two images: N3 ~ Bin(rest, q3)
    g = (p - 1.0) * (1.0 + e) * n1 + (1.0 - p * e) * k + (1.0 - e) * rest
    mean_f = g + c3 * rest * q3
    pair = float(np.dot(weight, np.maximum(mean_f, 0.0))) / n
    if c3 == 0.0:
        return pair, pair
    # f = g + c3 N3 = c3 (N3 - c), c = -g / c3
    up, down = _upper_partial(-g / c3, rest, q3)
    gap = np.where(mean_f >= 0.0, down, up) * c3
    view = pair + float(np.dot(weight, gap)) / n
    return pair, view


# --------------------------------------------------------------------------------------------
# Monte Carlo


def sample_counts(wc: WorstCase, *, changed: int, runs: int, rng: np.random.Generator) -> IntArray:
    """Class counts ``(N1, N2, N3, N0)`` of ``runs`` shuffled outputs, shape ``(runs, 4)``.

    ``changed`` is 0 for ``D`` (first user holds ``x1``) and 1 for ``D'`` (``x1'``); the
    other ``n - 1`` users hold ``x*``. By the module docstring's sufficiency argument these
    counts carry everything the shuffled view says about ``D`` versus ``D'``.
    """
    if changed not in (0, 1):
        raise ValueError(f"changed must be 0 or 1, got {changed}")
    first, _, other = class_laws(wc)
    if changed == 1:
        first = first[[1, 0, 2, 3]]
    counts: IntArray = np.asarray(
        rng.multinomial(wc.n - 1, other / other.sum(), size=runs), dtype=np.int64
    )
    cls = rng.choice(4, size=runs, p=first / first.sum())
    counts[np.arange(runs), cls] += 1
    return counts


def _statistics(wc: WorstCase, counts: IntArray, epsilon: float) -> tuple[FloatArray, FloatArray]:
    """``f`` (view) and ``E[f | N1, N2]`` (pair) for each sampled count vector."""
    n, p, a = wc.n, wc.exp_epsilon0, wc.clone_probability
    e = math.exp(epsilon)
    q3 = p * a / (1.0 - 2.0 * a)
    n1, n2, n3 = (counts[:, j].astype(np.float64) for j in range(3))
    k = n1 + n2
    rest = n - k
    g = (p - 1.0) * (1.0 + e) * n1 + (1.0 - p * e) * k + (1.0 - e) * rest
    c3 = (e - 1.0) * (1.0 - 1.0 / p)
    return g + c3 * n3, g + c3 * rest * q3


@dataclass(frozen=True, kw_only=True, slots=True)
class MonteCarlo:
    """Monte Carlo estimate of one hockey-stick divergence at one eps.

    ``estimate`` is unbiased, ``stderr`` its standard error, ``lower`` / ``upper`` the
    Clopper-Pearson confidence bounds at ``level`` (two-sided, Bonferroni over P and Q).
    """

    epsilon: float
    runs: int
    estimate: float
    stderr: float
    lower: float
    upper: float
    level: float


def _clopper_pearson(hits: int, runs: int, tail: float) -> tuple[float, float]:
    lo = 0.0 if hits == 0 else float(stats.beta.ppf(tail, hits, runs - hits + 1))
    hi = 1.0 if hits == runs else float(stats.beta.ppf(1.0 - tail, hits + 1, runs - hits))
    return lo, hi


def _estimate(hits_p: int, hits_q: int, runs: int, epsilon: float, level: float) -> MonteCarlo:
    e = math.exp(epsilon)
    p_hat, q_hat = hits_p / runs, hits_q / runs
    var = (p_hat * (1 - p_hat) + e * e * q_hat * (1 - q_hat)) / runs
    tail = (1.0 - level) / 4.0  # two one-sided bounds for each of P and Q
    p_lo, p_hi = _clopper_pearson(hits_p, runs, tail)
    q_lo, q_hi = _clopper_pearson(hits_q, runs, tail)
    return MonteCarlo(
        epsilon=epsilon,
        runs=runs,
        estimate=p_hat - e * q_hat,
        stderr=math.sqrt(var),
        lower=p_lo - e * q_hi,
        upper=p_hi - e * q_lo,
        level=level,
    )


def monte_carlo(
    wc: WorstCase,
    epsilons: list[float],
    *,
    runs: int,
    rng: np.random.Generator,
    level: float = 0.999,
) -> tuple[list[MonteCarlo], list[MonteCarlo]]:
    """Simulated ``(pair, view)`` divergence estimates at each eps (one sample for all eps)."""
    under_d = sample_counts(wc, changed=0, runs=runs, rng=rng)
    under_d2 = sample_counts(wc, changed=1, runs=runs, rng=rng)
    pair: list[MonteCarlo] = []
    view: list[MonteCarlo] = []
    for eps in epsilons:
        f_d, fp_d = _statistics(wc, under_d, eps)
        f_d2, fp_d2 = _statistics(wc, under_d2, eps)
        view.append(_estimate(int((f_d > 0).sum()), int((f_d2 > 0).sum()), runs, eps, level))
        pair.append(_estimate(int((fp_d > 0).sum()), int((fp_d2 > 0).sum()), runs, eps, level))
    return pair, view


# --------------------------------------------------------------------------------------------
# epsilon at a delta


def epsilon_at(divergence: Callable[[float], float], *, epsilon0: float, delta: float) -> float:
    """Smallest eps in ``[0, eps0]`` with ``divergence(eps) <= delta`` (bisection, ~1e-10)."""
    lo, hi = 0.0, epsilon0
    if divergence(0.0) <= delta:
        return 0.0
    while hi - lo > 1e-10 * max(epsilon0, 1.0):
        mid = 0.5 * (lo + hi)
        if divergence(mid) <= delta:
            hi = mid
        else:
            lo = mid
    return hi
