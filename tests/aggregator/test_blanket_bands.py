"""The blanket engine's bands (aggregator.accountant.bands) never go below what they bound.

Each band's value is checked against the exact sum it stands for (every ``N0`` of the
band, one Boost value per term): never below it, within a factor 1000 of it; the whole
certified curve against the sum over every ``(K, N0)`` of the windows, term by term (no
runs, no bands, no recurrences), at batch sizes where the bands are used and where they
are refused; and the curve with bands stays within ``1e-9`` relative of the curve summed
run by run over the outer window; ``epsilon_total`` never below the slow path (no bands,
no chains, no recurrences) beyond the composition's rounding noise.
"""

from __future__ import annotations

import math
from typing import Literal

import numpy as np
import pytest
from numpy.typing import NDArray
from scipy import stats

from aggregator.accountant import bands, blanket
from aggregator.accountant.blanket import BlanketPair, _Engine, blanket_pair_for_spec
from aggregator.accountant.composition import epsilon_total_counts
from edge.spec import MechanismSpec
from tests.aggregator.test_blanket_chains import _COMPOSITION_NOISE, _clear_caches
from tests.aggregator.test_blanket_recurrences import (
    _direct_shifted,
    _direct_tails,
    direct_chained,
)

FloatArray = NDArray[np.float64]


def _tau(pair: BlanketPair, eps: float, big_k: float) -> tuple[float, float, float]:
    p, c0 = pair.exp_epsilon0, pair.neutral_weight
    coef = (p - 1.0) * (1.0 + math.exp(eps))
    tau1 = c0 * math.expm1(eps) / coef
    tau0 = big_k * (((p - 1.0) + p * math.expm1(eps)) / coef)
    return tau0, tau1, coef


def _f(big_k: float, tau: FloatArray) -> FloatArray:
    """``E(N1 - tau)_+``, ``N1 ~ Bin(K, 1/2)``, one Boost pmf and sf per value."""
    k = np.clip(np.floor(tau) + 1.0, 0.0, big_k + 1.0)
    head = 0.25 * big_k * np.asarray(stats.binom.pmf(k - 1.0, big_k - 1.0, 0.5))
    value: FloatArray = np.maximum(
        head + (0.5 * big_k - tau) * np.asarray(stats.binom.sf(k - 1.0, big_k, 0.5)), 0.0
    )
    return value


def _row_sum(engine: _Engine, eps: float, row: int, bottom: float, top: float) -> float:
    """``sum over N0 in [bottom, top] of Pr[N0] E(N1 - tau(N0))_+`` for one row, term by
    term."""
    big_k, m = float(engine.k[row]), float(engine.m0[row])
    tau0, tau1, _ = _tau(engine.pair, eps, big_k)
    n0 = np.arange(bottom, top + 1.0)
    weights = np.asarray(stats.binom.pmf(n0, m, engine.q0))
    return math.fsum((weights * _f(big_k, tau0 + tau1 * n0)).tolist())


def _direct(engine: _Engine, eps: float) -> float:
    """The certified curve's sum over the windows, term by term (every ``(K, N0)``)."""
    _, _, coef = _tau(engine.pair, eps, 1.0)
    rows = [
        _row_sum(engine, eps, i, float(engine.lo0[i]), float(engine.hi0[i]))
        for i in range(engine.k.size)
    ]
    inside = math.fsum((np.asarray(engine.pk) / (1.0 + engine.rel) * np.asarray(rows)).tolist())
    return coef / engine.pair.n * inside


def _pair(
    mechanism: Literal["coco", "collision"], d: int, s: int, n: int, t: int | None = None
) -> BlanketPair:
    if t is None:  # the mechanism's default t
        spec = MechanismSpec(mechanism=mechanism, d=d, s=s, epsilon=1.0)
    else:
        spec = MechanismSpec(mechanism=mechanism, d=d, s=s, t=t, epsilon=1.0)
    return blanket_pair_for_spec(spec, n=n)


def _points(pair: BlanketPair, zs: tuple[float, ...]) -> list[float]:
    sd = math.expm1(pair.epsilon0) * math.sqrt(2.0 * pair.hot / pair.n)
    return [z * sd for z in zs if z * sd < pair.epsilon0]


@pytest.mark.parametrize(
    ("pair", "zs"),
    [
        (_pair("coco", 128, 8, 40_000), (0.5, 3.0, 7.0)),
        (_pair("collision", 64, 4, 12_000, t=6), (1.0, 5.0)),
    ],
)
def test_every_band_is_at_least_its_exact_sum(pair: BlanketPair, zs: tuple[float, ...]) -> None:
    engine = _Engine(pair, 1e-20)
    b_rows, bottom, prob, mag, eta, _ = engine.bands
    top = np.concatenate((engine.hi0, engine.hi0[engine.inner.rows]))
    top[: engine.k.size][engine.inner.rows] = engine.inner.lo - 1.0
    checked = 0
    for eps in _points(pair, zs):
        tau0, tau1, _ = _tau(pair, eps, 1.0)
        big_k = engine.k[b_rows]
        upper = bands.chernoff_bounds(
            big_k * tau0 + tau1 * bottom, big_k, prob, mag, eta, engine.rel
        )
        for i in range(0, b_rows.size, 37):
            if top[i] >= bottom[i]:
                exact = _row_sum(engine, eps, int(b_rows[i]), float(bottom[i]), float(top[i]))
                assert upper[i] >= exact, (eps, i, upper[i], exact)
                assert upper[i] <= 1e3 * exact + 1e-300, (eps, i, upper[i], exact)
                checked += 1
    assert checked > 50


@pytest.mark.parametrize(
    ("pair", "zs", "banded"),
    [
        (_pair("coco", 128, 8, 5_000), (0.0, 1.0, 4.0, 8.0), True),
        (_pair("coco", 32, 2, 300), (1.0, 4.0, 9.0), False),  # the bands refused somewhere
        (_pair("collision", 64, 4, 3_000, t=6), (1.0, 6.0), True),
    ],
)
def test_curve_is_never_below_the_term_by_term_sum(
    monkeypatch: pytest.MonkeyPatch, pair: BlanketPair, zs: tuple[float, ...], banded: bool
) -> None:
    engine = _Engine(pair, 1e-20)
    used: list[bool] = []
    grouped = _Engine._grouped

    def record(self: _Engine, window: blanket._Window, tau0: FloatArray, tau1: float) -> float:
        used.append(window is self.inner)
        return grouped(self, window, tau0, tau1)

    monkeypatch.setattr(_Engine, "_grouped", record)
    for eps in _points(pair, zs):
        fast = engine.divergence(eps)
        exact = _direct(engine, eps)
        assert fast >= exact, (eps, fast, exact)
        assert fast <= exact * (1.0 + 1e-6) + 2.0 * engine.floor, (eps, fast, exact)
    if banded:
        assert any(used)
    else:
        assert not all(used)


@pytest.mark.parametrize(
    "pair",
    [
        _pair("coco", 128, 8, 1_015_808),
        _pair("coco", 128, 8, 20_000),
        _pair("collision", 64, 4, 50_000),
    ],
)
def test_bands_move_the_curve_by_less_than_1e_9(
    monkeypatch: pytest.MonkeyPatch, pair: BlanketPair
) -> None:
    points = _points(pair, tuple(0.5 * z for z in range(17)))
    new = [_Engine(pair, 1e-20).divergence(x) for x in points]
    monkeypatch.setattr(blanket, "INNER_TAIL", 1e-300)  # the inner window is the outer one
    old = [_Engine(pair, 1e-20).divergence(x) for x in points]
    for x, fast, slow in zip(points, new, old, strict=True):
        assert abs(fast - slow) <= 1e-9 * slow, (x, fast, slow)


def test_epsilon_total_never_below_the_slow_path(monkeypatch: pytest.MonkeyPatch) -> None:
    """``epsilon_total`` of mixed sizes against the slow path: no bands (the inner window is
    the outer one), every binomial value from Boost one by one (no chains, no recurrences).
    Never below it beyond the composition's own rounding noise (test_blanket_chains.py),
    within ``1e-6`` relative."""
    spec = MechanismSpec(mechanism="coco", d=128, s=8, epsilon=1.0)
    counts = {
        blanket_pair_for_spec(spec, n=n): 5 + i for i, n in enumerate((20_480, 61_440, 98_304))
    }
    _clear_caches()
    new = epsilon_total_counts(counts, delta=1e-8)
    _clear_caches()
    with monkeypatch.context() as patch:
        patch.setattr(blanket, "INNER_TAIL", 1e-300)
        patch.setattr(blanket, "_threshold_tails", _direct_tails)
        patch.setattr(blanket, "_shifted_cdf", _direct_shifted)
        patch.setattr(blanket, "chained_lower_cdf", direct_chained)
        old = epsilon_total_counts(counts, delta=1e-8)
    _clear_caches()
    assert new >= old * (1.0 - _COMPOSITION_NOISE)
    assert new <= old * (1.0 + 1e-6)
