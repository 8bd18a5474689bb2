"""Unbiased streaming estimators with closed-form error bars (Algorithm 2 of the paper).

The state is two integer vectors of length ``d`` and a count, whatever the number of
reports: ``sum_u[j] = sum_i (a_ij - b_ij)`` and ``sum_v[j] = sum_i (a_ij + b_ij)`` with
``a_ij = [H_i(j+) = z_i]``, ``b_ij = [H_i(j-) = z_i]``. Integer sums make adding reports in
any order, or merging states, give bit-identical estimates. From them, with the per-report
moments of :mod:`edge.theory`:

* mean:        ``m_j = sum_u[j] / (n D_mean)``
* frequency:   ``f_j = (sum_v[j] / n - c0) / D_freq``   (share of reports with ``x_j != 0``)
* conditional: ``m_j / f_j``                            (mean of ``x_j`` where it is present)

Each report's estimate of ``x_j`` is unbiased with a variance that depends only on whether
``x_j`` is zero, so ``Var(m_j) = (f_j V_nz + (1 - f_j) V_z) / n``; the standard errors plug in
the estimated ``f_j`` (clipped to ``[0, 1]``). Intervals: ``+- z SE`` for means and
frequencies; for the conditional mean, Fieller's set (the ``theta`` in ``[-1, 1]`` that a
z-test of ``m_j - theta f_j = 0`` accepts), defined even where ``f_j <= 0``; the delta
method's ``cond_mean_se`` is kept for information only. Optional post-processing projects the
item frequencies onto the simplex, as in the paper's experiments; projected estimates have no
standard errors and keep the raw estimates' intervals (docs/estimates.md).
"""

from __future__ import annotations

from dataclasses import dataclass
from statistics import NormalDist
from typing import Any

import numpy as np
from numpy.typing import ArrayLike, NDArray

from aggregator.projection import project_to_simplex
from edge import hashing
from edge._mechanism import SEED_SPACE
from edge.errors import ReportError
from edge.spec import MechanismSpec

F64 = NDArray[np.float64]
_CHUNK_ELEMENTS = 1 << 19
"""Hash matrix elements per chunk (2 MiB of uint32): small enough to stay near the cache,
large enough to amortise numpy calls (1.4x faster than 8 MiB chunks, bench/README.md)."""


def _column_counts(mask: NDArray[np.bool_]) -> NDArray[np.int64]:
    # Summing the uint8 view is about twice as fast as np.count_nonzero(axis=0).
    counts: NDArray[np.int64] = mask.view(np.uint8).sum(axis=0, dtype=np.int64)
    return counts


def validate_reports(
    spec: MechanismSpec, seeds: ArrayLike, z: ArrayLike
) -> tuple[NDArray[np.uint32], NDArray[np.int64]]:
    """Check a batch of reports against ``spec``; :class:`ReportError` names the first bad one."""
    s = np.asarray(seeds)
    zz = np.asarray(z)
    if s.ndim != 1 or zz.shape != s.shape:
        raise ReportError(
            f"seeds and z must be 1-D of one length, got {s.shape} and {zz.shape}", reason="shape"
        )
    if s.size == 0:
        return s.astype(np.uint32), zz.astype(np.int64)
    if not (np.issubdtype(s.dtype, np.integer) and np.issubdtype(zz.dtype, np.integer)):
        raise ReportError("seeds and z must be integers", reason="type")
    bad = np.flatnonzero((zz < 0) | (zz >= spec.t))
    if bad.size:
        raise ReportError(
            f"z must be in [0, {spec.t}); report {int(bad[0])} has z={int(zz[bad[0]])}",
            reason="z_out_of_range",
        )
    bad = np.flatnonzero((s < 0) | (s >= SEED_SPACE))
    if bad.size:
        raise ReportError(
            f"seed must be in [0, 2^32); report {int(bad[0])} has {int(s[bad[0]])}",
            reason="seed_out_of_range",
        )
    return s.astype(np.uint32), zz.astype(np.int64)


class _Kernel:
    """Per-spec precomputed key terms and the chunked hash-and-match loop."""

    def __init__(self, spec: MechanismSpec) -> None:
        self.spec = spec
        j = np.arange(spec.d, dtype=np.int64)
        if spec.mechanism == "coco":
            self.terms = [hashing.key_terms(j)]
        else:
            self.terms = [hashing.key_terms(2 * j + 1), hashing.key_terms(2 * j)]
        self.chunk = max(1, _CHUNK_ELEMENTS // spec.d)

    def sums(
        self, seeds: NDArray[np.uint32], z: NDArray[np.int64]
    ) -> tuple[NDArray[np.int64], NDArray[np.int64]]:
        d = self.spec.d
        sum_u = np.zeros(d, dtype=np.int64)
        sum_v = np.zeros(d, dtype=np.int64)
        for start in range(0, seeds.size, self.chunk):
            sl = slice(start, start + self.chunk)
            u, v = self._chunk(seeds[sl], z[sl])
            sum_u += u
            sum_v += v
        return sum_u, sum_v

    def _chunk(
        self, seeds: NDArray[np.uint32], z: NDArray[np.int64]
    ) -> tuple[NDArray[np.int64], NDArray[np.int64]]:
        t = self.spec.t
        if self.spec.mechanism == "coco":
            half = t // 2
            # a - b is +1/-1 on the dimensions whose pair H1(j) is z's pair, by the sign rule.
            lo, width = hashing.preimage_bounds(z % half, half, 31)
            h = hashing.xxh32(seeds, self.terms[0])
            top = h >> np.uint32(31)
            h &= np.uint32(0x7FFFFFFF)
            h -= lo[:, None]
            match = h < width[:, None]
            agree = top == (z >= half).astype(np.uint32)[:, None]
            agree &= match
            n_match = _column_counts(match)
            return 2 * _column_counts(agree) - n_match, n_match
        lo, width = hashing.preimage_bounds(z, t, 32)
        hits = []
        for terms in self.terms:  # j+ then j-
            h = hashing.xxh32(seeds, terms)
            h -= lo[:, None]
            hits.append(_column_counts(h < width[:, None]))
        a, b = hits
        return a - b, a + b


class AggregateState:
    """Streaming, mergeable sufficient statistics of reports for one spec.

    Memory is ``O(d)`` whatever the number of reports. Reports may be added in any order and
    states merged: the integer sums are exact, so the estimates are identical to one pass.
    """

    def __init__(self, spec: MechanismSpec) -> None:
        self.spec = spec
        self.n = 0
        self.sum_u = np.zeros(spec.d, dtype=np.int64)
        self.sum_v = np.zeros(spec.d, dtype=np.int64)
        self._kernel = _Kernel(spec)

    def add(self, seeds: ArrayLike, z: ArrayLike) -> None:
        """Add a batch of reports (all or none: a bad report raises before any is counted)."""
        s, zz = validate_reports(self.spec, seeds, z)
        if s.size == 0:
            return
        u, v = self._kernel.sums(s, zz)
        self.sum_u += u
        self.sum_v += v
        self.n += int(s.size)

    def merge(self, other: AggregateState) -> None:
        """Fold another state of the same spec into this one."""
        if other.spec.canonical() != self.spec.canonical():
            raise ReportError(
                f"cannot merge states of different specs ({other.spec.fingerprint} into "
                f"{self.spec.fingerprint})",
                reason="spec_mismatch",
            )
        self.n += other.n
        self.sum_u += other.sum_u
        self.sum_v += other.sum_v

    def copy(self) -> AggregateState:
        out = AggregateState(self.spec)
        out.merge(self)
        return out

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready state (for checkpoints)."""
        return {
            "spec": self.spec.to_dict(),
            "n": self.n,
            "sum_u": self.sum_u.tolist(),
            "sum_v": self.sum_v.tolist(),
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> AggregateState:
        spec = MechanismSpec.from_dict(data["spec"])
        state = cls(spec)
        sum_u = np.asarray(data["sum_u"], dtype=np.int64)
        sum_v = np.asarray(data["sum_v"], dtype=np.int64)
        n = int(data["n"])
        if sum_u.shape != (spec.d,) or sum_v.shape != (spec.d,) or n < 0:
            raise ReportError("state arrays do not match the spec", reason="bad_state")
        state.n, state.sum_u, state.sum_v = n, sum_u, sum_v
        return state

    def estimate(
        self,
        *,
        confidence: float = 0.95,
        projection: bool = False,
        signs_from_values: bool = False,
    ) -> Estimates:
        """Current estimates (see :func:`estimate`)."""
        return estimate(
            self,
            confidence=confidence,
            projection=projection,
            signs_from_values=signs_from_values,
        )


@dataclass(frozen=True, kw_only=True)
class Estimates:
    """Per-dimension estimates, standard errors and ``confidence`` intervals.

    ``mean[j]`` estimates the average of ``x_j`` over reports, ``freq[j]`` the share of
    reports with ``x_j != 0``, ``cond_mean[j]`` the average of ``x_j`` over those reports
    (NaN where the estimated ``freq[j] <= 0``). ``*_lo``/``*_hi`` bound intervals that hold
    the true value with probability ``confidence`` (normal approximation; docs/estimates.md):
    ``mean`` and ``freq`` are ``+-`` the halfwidth around the raw estimate, ``cond_mean``'s is
    Fieller's, within ``[-1, 1]`` and defined even where ``cond_mean`` is not (NaN only when
    it is empty), for the mean of the signs or, with ``signs_from_values``, of the values.
    The intervals always come from the raw, unbiased estimates, so they hold with
    ``projected`` too; the projected point estimates are biased and have no standard error
    (``*_se`` are NaN then). ``cond_mean_se`` is the delta method's, for information only:
    ``cond_mean +- z cond_mean_se`` is not a calibrated interval. With ``n == 0`` every value
    is NaN.
    """

    n: int
    confidence: float
    projected: bool
    mean: F64
    mean_se: F64
    mean_lo: F64
    mean_hi: F64
    freq: F64
    freq_se: F64
    freq_lo: F64
    freq_hi: F64
    cond_mean: F64
    cond_mean_se: F64
    cond_mean_lo: F64
    cond_mean_hi: F64

    @property
    def z_score(self) -> float:
        return z_score(self.confidence)

    @property
    def mean_halfwidth(self) -> F64:
        """Half the width of the mean's interval (also when ``projected``)."""
        half: F64 = (self.mean_hi - self.mean_lo) / 2
        return half

    @property
    def freq_halfwidth(self) -> F64:
        """Half the width of the frequency's interval (also when ``projected``)."""
        half: F64 = (self.freq_hi - self.freq_lo) / 2
        return half

    def to_dict(self) -> dict[str, Any]:
        def arr(a: F64) -> list[float | None]:
            return [None if not np.isfinite(x) else float(x) for x in a]

        out: dict[str, Any] = {
            "n": self.n,
            "confidence": self.confidence,
            "projected": self.projected,
        }
        for name in _ARRAY_FIELDS:
            out[name] = arr(getattr(self, name))
        return out


_ARRAY_FIELDS = (
    "mean",
    "mean_se",
    "mean_lo",
    "mean_hi",
    "freq",
    "freq_se",
    "freq_lo",
    "freq_hi",
    "cond_mean",
    "cond_mean_se",
    "cond_mean_lo",
    "cond_mean_hi",
)
"""The per-dimension arrays of :class:`Estimates`, in the order of ``to_dict``."""


def z_score(confidence: float) -> float:
    """Two-sided normal quantile of ``confidence`` (1.95996... for 0.95)."""
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")
    return NormalDist().inv_cdf(0.5 + confidence / 2)


def fieller_interval(
    mean: F64, freq: F64, *, var_mean: F64, var_freq: F64, cov_unit: F64, z: float
) -> tuple[F64, F64]:
    """Hull of Fieller's confidence set for ``theta = mean / freq`` within ``[-1, 1]``.

    At the true ``theta`` the raw estimates satisfy ``E[mean - theta freq] = 0``, with
    variance ``V(theta) = var_mean + theta^2 (var_freq - 2 cov_unit)`` (the covariance of the
    estimates is ``theta * cov_unit`` there, :meth:`ReportMoments.mean_freq_covariance`).
    The set ``{theta in [-1, 1]: (mean - theta freq)^2 <= z^2 V(theta)}`` inverts that
    test: a quadratic inequality ``A theta^2 - 2 B theta + C <= 0``. Its hull's ends are
    among ``-1``, ``1`` and the real roots in between; an empty set gives NaN.
    """
    a = freq**2 - z**2 * (var_freq - 2 * cov_unit)
    b = mean * freq
    c = mean**2 - z**2 * var_mean
    disc = np.maximum(b**2 - a * c, 0.0)
    real = b**2 - a * c >= 0
    with np.errstate(divide="ignore", invalid="ignore"):
        q = b + np.where(b >= 0, 1.0, -1.0) * np.sqrt(disc)  # stable roots q/a and c/q
        roots = np.stack([q / a, c / q])
    ends = np.array([-1.0, 1.0])[:, None] * np.ones_like(mean)
    g = a * ends**2 - 2 * b * ends + c
    inside = real & np.isfinite(roots) & (np.abs(roots) <= 1.0)
    cand = np.concatenate([ends, roots])
    ok = np.concatenate([g <= 0, inside])
    lo: F64 = np.where(ok, cand, np.inf).min(axis=0)
    hi: F64 = np.where(ok, cand, -np.inf).max(axis=0)
    empty = ~ok.any(axis=0)
    lo[empty] = np.nan
    hi[empty] = np.nan
    return lo, hi


def estimate(
    state: AggregateState,
    *,
    confidence: float = 0.95,
    projection: bool = False,
    signs_from_values: bool = False,
) -> Estimates:
    """Unbiased estimates, closed-form standard errors and intervals from ``state``.

    ``signs_from_values=True``: the non-zero ``x_j`` are signs drawn from values in
    ``[-1, 1]`` with ``E[sign] = value`` (the key-value and sensor encoders), and the
    conditional-mean interval is for the holders' mean *value* ``theta``, not the mean of
    their signs: the sign draw adds ``1 - value^2`` per holder, at most ``f (1 - theta^2) / n``
    in all (Jensen), to Fieller's variance (docs/maths.md, "Intervals").

    ``projection=True`` applies the paper's post-processing: the item frequencies
    ``(f + m)/2`` and ``(f - m)/2`` of the ``2d`` elements, divided by ``s``, are projected onto
    the probability simplex (each report holds exactly ``s`` elements). This lowers the total
    squared error but makes the estimates biased, with no closed-form standard error: the
    ``*_se`` are NaN and the intervals stay those of the raw estimates (:class:`Estimates`).
    """
    z = z_score(confidence)
    spec, n = state.spec, state.n
    d = spec.d
    if n == 0:
        nan = np.full(d, np.nan)
        return Estimates(
            n=0,
            confidence=confidence,
            projected=projection,
            **dict.fromkeys(_ARRAY_FIELDS, nan),
        )
    mo = spec.moments
    mean = state.sum_u / (n * mo.d_mean)
    freq = (state.sum_v / n - mo.c0) / mo.d_freq
    f_plug = np.clip(freq, 0.0, 1.0)
    m_plug = np.clip(mean, -f_plug, f_plug)
    var_mean = mo.mean_variance(f_plug) / n
    var_freq = mo.freq_variance(f_plug) / n
    cov = mo.mean_freq_covariance(m_plug) / n
    mean_se, freq_se = np.sqrt(var_mean), np.sqrt(var_freq)
    # Sign noise f (1 - theta^2) / n: a constant in V(theta) and -f/n in its theta^2 term.
    sign_noise = f_plug / n if signs_from_values else np.zeros(d)
    cond_lo, cond_hi = fieller_interval(
        mean,
        freq,
        var_mean=var_mean + sign_noise,
        var_freq=var_freq,
        cov_unit=mo.mean_freq_covariance(f_plug) / n + sign_noise / 2,
        z=z,
    )
    intervals = {
        "mean_lo": mean - z * mean_se,
        "mean_hi": mean + z * mean_se,
        "freq_lo": freq - z * freq_se,
        "freq_hi": freq + z * freq_se,
        "cond_mean_lo": cond_lo,
        "cond_mean_hi": cond_hi,
    }
    if projection:
        items = np.concatenate([(freq + mean) / 2, (freq - mean) / 2]) / spec.s
        proj = project_to_simplex(items) * spec.s
        mean = proj[:d] - proj[d:]
        freq = proj[:d] + proj[d:]
    with np.errstate(divide="ignore", invalid="ignore"):
        cond = mean / freq
        ratio = np.clip(cond, -1.0, 1.0)
        var_cond = (var_mean - 2 * ratio * cov + ratio**2 * var_freq) / freq**2
        cond_se = np.sqrt(np.maximum(var_cond, 0.0))
    bad = ~(freq > 0)
    cond[bad] = np.nan
    cond_se[bad] = np.nan
    if projection:
        mean_se, freq_se, cond_se = (np.full(d, np.nan) for _ in range(3))
    return Estimates(
        n=n,
        confidence=confidence,
        projected=projection,
        mean=mean,
        mean_se=mean_se,
        freq=freq,
        freq_se=freq_se,
        cond_mean=cond,
        cond_mean_se=cond_se,
        **intervals,
    )
