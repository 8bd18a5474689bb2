"""Euclidean projection onto the probability simplex (the paper's post-processing).

Wang and Carreira-Perpinan, "Projection onto the probability simplex: an efficient algorithm
with a simple proof" (2013), Algorithm 1: sort, find the largest ``rho`` with
``u_rho + (1 - sum_{i<=rho} u_i) / rho > 0``, shift by ``lambda`` and clip at zero.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike, NDArray


def project_to_simplex(v: ArrayLike) -> NDArray[np.float64]:
    """The point of ``{x >= 0, sum x = 1}`` closest to ``v`` in Euclidean distance."""
    y = np.asarray(v, dtype=np.float64)
    if y.ndim != 1 or y.size == 0:
        raise ValueError(f"expected a non-empty 1-D vector, got shape {y.shape}")
    if not np.isfinite(y).all():
        raise ValueError("cannot project a vector with NaN or infinite entries")
    u = np.sort(y)[::-1]
    css = np.cumsum(u)
    ranks = np.arange(1, y.size + 1)
    rho = int(np.flatnonzero(u + (1.0 - css) / ranks > 0)[-1]) + 1
    lam = (1.0 - css[rho - 1]) / rho
    out: NDArray[np.float64] = np.maximum(y + lam, 0.0)
    return out
