"""The threshold's pmf and tail at the blanket engine's runs, chained across rows.

For every run ``(K, k)`` of one ``eps`` the engine of :mod:`aggregator.accountant.blanket`
needs ``head = (K/4) b(k - 1; K - 1, 1/2)`` and ``S_k = Pr[Bin(K, 1/2) >= k]``. The runs of
one row ``K`` are consecutive ``k`` up to ``k_last(K)``, all above the mean; below a row's
*top* column ``k_top >= k_last`` the recurrences ``b(k - 1) = b(k) k / (K - k + 1)`` and
``S_(k-1) = S_k + b(k - 1)`` give the rest (ratios and sums of non-negative terms).

The tops themselves are chained across rows, so a row needs no special-function value.
Along a diagonal ``2k - K = d`` (rows ``K`` and ``K + 2``, columns ``k`` and ``k + 1``),
``Bin(K + 2, 1/2) = Bin(K, 1/2) + Bin(2, 1/2)`` gives, exactly,

    S_(K+2)(k + 1) = S_K(k) + (b_K(k - 1) - b_K(k)) / 4 = S_K(k) + b_K(k - 1) (d - 1) / (4 k),
    b_(K+2)(k) = b_K(k - 1) (K + 2)(K + 1) / (4 k (K - k + 2)),

and ``d >= 1`` above the mean, so the tail grows by a non-negative term (``d - 1`` is an
exact integer: nothing cancels) and the pmf by a ratio. The rows of one parity are cut into
blocks of at most :data:`BLOCK` rows; a block's diagonal is the largest ``2 k_last - K`` of
its rows (so its top is at or above every row's ``k_last``), its lowest row is the anchor
(one Boost pmf and sf), and the block's tops follow by a cumulative product and sum. A
block whose anchor is degenerate (its top beyond ``K + 1``, a diagonal below 1) or whose
values come near underflow (below :data:`TINY`) is computed value by value, as is a row
that cannot be linked (the next row of its parity is not ``K + 2``) or lies more than
:data:`WASTE` columns below its block's diagonal.

Error bound (relative; the integers are exact): a diagonal step rounds two quotients and
two products for the pmf (``4 u``) and three operations for the increment plus one for the
running sum (recursive summation of non-negative terms), so ``j`` steps from the anchor
add at most ``5 j u`` on top of the special functions' ``rel``; the column recurrence in
a row of ``w`` columns adds ``4 (w + 1) u`` (ratios and non-negative sums, as before).
:func:`threshold_tails` returns ``rel + (5 BLOCK + 8 + 4 (w + 1)) u``, times ``1 + 1e-6``
for the second-order terms.
"""

from __future__ import annotations

from typing import Final

import numpy as np
from numpy.typing import NDArray
from scipy import stats

from aggregator.accountant._accumulate import cumulative_product, cumulative_sum

__all__ = ["BLOCK", "TINY", "WASTE", "threshold_tails"]

FloatArray = NDArray[np.float64]

BLOCK: Final = 256
"""Most rows of one parity chained from one anchor."""
TINY: Final = 2.0**-960
"""Below this a chained value may have lost digits (subnormal products ahead): its row is
computed value by value instead."""
WASTE: Final = 32
"""A row whose block's top is more than this many columns above its own ``k_last`` is
computed value by value (a row far off its block's diagonal, e.g. one clipped at
``k = K + 1`` next to eps0)."""
_U: Final = 2.0**-53


def _tops(ks: FloatArray, k_last: FloatArray) -> tuple[FloatArray, FloatArray, FloatArray]:
    """``(k_top, b(k_top - 1; K, 1/2), S_(k_top))`` of every row, chained along diagonals
    (module docstring); NaN where the row must be computed value by value."""
    rows = ks.size
    k_top = k_last.copy()
    beta = np.full(rows, np.nan)
    tail = np.full(rows, np.nan)
    d_last = 2.0 * k_last - ks
    for parity in (0, 1):
        idx = np.arange(parity, rows, 2)
        if idx.size == 0:
            continue
        pos = np.arange(idx.size)
        start = np.ones(idx.size, dtype=bool)
        start[1:] = (ks[idx[1:]] != ks[idx[:-1]] + 2.0) | (pos[1:] % BLOCK == 0)
        first = np.flatnonzero(start)
        block = np.cumsum(start) - 1
        j = pos - first[block]
        diag = np.maximum.reduceat(d_last[idx], first)[block]
        big_k = ks[idx]
        kt = 0.5 * (big_k + diag)  # exact: diag has the parity of 2 k_last - K, so of K
        k_top[idx] = kt
        anchor = idx[first]
        k_anchor = kt[first]
        fine = (diag[first] >= 1.0) & (k_anchor <= ks[anchor] + 1.0)
        beta_a = np.zeros(first.size)
        tail_a = np.zeros(first.size)
        beta_a[fine] = stats.binom.pmf(k_anchor[fine] - 1.0, ks[anchor][fine], 0.5)
        tail_a[fine] = stats.binom.sf(k_anchor[fine] - 1.0, ks[anchor][fine], 0.5)
        width = int(j.max()) + 1
        # step into row j >= 1 from the previous row of the block, (K, k) = (K_j - 2, k_j - 1)
        prev_k, prev_kt = big_k - 2.0, kt - 1.0
        step = j >= 1
        step &= fine[block]  # (a block that is not fine is computed value by value)
        ratio = np.ones(idx.size)
        ratio[step] = ((prev_k[step] + 2.0) / (2.0 * prev_kt[step])) * (
            (prev_k[step] + 1.0) / (2.0 * (prev_k[step] - prev_kt[step] + 2.0))
        )
        grid = np.ones((first.size, width))
        grid[:, 0] = beta_a
        grid[block[step], j[step]] = ratio[step]
        betas = np.cumprod(grid, axis=1)
        row_beta = betas[block, j]
        inc = np.zeros(idx.size)
        before = betas[block[step], j[step] - 1]
        inc[step] = 0.25 * before * ((diag[step] - 1.0) / prev_kt[step])
        sums = np.zeros((first.size, width))
        sums[:, 0] = tail_a
        sums[block[step], j[step]] = inc[step]
        row_tail = np.cumsum(sums, axis=1)[block, j]
        good = fine[block] & (row_beta >= TINY) & (row_tail >= TINY) & (kt - k_last[idx] <= WASTE)
        beta[idx[good]] = row_beta[good]
        tail[idx[good]] = row_tail[good]
    return k_top, beta, tail


def threshold_tails(  # noqa: PLR0917 (the engine's helper)
    k: FloatArray,
    ks: FloatArray,
    k_last: FloatArray,
    counts: NDArray[np.int64],
    which: NDArray[np.int64],
    rel: float,
) -> tuple[FloatArray, FloatArray, float]:
    """``(head, S_k, rel')`` of every run: ``head = (K/4) b(k - 1; K - 1, 1/2)`` and ``S_k =
    Pr[Bin(K, 1/2) >= k]``, each within ``rel'`` relative of its exact value when the
    special functions are within ``rel``.

    ``ks`` are the rows, ``k_last`` each row's top run, ``counts`` its number of runs (the
    runs of a row are ``k_last - counts + 1 .. k_last``), ``which`` the row of each run
    ``k``. The rows' tops are chained along diagonals, the rest of a row follows down its
    columns (module docstring)."""
    k_top, beta_top, s_top = _tops(ks, k_last)
    direct_row = np.isnan(beta_top)
    k_top = np.where(direct_row, k_last, k_top)
    beta_top = np.where(direct_row, 0.0, beta_top)
    s_top = np.where(direct_row, 0.0, s_top)
    spans = k_top - k_last + counts  # columns k_top down to k_first
    width = int(spans.max())
    col = np.arange(width, dtype=np.float64)
    kk = k_top[:, None] - col[None, :]  # k of column c: k_top - c
    # column c >= 1 holds beta_(k) = b(k - 1) = beta_(k + 1) * k / (K - k + 1), k = k_top - c
    used = (col[None, :] >= 1.0) & (col[None, :] < spans[:, None]) & ~direct_row[:, None]
    ratio = np.ones_like(kk)
    np.divide(kk, ks[:, None] - kk + 1.0, out=ratio, where=used)
    beta = beta_top[:, None] * cumulative_product(ratio)
    s = np.empty_like(beta)
    s[:, 0] = s_top
    if width > 1:
        s[:, 1:] = s_top[:, None] + cumulative_sum(beta[:, :-1])
    position = (k_top[which] - k).astype(np.int64)  # column of each run
    beta_run = beta[which, position]
    s_run = s[which, position]
    kk_run = ks[which]
    head = 0.5 * beta_run * (kk_run - k + 1.0)
    direct = direct_row[which]
    if np.any(direct):
        head[direct] = (
            0.25
            * kk_run[direct]
            * np.asarray(stats.binom.pmf(k[direct] - 1.0, kk_run[direct] - 1.0, 0.5))
        )
        s_run[direct] = np.asarray(stats.binom.sf(k[direct] - 1.0, kk_run[direct], 0.5))
    rel_out = (rel + (5.0 * BLOCK + 8.0 + 4.0 * (width + 1)) * _U) * (1.0 + 1e-6)
    return head, s_run, rel_out
