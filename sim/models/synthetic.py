"""Synthetic s-sparse ternary data, as in the paper's experiments (section "Experiments")."""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray


def random_sparse(
    n: int, d: int, s: int, rng: np.random.Generator
) -> tuple[NDArray[np.int64], NDArray[np.int8]]:
    """``n`` vectors with ``s`` distinct keys uniform in ``[0, d)`` and signs +1/-1 equally likely.

    Keys are drawn by rejection (redraw any row with a repeat), which gives a uniform
    ``s``-subset per row and needs only ``O(n s)`` memory.
    """
    if not 1 <= s <= d:
        raise ValueError(f"need 1 <= s <= d, got s={s}, d={d}")
    if s > d // 2:
        keys = np.argsort(rng.random((n, d)), axis=1)[:, :s].astype(np.int64)
    else:
        keys = rng.integers(0, d, size=(n, s), dtype=np.int64)
        while True:
            srt = np.sort(keys, axis=1)
            bad = np.flatnonzero((np.diff(srt, axis=1) == 0).any(axis=1))
            if bad.size == 0:
                break
            keys[bad] = rng.integers(0, d, size=(bad.size, s), dtype=np.int64)
    signs = np.where(rng.random((n, s)) < 0.5, -1, 1).astype(np.int8)
    return keys, signs


def sparse_totals(
    keys: NDArray[np.int64], signs: NDArray[np.int8], d: int
) -> tuple[NDArray[np.int64], NDArray[np.int64]]:
    """Per-dimension ``sum_i x_ij`` and ``sum_i [x_ij != 0]`` of a sparse batch."""
    total = np.bincount(keys.ravel(), weights=signs.ravel(), minlength=d).astype(np.int64)
    present = np.bincount(keys.ravel(), minlength=d).astype(np.int64)
    return total, present
