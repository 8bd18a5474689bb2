"""The paper's synthetic populations (section "Experiments").

Each of the ``n`` users independently holds an ``s``-sparse ternary vector of dimension ``d``:
the ``s`` non-zero coordinates are a uniformly random ``s``-subset of ``[d]`` and each is
``+1`` or ``-1`` with probability 1/2. The paper uses this model because every mechanism it
compares is data-independent (the error law does not depend on the true values), so no real
data set is needed.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray


@dataclass(frozen=True)
class Population:
    """``n`` users as ``keys`` ``(n, s)`` and ``signs`` ``(n, s)`` (the
    :mod:`sim.experiments.baselines.base` layout), with their true statistics."""

    keys: NDArray[np.int64]
    signs: NDArray[np.int8]
    d: int

    @property
    def n(self) -> int:
        return int(self.keys.shape[0])

    @property
    def s(self) -> int:
        return int(self.keys.shape[1])

    def item_frequencies(self) -> NDArray[np.float64]:
        """Shape ``(2, d)``: row 0 the share of users with ``x_j = +1``, row 1 with ``-1``."""
        positive = self.signs.ravel() > 0
        flat = self.keys.ravel()
        plus = np.bincount(flat[positive], minlength=self.d)
        minus = np.bincount(flat[~positive], minlength=self.d)
        out: NDArray[np.float64] = np.stack([plus, minus]).astype(np.float64) / self.n
        return out

    def means(self) -> NDArray[np.float64]:
        """Shape ``(d,)``: ``(1/n) sum_i x_ij``."""
        freq = self.item_frequencies()
        out: NDArray[np.float64] = freq[0] - freq[1]
        return out


def uniform_subsets(n: int, d: int, s: int, rng: np.random.Generator) -> NDArray[np.int64]:
    """``n`` independent uniform ``s``-subsets of ``[0, d)``, one per row, in random order.

    Floyd's algorithm, vectorised over rows: for ``j = d - s, ..., d - 1`` draw ``r`` uniform in
    ``[0, j]`` and take ``r`` unless already chosen, else ``j``. Each subset is exactly uniform,
    in ``O(n s^2)`` time without rejection (rejection sampling needs ~7 redraws per row at
    ``d = 256``, ``s = 32``). Rows are shuffled afterwards because Floyd's order is not uniform.
    """
    if not 1 <= s <= d:
        raise ValueError(f"need 1 <= s <= d, got s={s}, d={d}")
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    keys = np.empty((n, s), dtype=np.int64)
    for col, j in enumerate(range(d - s, d)):
        r = rng.integers(0, j + 1, size=n, dtype=np.int64)
        taken = (keys[:, :col] == r[:, None]).any(axis=1)
        keys[:, col] = np.where(taken, j, r)
    out: NDArray[np.int64] = rng.permuted(keys, axis=1)
    return out


def uniform_population(n: int, d: int, s: int, rng: np.random.Generator) -> Population:
    """The paper's population: uniform ``s``-subsets of keys, signs +1/-1 with probability 1/2."""
    keys = uniform_subsets(n, d, s, rng)
    signs = np.where(rng.random((n, s)) < 0.5, -1, 1).astype(np.int8)
    return Population(keys=keys, signs=signs, d=d)
