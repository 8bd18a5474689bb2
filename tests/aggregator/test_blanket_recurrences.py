"""The blanket engine's recurrences against the value-by-value evaluation they replaced.

The engine takes most of its binomial values from a few special-function values by exact
identities and recurrences (``_shifted_cdf``, ``_threshold_tails`` with its rows' tops
chained along diagonals, :mod:`aggregator.accountant.tails`, the neutral count's cdf and
pmf chained along diagonals, :mod:`aggregator.accountant.chains`). The value-by-value
evaluation (one Boost value per run and per quantity, as before) is run here by swapping
those helpers for direct ones: the certified curve must never come out below it (the
recurrences' rounding is budgeted on top of the special functions' own budget), and stays
within ``1e-6`` relative of it (a relative change ``r`` of every curve point moves
``epsilon_total`` by about ``r / 2``, so its printed digits do not move; the difference is
only in the error budget, whose magnitudes grow where a shifted cdf value cancels, deep in
a tail of the neutral count). The exact rational check at small
``n`` is ``test_blanket.py::test_fast_engine_equals_direct_sum``.
"""

from __future__ import annotations

import math
from typing import Literal

import numpy as np
import pytest
from numpy.typing import NDArray
from scipy import stats

from aggregator.accountant import blanket, chains, tails
from aggregator.accountant.batch_pld import grid_spacing
from aggregator.accountant.blanket import BlanketPair, _Engine
from aggregator.accountant.chains import lower_cdf as _lower_cdf
from edge.spec import MechanismSpec

FloatArray = NDArray[np.float64]
_TIGHTNESS = 1e-6


def _direct_tails(  # noqa: PLR0917 (the signature of the helper it replaces)
    k: FloatArray,
    ks: FloatArray,
    k_last: FloatArray,  # noqa: ARG001
    counts: NDArray[np.int64],  # noqa: ARG001
    which: NDArray[np.int64],
    rel: float,
) -> tuple[FloatArray, FloatArray, float]:
    kk = ks[which]
    head = 0.25 * kk * np.asarray(stats.binom.pmf(k - 1.0, kk - 1.0, 0.5))
    return head, np.asarray(stats.binom.sf(k - 1.0, kk, 0.5)), rel


def _direct_shifted(
    x: FloatArray,
    m: FloatArray,
    q: float,
    c: FloatArray,  # noqa: ARG001 (the helper it replaces derives the value from c)
    pmf: FloatArray | None = None,  # noqa: ARG001
) -> tuple[FloatArray, FloatArray]:
    value = _lower_cdf(x - 1.0, np.maximum(m - 1.0, 0.0), q)
    return value, np.abs(value)


def direct_chained(
    x: FloatArray,
    m: FloatArray,
    q: float,
    diagonal: FloatArray,  # noqa: ARG001 (the helper it replaces chains along it)
    big_k: FloatArray,  # noqa: ARG001
) -> tuple[FloatArray, FloatArray, float]:
    """What the chains stand for: each boundary's cdf and pmf from scipy, no chain, no
    chain rounding (patched over :func:`~aggregator.accountant.chains.chained_lower_cdf`)."""
    return _lower_cdf(x, m, q), np.asarray(stats.binom.pmf(x, m, q)), 0.0


def _schedule(pair: BlanketPair) -> list[float]:
    """Points where the composition evaluates the curve (every half sd to 8 sd), and two
    close to eps0, where the threshold's tail anchors underflow."""
    sd = math.expm1(pair.epsilon0) * math.sqrt(2.0 * pair.hot / pair.n)
    step = grid_spacing(pair)
    points = [round(0.5 * z * sd / step) * step for z in range(17)]
    return [x for x in points if x < pair.epsilon0] + [0.9 * pair.epsilon0, 0.999 * pair.epsilon0]


@pytest.mark.parametrize(
    ("mechanism", "d", "s", "n"),
    [
        ("coco", 128, 8, 300),
        ("coco", 128, 8, 20_000),
        ("coco", 128, 8, 1_015_808),
        ("collision", 64, 4, 50_000),
        ("coco", 512, 16, 253_952),
    ],
)
def test_curve_never_below_the_value_by_value_evaluation(
    monkeypatch: pytest.MonkeyPatch, mechanism: Literal["coco", "collision"], d: int, s: int, n: int
) -> None:
    spec = MechanismSpec(mechanism=mechanism, d=d, s=s, epsilon=1.0)
    pair = blanket.blanket_pair_for_spec(spec, n=n)
    points = _schedule(pair)
    new = [_Engine(pair, 1e-20).divergence(x) for x in points]
    with monkeypatch.context() as patch:
        patch.setattr(blanket, "_threshold_tails", _direct_tails)
        patch.setattr(blanket, "_shifted_cdf", _direct_shifted)
        patch.setattr(blanket, "chained_lower_cdf", direct_chained)
        old = [_Engine(pair, 1e-20).divergence(x) for x in points]
    for x, fast, slow in zip(points, new, old, strict=True):
        assert fast >= slow, (x, fast, slow)
        assert fast <= slow * (1.0 + _TIGHTNESS), (x, fast, slow)


@pytest.mark.parametrize("big_k", [40, 3_000, 400_000])
def test_threshold_tails_within_budget_of_boost(big_k: int) -> None:
    """Every run's head and S_k from the recurrence agree with Boost's values within the
    two budgets (the recurrence's returned one plus Boost's 1e-10), whatever the row's
    position: near the mean, in the tail, and at k = K + 1."""
    sd = math.sqrt(big_k) / 2.0
    tops = [big_k / 2 + 3, big_k / 2 + 4 * sd, big_k / 2 + 30 * sd, big_k + 1.0]
    ks = np.full(len(tops), float(big_k))
    k_last = np.minimum(np.floor(np.asarray(tops)), big_k + 1.0)
    counts = np.asarray([1, 7, 25, 12], dtype=np.int64)
    k_first = np.maximum(k_last - counts + 1, 1.0)
    counts = (k_last - k_first).astype(np.int64) + 1
    offsets = np.concatenate(([0], np.cumsum(counts)[:-1]))
    which = np.repeat(np.arange(ks.size), counts)
    k = k_first[which] + (np.arange(which.size) - offsets[which])
    head, s_k, rel = tails.threshold_tails(k, ks, k_last, counts, which, 1e-10)
    ref_head, ref_s, _ = _direct_tails(k, ks, k_last, counts, which, 1e-10)
    budget = rel + 1e-10
    assert np.all(np.abs(head - ref_head) <= budget * ref_head)
    assert np.all(np.abs(s_k - ref_s) <= budget * ref_s)


@pytest.mark.parametrize(("m", "q"), [(50.0, 0.3), (650_000.0, 0.5378828460590105), (9.0, 0.9)])
def test_shifted_cdf_within_budget_of_boost(m: float, q: float) -> None:
    """``lower_cdf(x - 1; m - 1)`` from ``lower_cdf(x; m)``: within ``1e-10`` of its
    magnitude (the two Boost values' budgets) of Boost's direct value, on both sides of the
    mean and next to it."""
    sd = math.sqrt(m * q * (1 - q))
    x = np.unique(np.clip(np.round(m * q + sd * np.linspace(-9, 9, 181)), -1.0, m))
    mm = np.full(x.size, m)
    c = _lower_cdf(x, mm, q)
    value, mag = chains.shifted_cdf(x, mm, q, c)
    direct = _lower_cdf(x - 1.0, mm - 1.0, q)
    assert np.all(mag >= np.abs(value))
    assert np.all(np.abs(value - direct) <= 1e-10 * mag + 1e-10 * np.abs(direct))


@pytest.mark.parametrize("z", [0.5, 4.0, 12.0])
def test_threshold_tails_chained_across_rows_within_budget_of_boost(z: float) -> None:
    """Consecutive rows, as the engine makes them: the rows' tops chained along diagonals
    (aggregator.accountant.tails, one Boost pair per block), every run's head and S_k
    within the two budgets of Boost's value-by-value ones."""
    ks = np.arange(300_000.0, 301_200.0)
    k_last = np.floor(0.5 * ks + z * np.sqrt(ks) / 2.0 + 0.004 * (ks - ks[0]))
    counts = np.full(ks.size, 9, dtype=np.int64)
    k_first = k_last - counts + 1
    offsets = np.concatenate(([0], np.cumsum(counts)[:-1]))
    which = np.repeat(np.arange(ks.size), counts)
    k = k_first[which] + (np.arange(which.size) - offsets[which])
    tops = tails._tops(ks, k_last)
    assert not np.any(np.isnan(tops[1]))  # every row chained
    head, s_k, rel = tails.threshold_tails(k, ks, k_last, counts, which, 1e-10)
    ref_head, ref_s, _ = _direct_tails(k, ks, k_last, counts, which, 1e-10)
    budget = rel + 1e-10
    assert np.all(np.abs(head - ref_head) <= budget * ref_head)
    assert np.all(np.abs(s_k - ref_s) <= budget * ref_s)
