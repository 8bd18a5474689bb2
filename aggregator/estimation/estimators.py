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
the estimated ``f_j`` (clipped to ``[0, 1]``). Intervals: ``+- z SE`` for means; for
frequencies ``+- z SE`` where the dimension's bucket count is large enough for the normal
approximation, and the score interval where it is not (:func:`frequency_intervals`); for the
conditional mean, Fieller's set (the ``theta`` in ``[-1, 1]`` that a
z-test of ``m_j - theta f_j = 0`` accepts), defined even where ``f_j <= 0``; the delta
method's ``cond_mean_se`` is kept for information only. Optional post-processing projects the
item frequencies onto the simplex, as in the paper's experiments; projected estimates have no
standard errors and keep the raw estimates' intervals (docs/estimates.md).
"""

from __future__ import annotations

import functools
import threading
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import ArrayLike, NDArray

from aggregator.estimation.intervals import (
    fieller_interval,
    frequency_intervals,
    z_score,
)
from aggregator.estimation.projection import project_to_simplex
from edge import hashing
from edge._mechanism import SEED_SPACE
from edge.errors import ReportError
from edge.spec import MechanismSpec

F64 = NDArray[np.float64]
_CHUNK_ELEMENTS = 1 << 17
"""Hash matrix elements per chunk (512 KiB of uint32, reused): the chunk's few buffers stay
near the cache, and numpy's per-call cost is amortised (bench/README.md)."""
_LANE_ROWS = 255
"""Rows summed at once in byte lanes (:func:`_column_counts`): a byte cannot overflow."""


def _column_counts(mask: NDArray[np.bool_], d: int, out: NDArray[np.int64]) -> None:
    """Add the column sums of ``mask[:, :d]`` to ``out``.

    ``mask`` is C-contiguous with a row width that is a multiple of 8, so each row is a run
    of ``uint64`` words holding 8 columns each, one per byte. Summing up to 255 rows of
    words adds the 8 columns in parallel without a carry crossing bytes (SWAR); the bytes of
    the sum are then the column counts. About 5x faster than ``sum(axis=0)`` of the bytes.
    """
    if mask.shape[0] > 4 * _LANE_ROWS:  # many short rows (small d): one sum beats many
        out += mask[:, :d].view(np.uint8).sum(axis=0, dtype=np.int64)
        return
    words = mask.view(np.uint64)
    for start in range(0, words.shape[0], _LANE_ROWS):
        lanes = np.add.reduce(words[start : start + _LANE_ROWS], axis=0)
        out += lanes.view(np.uint8)[:d]


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
    if zz.min() < 0 or zz.max() >= spec.t:  # the common case costs two reductions
        bad = np.flatnonzero((zz < 0) | (zz >= spec.t))
        raise ReportError(
            f"z must be in [0, {spec.t}); report {int(bad[0])} has z={int(zz[bad[0]])}",
            reason="z_out_of_range",
        )
    if s.min() < 0 or s.max() >= SEED_SPACE:
        bad = np.flatnonzero((s < 0) | (s >= SEED_SPACE))
        raise ReportError(
            f"seed must be in [0, 2^32); report {int(bad[0])} has {int(s[bad[0]])}",
            reason="seed_out_of_range",
        )
    return s.astype(np.uint32, copy=False), zz.astype(np.int64, copy=False)


class _Buffers:
    """Scratch arrays of one chunk, allocated once per kernel and thread."""

    def __init__(self, rows: int, d: int) -> None:
        width = -(-d // 8) * 8  # rows of whole uint64 words for _column_counts
        self.h = np.empty((rows, d), dtype=np.uint32)
        self.tmp = np.empty((rows, d), dtype=np.uint32)
        self.mask = np.zeros((rows, width), dtype=np.bool_)


class _Kernel:
    """Per-spec precomputed key terms and the chunked hash-and-match loop.

    Both mechanisms reduce to counting, per dimension, the reports whose hash falls in one
    of two windows ``[lo, lo + width)`` (:func:`edge.hashing.preimage_bounds`): ``a_ij`` and
    ``b_ij`` of the module docs. The chunk's buffers are reused (one set per thread, since
    states of one spec may be filled in several threads at once): no allocation of the
    size of the hash matrix per chunk.
    """

    def __init__(self, mechanism: str, d: int, t: int) -> None:
        self.mechanism, self.d, self.t = mechanism, d, t
        j = np.arange(d, dtype=np.int64)
        if mechanism == "coco":
            self.terms = [hashing.key_terms(j)]
        else:
            self.terms = [hashing.key_terms(2 * j + 1), hashing.key_terms(2 * j)]
        self.chunk = max(1, _CHUNK_ELEMENTS // d)
        self._local = threading.local()

    def _buffers(self) -> _Buffers:
        buffers: _Buffers | None = getattr(self._local, "buffers", None)
        if buffers is None:
            buffers = self._local.buffers = _Buffers(self.chunk, self.d)
        return buffers

    def sums(
        self, seeds: NDArray[np.uint32], z: NDArray[np.int64]
    ) -> tuple[NDArray[np.int64], NDArray[np.int64]]:
        d = self.d
        a = np.zeros(d, dtype=np.int64)
        b = np.zeros(d, dtype=np.int64)
        # The windows of the whole batch first (O(n)), then the hash matrix chunk by chunk.
        passes: list[tuple[NDArray[np.uint32], list[tuple[NDArray[np.uint32], NDArray[np.int64]]]]]
        if self.mechanism == "coco":
            half = self.t // 2
            # H(j+) = z iff H1(j) is z's pair (low 31 bits in the preimage of z % half) and
            # the top bit is the sign z's half implies; H(j-) = z iff the top bit is the
            # other one. So a and b are two windows of the full 32-bit hash.
            low, width = hashing.preimage_bounds(z % half, half, 31)
            lo_a = low + np.where(z >= half, np.uint32(1 << 31), np.uint32(0))
            lo_b = lo_a ^ np.uint32(1 << 31)
            passes = [(self.terms[0], [(lo_a, a), (lo_b, b)])]
        else:
            lo, width = hashing.preimage_bounds(z, self.t, 32)
            passes = [(self.terms[0], [(lo, a)]), (self.terms[1], [(lo, b)])]  # j+, j-
        buf = self._buffers()
        for start in range(0, seeds.size, self.chunk):
            sl = slice(start, start + self.chunk)
            chunk = seeds[sl]
            m = chunk.size
            h, tmp, mask = buf.h[:m], buf.tmp[:m], buf.mask[:m]
            w = width[sl, None]
            for terms, windows in passes:
                hashing.xxh32_into(chunk, terms, out=h, tmp=tmp)
                for lo_, out in windows:
                    # out[j] += #{i : (h[i, j] - lo[i]) mod 2^32 < width[i]}
                    np.subtract(h, lo_[sl, None], out=tmp)
                    np.less(tmp, w, out=mask[:, :d])
                    _column_counts(mask, d, out)
        return a - b, a + b


@functools.lru_cache(maxsize=16)
def _kernel(mechanism: str, d: int, t: int) -> _Kernel:
    """One kernel (and its buffers) per hash family, shared by every state of it: the
    service makes a state per batch."""
    return _Kernel(mechanism, d, t)


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
        self._kernel = _kernel(spec.mechanism, spec.d, spec.t)

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

    @classmethod
    def of(
        cls, spec: MechanismSpec, *, n: int, sum_u: ArrayLike, sum_v: ArrayLike
    ) -> AggregateState:
        """A state holding these sums (copied), e.g. a row of the per-round series."""
        state = cls(spec)
        state.n = int(n)
        state.sum_u = np.array(sum_u, dtype=np.int64)
        state.sum_v = np.array(sum_v, dtype=np.int64)
        return state

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
    the true value with probability ``confidence`` (docs/estimates.md): ``mean``'s is ``+-``
    the halfwidth around the raw estimate, ``freq``'s too where ``freq_score[j]`` is false
    and the score interval where it is true (small bucket counts, :func:`frequency_intervals`;
    not centred on ``freq``), ``cond_mean``'s is
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
    freq_score: NDArray[np.bool_]
    """Per dimension: ``freq_lo``/``freq_hi`` are the score interval (the bucket count's
    estimated variance is below :func:`normal_count_threshold`), not ``freq +- z freq_se``."""
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
            values: list[float | None] = np.asarray(a, dtype=np.float64).tolist()
            for i in np.flatnonzero(~np.isfinite(a)).tolist():  # JSON has no NaN
                values[i] = None
            return values

        out: dict[str, Any] = {
            "n": self.n,
            "confidence": self.confidence,
            "projected": self.projected,
        }
        for name in ARRAY_FIELDS:
            out[name] = arr(getattr(self, name))
        out["freq_interval"] = ["score" if b else "normal" for b in self.freq_score.tolist()]
        return out


ARRAY_FIELDS = (
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
    spec, n = state.spec, state.n
    d = spec.d
    if n == 0:
        z_score(confidence)  # a bad confidence is refused all the same
        nan = np.full(d, np.nan)
        return Estimates(
            n=0,
            confidence=confidence,
            projected=projection,
            freq_score=np.zeros(d, dtype=np.bool_),
            **dict.fromkeys(ARRAY_FIELDS, nan),
        )
    fields = _estimate_fields(
        spec,
        n,
        state.sum_u,
        state.sum_v,
        confidence=confidence,
        projection=projection,
        signs_from_values=signs_from_values,
    )
    return Estimates(n=n, confidence=confidence, projected=projection, **fields)


def estimate_rows(
    spec: MechanismSpec,
    n: NDArray[np.int64],
    sum_u: NDArray[np.int64],
    sum_v: NDArray[np.int64],
    *,
    confidence: float = 0.95,
    signs_from_values: bool = False,
) -> dict[str, NDArray[Any]]:
    """The estimates of many states at once: row ``i`` of each array (``n`` of shape
    ``(R,)``, the sums ``(R, d)``) is what :func:`estimate` gives for a state holding
    ``n[i]``, ``sum_u[i]``, ``sum_v[i]``, bit for bit (the same element-wise operations,
    broadcast over rows), rows of no report NaN. The sums may hold any ``k <= d`` columns
    of the ``d`` (each dimension is estimated on its own): those dimensions' estimates.
    Keys: the array fields of :class:`Estimates` and ``freq_score``, each ``(R, k)``; no
    projection."""
    counts = np.asarray(n, dtype=np.int64)
    rows = len(counts)
    shape = np.shape(sum_u)
    if len(shape) != 2 or shape[0] != rows or shape[1] > spec.d or np.shape(sum_v) != shape:
        raise ValueError(
            f"sums of shape ({rows}, k <= {spec.d}) expected, got {shape} and {np.shape(sum_v)}"
        )
    empty = counts == 0
    safe = np.where(empty, 1, counts)[:, None]
    with np.errstate(divide="ignore", invalid="ignore"):
        fields = _estimate_fields(
            spec,
            safe,
            np.asarray(sum_u, dtype=np.int64),
            np.asarray(sum_v, dtype=np.int64),
            confidence=confidence,
            projection=False,
            signs_from_values=signs_from_values,
        )
    if empty.any():
        for name in ARRAY_FIELDS:
            fields[name][empty] = np.nan
        fields["freq_score"][empty] = False
    return fields


def _estimate_fields(
    spec: MechanismSpec,
    n: int | NDArray[np.int64],
    sum_u: NDArray[np.int64],
    sum_v: NDArray[np.int64],
    *,
    confidence: float,
    projection: bool,
    signs_from_values: bool,
) -> dict[str, NDArray[Any]]:
    """The arrays of :func:`estimate` (``n > 0``): element-wise, so ``n`` may be one count
    per row of 2-D sums (:func:`estimate_rows`); ``projection`` only for one state."""
    z = z_score(confidence)
    d = spec.d
    mo = spec.moments
    mean = sum_u / (n * mo.d_mean)
    freq = (sum_v / n - mo.c0) / mo.d_freq
    f_plug = np.clip(freq, 0.0, 1.0)
    m_plug = np.clip(mean, -f_plug, f_plug)
    var_mean = mo.mean_variance(f_plug) / n
    var_freq = mo.freq_variance(f_plug) / n
    cov = mo.mean_freq_covariance(m_plug) / n
    mean_se, freq_se = np.sqrt(var_mean), np.sqrt(var_freq)
    # Sign noise f (1 - theta^2) / n: a constant in V(theta) and -f/n in its theta^2 term.
    sign_noise = f_plug / n if signs_from_values else np.zeros_like(f_plug)
    cond_lo, cond_hi = fieller_interval(
        mean,
        freq,
        var_mean=var_mean + sign_noise,
        var_freq=var_freq,
        cov_unit=mo.mean_freq_covariance(f_plug) / n + sign_noise / 2,
        z=z,
    )
    freq_lo, freq_hi, freq_score = frequency_intervals(sum_v, n, mo, confidence=confidence)
    intervals = {
        "mean_lo": mean - z * mean_se,
        "mean_hi": mean + z * mean_se,
        "freq_lo": freq_lo,
        "freq_hi": freq_hi,
        "cond_mean_lo": cond_lo,
        "cond_mean_hi": cond_hi,
    }
    if projection:
        if np.ndim(mean) != 1:
            raise ValueError("the projection is of one state's estimates")
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
    return {
        "mean": mean,
        "mean_se": mean_se,
        "freq": freq,
        "freq_se": freq_se,
        "freq_score": freq_score,
        "cond_mean": cond,
        "cond_mean_se": cond_se,
        **intervals,
    }
