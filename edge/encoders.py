"""Encoders that bring real data into the mechanisms' domain of ``s``-sparse ternary vectors.

Both have a single-vector path that runs on a device (:func:`edge.device.ternarise`,
:func:`edge.device.pad_key_values`) and a vectorised batch path for simulation with the same
law, plus the inverse maps the aggregator applies to its estimates.
"""

from __future__ import annotations

import math
import secrets
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike, NDArray

from edge import device
from edge._mechanism import GetRandBits
from edge.errors import InputError

F64 = NDArray[np.float64]


def _bits(getrandbits: GetRandBits | None) -> GetRandBits:
    return secrets.randbits if getrandbits is None else getrandbits


def _sample_keys(n: int, d: int, s: int, rng: np.random.Generator) -> NDArray[np.int64]:
    # Uniform s-subsets of [0, d) per row (same law as the device's partial Fisher-Yates).
    if s > d // 2:
        return np.argsort(rng.random((n, d)), axis=1)[:, :s].astype(np.int64)
    keys = rng.integers(0, d, size=(n, s), dtype=np.int64)
    while True:
        srt = np.sort(keys, axis=1)
        bad = np.flatnonzero((np.diff(srt, axis=1) == 0).any(axis=1))
        if bad.size == 0:
            return keys
        keys[bad] = rng.integers(0, d, size=(bad.size, s), dtype=np.int64)


@dataclass(frozen=True, kw_only=True)
class SensorEncoder:
    """Min-max normalisation and stochastic ternary discretisation of sensor vectors.

    Channel ``j`` reads values in ``[lo[j], hi[j]]``; ``v_j = 2 (x_j - lo_j)/(hi_j - lo_j) - 1``.
    An encoded vector keeps ``s`` channels drawn uniformly without replacement, each with
    sign +1 with probability ``(1 + v_j)/2``, so ``E[x_j] = (s/d) v_j`` (unbiased after the
    known scale ``d/s``; ERRATA item 6). :meth:`decode_mean` maps an estimated mean of the
    ternary vectors back to physical units, with a standard error that adds the encoding's
    own variance to the mechanism's.
    """

    lo: tuple[float, ...]
    hi: tuple[float, ...]
    s: int
    clip: bool = False

    def __post_init__(self) -> None:
        lo = tuple(float(v) for v in self.lo)
        hi = tuple(float(v) for v in self.hi)
        if len(lo) != len(hi) or not lo:
            raise InputError(f"need as many lo as hi bounds (>= 1), got {len(lo)} and {len(hi)}")
        for j, (a, b) in enumerate(zip(lo, hi, strict=True)):
            if not (math.isfinite(a) and math.isfinite(b) and a < b):
                raise InputError(f"channel {j}: range [{a}, {b}] must be finite and non-empty")
        if not 1 <= self.s <= len(lo):
            raise InputError(f"s must be in [1, d={len(lo)}], got {self.s}")
        object.__setattr__(self, "lo", lo)
        object.__setattr__(self, "hi", hi)

    @property
    def d(self) -> int:
        return len(self.lo)

    @property
    def scale(self) -> float:
        """``d / s``: the factor from the mean of the ternary vectors to the mean of ``v``."""
        return self.d / self.s

    def encode(
        self, values: Sequence[float], *, getrandbits: GetRandBits | None = None
    ) -> tuple[list[int], list[int]]:
        """One vector (device path): ``(keys, signs)`` of its ternary encoding."""
        try:
            keys, signs = device.ternarise(
                list(values), self.lo, self.hi, self.s, _bits(getrandbits), self.clip
            )
        except ValueError as exc:
            raise InputError(str(exc)) from None
        return keys, signs

    def normalise(self, values: ArrayLike) -> F64:
        """``v`` in ``[-1, 1]`` for a batch ``(n, d)`` of readings (validates them)."""
        x = np.asarray(values, dtype=np.float64)
        if x.ndim != 2 or x.shape[1] != self.d:
            raise InputError(f"readings must have shape (n, {self.d}), got {x.shape}")
        bad = np.argwhere(~np.isfinite(x))
        if bad.size:
            i, j = (int(v) for v in bad[0])
            raise InputError(
                f"row {i}, channel {j}: reading {float(x[i, j])!r} is not a finite number"
            )
        lo = np.array(self.lo)
        hi = np.array(self.hi)
        if not self.clip:
            out = np.argwhere((x < lo) | (x > hi))
            if out.size:
                i, j = (int(v) for v in out[0])
                raise InputError(
                    f"row {i}, channel {j}: reading {float(x[i, j])!r} is outside "
                    f"[{self.lo[j]}, {self.hi[j]}]"
                )
        v: F64 = np.clip(2.0 * (x - lo) / (hi - lo) - 1.0, -1.0, 1.0)
        return v

    def encode_batch(
        self, values: ArrayLike, rng: np.random.Generator
    ) -> tuple[NDArray[np.int64], NDArray[np.int8]]:
        """A batch ``(n, d)`` of readings -> keys ``(n, s)`` and signs ``(n, s)``."""
        v = self.normalise(values)
        keys = _sample_keys(v.shape[0], self.d, self.s, rng)
        chosen = np.take_along_axis(v, keys, axis=1)
        signs = np.where(rng.random(chosen.shape) < (1.0 + chosen) / 2.0, 1, -1).astype(np.int8)
        return keys, signs

    def decode_mean(self, mean: ArrayLike, se: ArrayLike, *, n: int) -> tuple[F64, F64]:
        """Estimated means of the ternary vectors of ``n`` reports, with the aggregator's
        standard errors -> fleet means of the readings in physical units, with standard
        errors that include the encoding's variance (docs/maths.md, "Sensor means").

        The aggregator's ``se`` covers the mechanism's noise around the mean of the encoded
        vectors; the encoding adds ``Var(x_ij | v_i) = s/d - (s/d)^2 v_ij^2`` per report.
        Scaled by ``d/s`` and bounded with ``mean_i v_ij^2 >= vbar_j^2`` (Jensen), the
        variance of the estimated ``vbar_j`` is ``(d/s)^2 se^2 + (d/s - vbar_j^2) / n``,
        with ``vbar_j`` the estimate clipped to ``[-1, 1]``: exact when every device reads the
        same value, above it by the spread of ``v_j`` over the fleet otherwise. ``n = 0``
        gives NaN.
        """
        if n < 0:
            raise InputError(f"n must be >= 0, got {n}")
        half = (np.array(self.hi) - np.array(self.lo)) / 2.0
        centre = np.array(self.lo) + half
        v = self.scale * np.asarray(mean, dtype=np.float64)
        e = self.scale * np.asarray(se, dtype=np.float64)
        if n == 0:
            nan = np.full(np.broadcast(v, e, half).shape, np.nan)
            return nan, nan.copy()
        encoding = (self.scale - np.clip(v, -1.0, 1.0) ** 2) / n
        return centre + half * v, half * np.sqrt(e**2 + encoding)


@dataclass(frozen=True, kw_only=True)
class KeyValueEncoder:
    """PCKV-style padding of key-value data to exactly ``s`` keys (ERRATA item 6).

    Real keys are ``[0, d)``; dummy keys ``[d, d + s)`` pad vectors with fewer than ``s``
    keys, so the mechanism runs on :attr:`mechanism_d` ``= d + s`` dimensions. Values in
    ``[-1, 1]`` become signs (+1 with probability ``(1 + value)/2``). The aggregate's ``freq[j]``
    estimates the share of devices holding key ``j`` and ``cond_mean[j]`` their mean value;
    its interval covers that mean value with ``estimate(..., signs_from_values=True)``
    (docs/estimates.md).
    Vectors with more than ``s`` keys are subsampled (``sample_overflow=True``, which weights
    such a device's keys by ``s/k`` in the frequencies) or rejected.
    """

    d: int
    s: int
    sample_overflow: bool = True

    def __post_init__(self) -> None:
        if self.d < 1 or self.s < 1:
            raise InputError(f"need d >= 1 and s >= 1, got d={self.d}, s={self.s}")

    @property
    def mechanism_d(self) -> int:
        return self.d + self.s

    def encode(
        self, pairs: Mapping[int, float], *, getrandbits: GetRandBits | None = None
    ) -> tuple[list[int], list[int]]:
        """One device's key-value pairs -> ``(keys, signs)`` with exactly ``s`` keys."""
        try:
            return device.pad_key_values(
                [(int(k), float(v)) for k, v in pairs.items()],
                self.d,
                self.s,
                _bits(getrandbits),
                self.sample_overflow,
            )
        except ValueError as exc:
            raise InputError(str(exc)) from None

    def encode_batch(
        self, batch: Sequence[Mapping[int, float]], rng: np.random.Generator
    ) -> tuple[NDArray[np.int64], NDArray[np.int8]]:
        """Many devices' pairs -> keys ``(n, s)`` and signs ``(n, s)``, seeded by ``rng``."""
        n = len(batch)
        keys = np.empty((n, self.s), dtype=np.int64)
        signs = np.empty((n, self.s), dtype=np.int8)

        def bits(k: int) -> int:
            return int(rng.integers(0, 1 << k))

        for i, pairs in enumerate(batch):
            keys[i], signs[i] = self.encode(pairs, getrandbits=bits)
        return keys, signs
