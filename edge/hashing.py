"""Vectorised hash family (version 1), bit-identical to :mod:`edge.device`.

The aggregator evaluates the hash of every dimension for every report, so this is its hot
path: XXH32 of a 4-byte key in ``uint32`` numpy arithmetic (wrap-around is the point), and
membership tests written as a range check on the raw 32-bit hash instead of a range
reduction, which saves a 64-bit multiply per element.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

from edge import device

U32 = NDArray[np.uint32]

_P2 = np.uint32(device._PRIME32_2)
_P3 = np.uint32(device._PRIME32_3)
_P4 = np.uint32(device._PRIME32_4)
_SEED_OFFSET = np.uint32((device._PRIME32_5 + 4) & device._M32)
_S13, _S15, _S16, _S17 = (np.uint32(k) for k in (13, 15, 16, 17))


def key_terms(keys: NDArray[np.integer]) -> U32:
    """Per-key part of XXH32's first round with its constant, ``key * PRIME32_3 + PRIME32_5
    + 4`` (precompute once per spec; the round then adds the seed)."""
    return (np.asarray(keys).astype(np.uint32) * _P3 + _SEED_OFFSET).astype(np.uint32)


def xxh32(seeds: NDArray[np.integer], terms: U32) -> U32:
    """XXH32 for every pair (seed, key): shape ``seeds.shape + terms.shape[-1:]``.

    ``terms`` comes from :func:`key_terms`; it is either 1-D (the same keys for every seed)
    or has one row per seed.
    """
    base = np.asarray(seeds).astype(np.uint32)
    h = np.empty(np.broadcast_shapes((*base.shape, 1), terms.shape), dtype=np.uint32)
    return xxh32_into(base, terms, out=h, tmp=np.empty_like(h))


def xxh32_into(seeds: U32, terms: U32, *, out: U32, tmp: U32) -> U32:
    """:func:`xxh32` written into ``out``, with ``tmp`` (same shape) as scratch: no
    allocation of the size of the hash matrix (the aggregator reuses both per chunk).

    ``seeds`` is ``uint32``; ``out`` and ``tmp`` have shape ``seeds.shape + (k,)``.
    """
    h = out
    np.add(seeds[..., None], terms, out=h)
    np.right_shift(h, _S15, out=tmp)  # rotl(h, 17)
    h <<= _S17
    h |= tmp
    h *= _P4
    np.right_shift(h, _S15, out=tmp)
    h ^= tmp
    h *= _P2
    np.right_shift(h, _S13, out=tmp)
    h ^= tmp
    h *= _P3
    np.right_shift(h, _S16, out=tmp)
    h ^= tmp
    return h


def fastrange(h: U32, n: int | NDArray[np.integer]) -> NDArray[np.int64]:
    """``(h * n) >> 32``: 32-bit hashes reduced to ``[0, n)``."""
    return ((h.astype(np.uint64) * np.asarray(n, dtype=np.uint64)) >> np.uint64(32)).astype(
        np.int64
    )


def fastrange31(h: U32, n: int) -> NDArray[np.int64]:
    """``((h & 0x7FFFFFFF) * n) >> 31``: CoCo's pair index H1 from the low 31 bits."""
    low = (h & np.uint32(0x7FFFFFFF)).astype(np.uint64)
    return ((low * np.uint64(n)) >> np.uint64(31)).astype(np.int64)


def preimage_bounds(values: NDArray[np.integer], n: int, bits: int) -> tuple[U32, U32]:
    """``(lo, width)`` with ``(x * n) >> bits == v  <=>  (x - lo) mod 2^32 < width``.

    ``lo = ceil(v 2^bits / n)``; ``width = ceil((v+1) 2^bits / n) - lo``. Lets the aggregator
    test "does key j hash to the reported bucket" with one subtraction and one comparison.
    """
    if n < 2 and bits >= 32:
        raise ValueError(f"a range of size {n} has a preimage wider than uint32")
    v = np.asarray(values).astype(np.int64)
    scale = 1 << bits
    lo = (v * scale + n - 1) // n
    hi = ((v + 1) * scale + n - 1) // n
    return lo.astype(np.uint32), (hi - lo).astype(np.uint32)
