"""Closed-form moments of the per-report statistics behind every estimator.

For a report ``(seed, z)`` and a dimension ``j`` the aggregator observes two indicators,
``a = [H(j+) = z]`` and ``b = [H(j-) = z]``, and forms

* ``u = a - b``: ``E[u | x_j] = x_j * D_mean``; the mean estimator is ``u / D_mean``;
* ``v = a + b``: ``E[v | x_j] = c0 + [x_j != 0] * D_freq`` with ``c0 = 2/t``; the
  non-missing frequency estimator is ``(v - c0) / D_freq``.

Their variances depend only on whether ``x_j`` is zero, which is what makes closed-form error
bars possible. Everything here assumes ideal (fully random) hashing, the model under which
the paper's estimators are unbiased; the Monte Carlo tests check that the real hash family
(XXH32) matches it.

Collision (Definition 1; our exact derivation, replacing the paper's factor-2 bound). With
``p = E/Omega`` and ``q = 1/t``: ``H(j-)`` is independent of everything the output depends on
when ``x_j = +1`` (and symmetrically), so ``a`` and ``b`` are *independent* Bernoullis:
``(p, q)`` when ``x_j = +1`` and ``(q, q)`` when ``x_j = 0``. Hence ``D_mean = D_freq = p - q``,
``Var(u) = Var(v) = p(1-p) + q(1-q)`` (non-zero) or ``2 q (1-q)`` (zero), and
``Cov(u, v | x_j = +1) = p(1-p) - q(1-q)``. The per-report MSE summed over dimensions is
therefore exactly half the paper's bound (proof of Theorem "upperbound").

CoCo (Algorithm 1, Lemma "cocomse", ERRATA items 1-3). With ``Omega = s(E+U) + (t-2s)U``,
``P_f = 1/t``, the pair of a non-zero dimension always carries ``(E+U)/Omega``, and
``P_ow = 1 - (t^s - (t-2)^s) / (2 s t^(s-1))``:
``P_t = P_ow (E+U)/(2 Omega) + (1 - P_ow) E/Omega``,
``P_o = P_ow (E+U)/(2 Omega) + (1 - P_ow) U/Omega``.
``a`` and ``b`` are exclusive (the two buckets of one pair), so ``D_mean = P_t - P_o``,
``Var(u) = (P_t + P_o) - (P_t - P_o)^2`` or ``2 P_f``; ``D_freq = P_t + P_o - 2 P_f``,
``Var(v) = (P_t+P_o)(1-P_t-P_o)`` or ``2 P_f (1 - 2 P_f)``;
``Cov(u, v | x_j = +1) = (P_t - P_o)(1 - P_t - P_o)``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal, TypeVar

if TYPE_CHECKING:  # numpy is imported where it is used: a spec needs it only to pick t
    import numpy as np
    from numpy.typing import NDArray

Mechanism = Literal["coco", "collision"]
FloatOrArray = TypeVar("FloatOrArray", float, "NDArray[np.float64]")


@dataclass(frozen=True, kw_only=True, slots=True)
class ReportMoments:
    """Per-report, per-dimension moments of ``u = a - b`` and ``v = a + b`` (module docs)."""

    d_mean: float
    """``E[u | x_j = +1]``: the mean estimator divides ``u`` by this."""
    d_freq: float
    """``E[v | x_j != 0] - E[v | x_j = 0]``: the frequency estimator divides by this."""
    c0: float
    """``E[v | x_j = 0] = 2/t``."""
    var_u_nonzero: float
    var_u_zero: float
    var_v_nonzero: float
    var_v_zero: float
    cov_uv_positive: float
    """``Cov(u, v | x_j = +1)``; it is the negative of this for ``x_j = -1`` and 0 for 0."""

    def mean_variance(self, freq: FloatOrArray) -> FloatOrArray:
        """Variance of one report's mean estimate ``u / d_mean`` of a dimension whose
        non-missing frequency among the reports is ``freq``."""
        return (freq * self.var_u_nonzero + (1.0 - freq) * self.var_u_zero) / self.d_mean**2

    def freq_variance(self, freq: FloatOrArray) -> FloatOrArray:
        """Variance of one report's frequency estimate ``(v - c0) / d_freq``."""
        return (freq * self.var_v_nonzero + (1.0 - freq) * self.var_v_zero) / self.d_freq**2

    def mean_freq_covariance(self, mean: FloatOrArray) -> FloatOrArray:
        """Covariance of one report's mean and frequency estimates, given the true mean."""
        return mean * self.cov_uv_positive / (self.d_mean * self.d_freq)

    def mean_mse(self, d: int, s: int) -> float:
        """Sum over dimensions of the variance of one report's mean estimates (``n = 1``)."""
        return s * self.mean_variance(1.0) + (d - s) * self.mean_variance(0.0)

    def freq_mse(self, d: int, s: int) -> float:
        """Sum over dimensions of the variance of one report's frequency estimates."""
        return s * self.freq_variance(1.0) + (d - s) * self.freq_variance(0.0)


def overwrite_probability(s: int, t: int) -> float:
    """``P_ow``: chance that a non-zero dimension's pair is taken by a later one (ERRATA 3).

    ``1 - (t^s - (t-2)^s) / (2 s t^(s-1)) = 1 - t (1 - (1 - 2/t)^s) / (2 s)``, evaluated with
    ``expm1``/``log1p`` so that large ``s`` and ``t`` lose no precision.
    """
    return 1.0 - t * -math.expm1(s * math.log1p(-2.0 / t)) / (2.0 * s)


def collision_moments(*, s: int, t: int, exp_eps_weight: int, unit: int) -> ReportMoments:
    """Exact per-report moments of Collision (module docs)."""
    omega = s * exp_eps_weight + (t - s) * unit
    p = exp_eps_weight / omega
    q = 1.0 / t
    var_nz = p * (1 - p) + q * (1 - q)
    var_z = 2 * q * (1 - q)
    return ReportMoments(
        d_mean=p - q,
        d_freq=p - q,
        c0=2 * q,
        var_u_nonzero=var_nz,
        var_u_zero=var_z,
        var_v_nonzero=var_nz,
        var_v_zero=var_z,
        cov_uv_positive=p * (1 - p) - q * (1 - q),
    )


def coco_rates(*, s: int, t: int, exp_eps_weight: int, unit: int) -> tuple[float, float, float]:
    """``(P_t, P_o, P_f)`` of CoCo (section "Mechanism Design", ERRATA 1-3)."""
    omega = s * (exp_eps_weight + unit) + (t - 2 * s) * unit
    pow_ = overwrite_probability(s, t)
    pair = (exp_eps_weight + unit) / omega
    p_t = pow_ * pair / 2 + (1 - pow_) * exp_eps_weight / omega
    p_o = pow_ * pair / 2 + (1 - pow_) * unit / omega
    return p_t, p_o, 1.0 / t


def coco_moments(*, s: int, t: int, exp_eps_weight: int, unit: int) -> ReportMoments:
    """Exact per-report moments of CoCo (Lemma "cocomse" with ERRATA items 1-3)."""
    p_t, p_o, p_f = coco_rates(s=s, t=t, exp_eps_weight=exp_eps_weight, unit=unit)
    pair = p_t + p_o
    diff = p_t - p_o
    return ReportMoments(
        d_mean=diff,
        d_freq=pair - 2 * p_f,
        c0=2 * p_f,
        var_u_nonzero=pair - diff**2,
        var_u_zero=2 * p_f,
        var_v_nonzero=pair * (1 - pair),
        var_v_zero=2 * p_f * (1 - 2 * p_f),
        cov_uv_positive=diff * (1 - pair),
    )


def moments(
    mechanism: Mechanism, *, s: int, t: int, exp_eps_weight: int, unit: int
) -> ReportMoments:
    """Per-report moments of ``mechanism`` (dispatch)."""
    if mechanism == "coco":
        return coco_moments(s=s, t=t, exp_eps_weight=exp_eps_weight, unit=unit)
    return collision_moments(s=s, t=t, exp_eps_weight=exp_eps_weight, unit=unit)


def valid_t_range(mechanism: Mechanism, s: int) -> tuple[int, int]:
    """Smallest allowed ``t`` and the step between allowed values.

    CoCo needs an even ``t >= 2s + 2`` (Algorithm 1); Collision needs ``t > s`` so that a
    free bucket always exists (Definition 1).
    """
    if mechanism == "coco":
        return 2 * s + 2, 2
    return s + 1, 1


MAX_T = 65535
"""Largest output domain: ``z`` travels as an unsigned 16-bit integer."""


def mean_mse_curve(
    mechanism: Mechanism, *, d: int, s: int, exp_eps_weight: int, unit: int, t: NDArray[np.int64]
) -> NDArray[np.float64]:
    """:meth:`ReportMoments.mean_mse` for an array of ``t`` values at once (same formulas)."""
    import numpy as np  # noqa: PLC0415

    tf = t.astype(np.float64)
    e_w, u = float(exp_eps_weight), float(unit)
    q = 1.0 / tf
    if mechanism == "coco":
        omega = s * (e_w + u) + (tf - 2 * s) * u
        pow_ = 1.0 - tf * -np.expm1(s * np.log1p(-2.0 / tf)) / (2.0 * s)
        pair = (e_w + u) / omega
        diff = (1.0 - pow_) * (e_w - u) / omega
        var_nz, var_z = pair - diff**2, 2 * q
    else:
        omega = s * e_w + (tf - s) * u
        p = e_w / omega
        diff = p - q
        var_nz, var_z = p * (1 - p) + q * (1 - q), 2 * q * (1 - q)
    mse: NDArray[np.float64] = (s * var_nz + (d - s) * var_z) / diff**2
    return mse


def optimal_t(mechanism: Mechanism, *, d: int, s: int, exp_eps_weight: int, unit: int) -> int:
    """The allowed ``t`` that minimises the closed-form mean MSE (ties: the smallest ``t``).

    The MSE is a smooth function of ``t`` with one minimum near ``s e^eps + c s``; we scan all
    allowed values up to four times past that region (and at most :data:`MAX_T`) and keep the
    best, which is exact rather than the paper's rule of thumb (docs/choosing-t.md).
    """
    t_min, step = valid_t_range(mechanism, s)
    exp_eps = exp_eps_weight / unit
    t_max = min(MAX_T, max(t_min + 8 * step, int(4 * (s * exp_eps + 3 * s)) + 16))
    if t_max < t_min:
        return t_min
    import numpy as np  # noqa: PLC0415

    ts = np.arange(t_min, t_max + 1, step, dtype=np.int64)
    curve = mean_mse_curve(mechanism, d=d, s=s, exp_eps_weight=exp_eps_weight, unit=unit, t=ts)
    return int(ts[int(np.argmin(curve))])


def paper_t(mechanism: Mechanism, *, s: int, exp_eps: float) -> int:
    """The paper's rule of thumb for ``t`` (for comparison only).

    CoCo: ``ceil(e^eps s + s + 2)`` rounded up to even (Theorem "cocomse");
    Collision: ``floor(s e^eps + 2 s - 1)`` (Figure "shuffle" caption).
    """
    if mechanism == "coco":
        t = math.ceil(exp_eps * s + s + 2)
        return t + (t % 2)
    return max(s + 1, math.floor(s * exp_eps + 2 * s - 1))
