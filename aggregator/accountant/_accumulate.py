"""Running products and sums along the rows of a short, wide grid.

The engine's recurrences lay their values out as grids of many rows (one per ``K`` or per
chain) and a few columns (the steps of each row's recurrence), and accumulate along each
row. ``numpy.cumprod(grid, axis=1)`` does that element by element (for 7,500 rows of 12
columns, ten times the cost of one array operation per column); here it is one operation
per column over all rows at once. Each value is formed by the same operations in the same
order (``out[:, j] = out[:, j - 1] op grid[:, j]``, sequential as numpy's), so the results
are the same bit for bit and the recurrences' error budgets stand unchanged.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

__all__ = ["cumulative_product", "cumulative_sum"]

FloatArray = NDArray[np.float64]


def cumulative_product(grid: FloatArray) -> FloatArray:
    """``numpy.cumprod(grid, axis=1)`` of a 2-D float grid, bit for bit."""
    out = np.array(grid, dtype=np.float64, order="F")  # (columns contiguous)
    for j in range(1, out.shape[1]):
        np.multiply(out[:, j - 1], out[:, j], out=out[:, j])
    return out


def cumulative_sum(grid: FloatArray) -> FloatArray:
    """``numpy.cumsum(grid, axis=1)`` of a 2-D float grid, bit for bit."""
    out = np.array(grid, dtype=np.float64, order="F")
    for j in range(1, out.shape[1]):
        np.add(out[:, j - 1], out[:, j], out=out[:, j])
    return out
