"""What CoCo and Collision share: input validation, the public surface, batch plumbing."""

from __future__ import annotations

import secrets
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from fractions import Fraction

import numpy as np
from numpy.typing import ArrayLike, NDArray

from edge import device
from edge.errors import InputError
from edge.spec import MechanismSpec
from edge.theory import Mechanism

GetRandBits = Callable[[int], int]
SEED_SPACE = 1 << 32


def sparse_from_dense(x: ArrayLike, *, d: int, s: int) -> tuple[list[int], list[int]]:
    """Keys and signs of a dense ternary vector with exactly ``s`` non-zero entries."""
    arr = np.asarray(x)
    if arr.shape != (d,):
        raise InputError(f"input must have shape ({d},), got {arr.shape}")
    if not np.issubdtype(arr.dtype, np.number) or np.issubdtype(arr.dtype, np.complexfloating):
        raise InputError(f"input must be numeric, got dtype {arr.dtype}")
    bad = np.flatnonzero((arr != 0) & (arr != 1) & (arr != -1))
    if bad.size:
        j = int(bad[0])
        raise InputError(f"input must be ternary (-1, 0, +1); x[{j}] = {arr[j].item()!r}")
    keys = np.flatnonzero(arr)
    if keys.size != s:
        raise InputError(f"input must have exactly s={s} non-zero entries, got {keys.size}")
    return [int(j) for j in keys], [int(arr[j]) for j in keys]


def sparse_batch_from_dense(
    X: ArrayLike, *, d: int, s: int
) -> tuple[NDArray[np.int64], NDArray[np.int8]]:
    """Row-wise keys ``(n, s)`` and signs ``(n, s)`` of a dense ``(n, d)`` ternary batch."""
    arr = np.asarray(X)
    if arr.ndim != 2 or arr.shape[1] != d:
        raise InputError(f"batch must have shape (n, {d}), got {arr.shape}")
    bad = (arr != 0) & (arr != 1) & (arr != -1)
    if bad.any():
        i, j = (int(v) for v in np.argwhere(bad)[0])
        raise InputError(f"batch must be ternary; X[{i}, {j}] = {arr[i, j].item()!r}")
    counts = np.count_nonzero(arr, axis=1)
    wrong = np.flatnonzero(counts != s)
    if wrong.size:
        i = int(wrong[0])
        raise InputError(f"every row needs exactly s={s} non-zero entries; row {i} has {counts[i]}")
    rows, cols = np.nonzero(arr)
    keys = cols.reshape(arr.shape[0], s).astype(np.int64)
    signs = arr[rows, cols].reshape(arr.shape[0], s).astype(np.int8)
    return keys, signs


def check_sparse_batch(
    keys: ArrayLike, signs: ArrayLike, *, d: int, s: int
) -> tuple[NDArray[np.int64], NDArray[np.int8]]:
    """Validate a sparse batch: ``(n, s)`` distinct keys in ``[0, d)`` and signs +1/-1."""
    k = np.asarray(keys)
    b = np.asarray(signs)
    if k.ndim != 2 or k.shape[1] != s or b.shape != k.shape:
        raise InputError(f"keys and signs must both have shape (n, {s}); got {k.shape}, {b.shape}")
    if k.size and (k.min() < 0 or k.max() >= d):
        raise InputError(f"keys must be in [0, {d}); found {int(k.min())}..{int(k.max())}")
    if not np.isin(b, (-1, 1)).all():
        raise InputError("signs must be +1 or -1")
    srt = np.sort(k, axis=1)
    dup = np.flatnonzero((np.diff(srt, axis=1) == 0).any(axis=1))
    if dup.size:
        raise InputError(f"row {int(dup[0])} repeats a key")
    return k.astype(np.int64), b.astype(np.int8)


def nth_free(q: NDArray[np.int64], used_sorted: NDArray[np.int64]) -> NDArray[np.int64]:
    """Row-wise :func:`edge.device._nth_free`: the ``q``-th value not in ``used_sorted``.

    ``used_sorted`` is ascending along rows and may repeat values (repeats count once).
    """
    out = q.copy()
    prev = np.full(out.shape, -1, dtype=np.int64)
    for col in range(used_sorted.shape[1]):
        u = used_sorted[:, col]
        out += (u != prev) & (u <= out)
        prev = u
    return out


class LocalMechanism(ABC):
    """An eps-LDP randomiser of ``s``-sparse ternary vectors into one report ``(seed, z)``.

    Subclasses implement the output law three ways that must agree: exactly
    (:meth:`exact_probabilities`), one report with the standard library only (the device
    path, :mod:`edge.device`), and vectorised over a batch (:meth:`randomise_sparse`).
    """

    mechanism: Mechanism

    def __init__(self, *, d: int, s: int, epsilon: float, t: int | None = None) -> None:
        self.spec = MechanismSpec(mechanism=self.mechanism, d=d, s=s, epsilon=epsilon, t=t)  # type: ignore[arg-type]

    @classmethod
    def from_spec(cls, spec: MechanismSpec) -> LocalMechanism:
        """The mechanism object for ``spec`` (CoCo or Collision by ``spec.mechanism``)."""
        from edge.coco import CoCo  # noqa: PLC0415 (they subclass this module's class)
        from edge.collision import Collision  # noqa: PLC0415

        kind = CoCo if spec.mechanism == "coco" else Collision
        return kind(d=spec.d, s=spec.s, epsilon=spec.epsilon, t=spec.t)

    def __repr__(self) -> str:
        sp = self.spec
        return f"{type(self).__name__}(d={sp.d}, s={sp.s}, epsilon={sp.epsilon}, t={sp.t})"

    @property
    def d(self) -> int:
        return self.spec.d

    @property
    def s(self) -> int:
        return self.spec.s

    @property
    def epsilon(self) -> float:
        return self.spec.epsilon

    @property
    def t(self) -> int:
        return self.spec.t

    # -- exact law -------------------------------------------------------------------------

    @abstractmethod
    def _exact(self, keys: Sequence[int], signs: Sequence[int], seed: int) -> list[Fraction]:
        """Output law for a validated sparse input under the hashes of ``seed``."""

    def exact_probabilities(self, x: ArrayLike, seed: int) -> list[Fraction]:
        """The output distribution of ``z`` for input ``x`` under the hashes of ``seed``,
        as exact fractions (length ``t``, summing to 1)."""
        keys, signs = sparse_from_dense(x, d=self.d, s=self.s)
        return self._exact(keys, signs, _check_seed(seed))

    def probabilities(self, x: ArrayLike, seed: int) -> NDArray[np.float64]:
        """:meth:`exact_probabilities` as a float array of shape ``(t,)``."""
        return np.array([float(p) for p in self.exact_probabilities(x, seed)])

    # -- one report (device path) ----------------------------------------------------------

    def _device_randomise(
        self, keys: Sequence[int], signs: Sequence[int], seed: int, getrandbits: GetRandBits
    ) -> int:
        """``z`` from :mod:`edge.device` for a validated sparse input."""
        sample = device.randomise_coco if self.mechanism == "coco" else device.randomise_collision
        sp = self.spec
        return sample(
            list(keys), list(signs), sp.d, sp.s, sp.t, sp.exp_eps_weight, seed, getrandbits
        )

    def randomise(self, x: ArrayLike, *, getrandbits: GetRandBits | None = None) -> tuple[int, int]:
        """One report ``(seed, z)`` for the dense input ``x``.

        Uses only :mod:`edge.device` (standard library). ``getrandbits`` defaults to
        :func:`secrets.randbits`; the seed is drawn from it too.
        """
        keys, signs = sparse_from_dense(x, d=self.d, s=self.s)
        return self.randomise_keys(keys, signs, getrandbits=getrandbits)

    def randomise_keys(
        self,
        keys: Sequence[int],
        signs: Sequence[int],
        *,
        getrandbits: GetRandBits | None = None,
    ) -> tuple[int, int]:
        """One report ``(seed, z)`` for a sparse input given as keys and signs."""
        device.check_sparse(list(keys), list(signs), self.d, self.s)
        bits = secrets.randbits if getrandbits is None else getrandbits
        seed = bits(32)
        return seed, self._device_randomise(list(keys), list(signs), seed, bits)

    # -- batches (simulation) --------------------------------------------------------------

    @abstractmethod
    def _batch_z(
        self,
        keys: NDArray[np.int64],
        signs: NDArray[np.int8],
        seeds: NDArray[np.uint32],
        rng: np.random.Generator,
    ) -> NDArray[np.int64]:
        """Vectorised sampler: the device algorithm, row by row, with numpy randomness."""

    def randomise_sparse(
        self, keys: ArrayLike, signs: ArrayLike, rng: np.random.Generator
    ) -> tuple[NDArray[np.uint32], NDArray[np.int64]]:
        """Reports ``(seeds, z)`` for a batch given as keys ``(n, s)`` and signs ``(n, s)``.

        Statistically identical to calling :meth:`randomise_keys` on every row.
        """
        k, b = check_sparse_batch(keys, signs, d=self.d, s=self.s)
        seeds = np.asarray(
            rng.integers(0, SEED_SPACE, size=k.shape[0], dtype=np.uint32), dtype=np.uint32
        )
        return seeds, self._batch_z(k, b, seeds, rng)

    def randomise_batch(
        self, X: ArrayLike, rng: np.random.Generator
    ) -> tuple[NDArray[np.uint32], NDArray[np.int64]]:
        """Reports ``(seeds, z)`` for a dense batch ``X`` of shape ``(n, d)``."""
        keys, signs = sparse_batch_from_dense(X, d=self.d, s=self.s)
        return self.randomise_sparse(keys, signs, rng)


def _check_seed(seed: int) -> int:
    if isinstance(seed, bool) or not isinstance(seed, int | np.integer):
        raise InputError(f"seed must be an integer, got {seed!r}")
    if not 0 <= int(seed) < SEED_SPACE:
        raise InputError(f"seed must be in [0, 2^32), got {seed}")
    return int(seed)
