"""The baselines' samplers and estimators: sampling agrees with the exact law (chi-square),
fast paths agree with the per-user reference, the estimators are unbiased where the theory
says so (seeded Monte Carlo, Bonferroni-corrected t bounds), a biased estimator is caught,
the registry keeps its contract, and bad input is refused with a clear error."""

from __future__ import annotations

import itertools
import math
from collections import Counter
from fractions import Fraction
from typing import Any

import numpy as np
import pytest
from numpy.typing import NDArray
from scipy import stats

from sim.experiments.baselines import (
    BASELINES,
    PCKVAGRR,
    PCKVGRR,
    PCKVUE,
    KVEstimate,
    PrivKV,
    Succinct,
)
from sim.experiments.baselines._common import true_frequencies

FAMILY_ALPHA = 1e-3  # family-wise false-alarm rate of each Monte Carlo check


def population(n: int, d: int, s: int, seed: int) -> tuple[NDArray[np.int64], NDArray[np.int8]]:
    """Skewed s-sparse data: key j drawn with weight ~ 1/(j+1), sign +1 w.p. depending on j."""
    rng = np.random.default_rng(seed)
    w = 1.0 / np.arange(1, d + 1)
    keys = np.stack([rng.choice(d, size=s, replace=False, p=w / w.sum()) for _ in range(n)])
    plus = np.linspace(0.9, 0.2, d)[keys]
    signs = np.where(rng.random((n, s)) < plus, 1, -1).astype(np.int8)
    return keys.astype(np.int64), signs


def t_bound(coordinates: int, reps: int) -> float:
    """Two-sided Student-t quantile, Bonferroni over the coordinates checked together."""
    return float(stats.t.ppf(1 - FAMILY_ALPHA / (2 * coordinates), reps - 1))


def t_scores(samples: NDArray[np.float64], target: NDArray[np.float64]) -> NDArray[np.float64]:
    """``(mean - target) / (sd / sqrt(R))`` per coordinate, from ``R`` repetitions (axis 0)."""
    reps = samples.shape[0]
    se = samples.std(axis=0, ddof=1) / math.sqrt(reps)
    return np.asarray((samples.mean(axis=0) - target) / se, dtype=np.float64)


def repeat(
    m: Any, keys: NDArray[np.int64], signs: NDArray[np.int8], reps: int, seed: int
) -> list[KVEstimate]:
    rngs = [np.random.default_rng(s) for s in np.random.SeedSequence(seed).spawn(reps)]
    return [m.run(keys, signs, rng) for rng in rngs]


# -- unbiasedness ------------------------------------------------------------------------------

UNBIASED = [
    PrivKV(d=6, s=2, epsilon=1.0),
    PCKVUE(d=6, s=2, epsilon=1.0),
    PCKVGRR(d=6, s=2, epsilon=1.0),
    PCKVAGRR(d=6, s=2, epsilon=1.0),
    PCKVAGRR(d=6, s=2, epsilon=0.5, ell=3),
]


@pytest.mark.parametrize("m", UNBIASED, ids=lambda m: f"{m.name}-ell{getattr(m, 'ell', None)}")
def test_frequency_and_mean_estimators_are_unbiased(m: Any) -> None:
    """PrivKV (its f_j and the unbiased mean mapping) and PCKV (Gu et al.'s A^-1 estimator)
    are linear in the counts: exactly unbiased (PrivKV: given every group is non-empty)."""
    n, d, s, reps = 3000, 6, 2, 300
    keys, signs = population(n, d, s, seed=1)
    truth = true_frequencies(keys, signs, d)
    runs = repeat(m, keys, signs, reps, seed=2)
    freq = np.stack([r.freq for r in runs if r.freq is not None]).reshape(reps, -1)
    mean = np.stack([r.mean for r in runs])
    scores = np.concatenate([t_scores(freq, truth.ravel()), t_scores(mean, truth[0] - truth[1])])
    assert np.all(np.abs(scores) <= t_bound(scores.size, reps)), scores


def test_privkv_original_conditional_mean_mapping_is_caught_as_biased() -> None:
    """The same check flags the original's f_j * m_j (m_j divides by the observed presence
    reports, fake ones included): the Monte Carlo test has power against a real bias."""
    n, d, s, reps = 3000, 6, 2, 300
    m = PrivKV(d=d, s=s, epsilon=1.0)
    keys, signs = population(n, d, s, seed=1)
    truth = true_frequencies(keys, signs, d)
    rngs = [np.random.default_rng(x) for x in np.random.SeedSequence(3).spawn(reps)]
    counts = [m.tally(m.randomise(keys, signs, rng)) for rng in rngs]
    fair = np.stack([m.estimate(c).mean for c in counts])
    original = np.stack([m.original_estimate(c).mean for c in counts])
    bound = t_bound(d, reps)
    assert np.all(np.abs(t_scores(fair, truth[0] - truth[1])) <= bound)
    assert np.max(np.abs(t_scores(original, truth[0] - truth[1]))) > bound


@pytest.mark.parametrize(
    ("s", "n", "epsilon", "rr"),
    [
        (3, 4000, 1.0, True),  # randomised response, eta = R < s: clipped
        (3, 4000, 5.0, False),  # Laplace, clipped
        (1, 4000, 1.0, True),  # randomised response over R = 1.15 > s = 1: nothing clipped
        (1, 4000, 5.0, False),  # Laplace, nothing clipped
    ],
)
def test_succinct_mean_is_the_truth_times_the_clip_shrinkage(
    s: int, n: int, epsilon: float, rr: bool
) -> None:
    """E[estimate] = c * mean with c = E[u1 clip(u1 + ... + us)] (c = 1 when nothing is
    clipped, s = 1 here), in both branches: the reports are unbiased for the clipped value."""
    d, reps = 6, 300
    m = Succinct(d=d, s=s, epsilon=epsilon)
    assert m.uses_randomised_response(n) == rr
    keys, signs = population(n, d, s, seed=4)
    truth = true_frequencies(keys, signs, d)
    c = m.clip_shrinkage(n)
    assert (c < 1) == (m.eta(n) < s)
    mean = np.stack([r.mean for r in repeat(m, keys, signs, reps, seed=5)])
    scores = t_scores(mean, c * (truth[0] - truth[1]))
    assert np.all(np.abs(scores) <= t_bound(d, reps)), scores
    if c < 1:  # and the unshrunk truth is rejected: clipping bias is real and detectable
        assert np.max(np.abs(t_scores(mean, truth[0] - truth[1]))) > t_bound(d, reps)


def test_clip_shrinkage_matches_enumeration() -> None:
    for s, n in [(1, 10), (3, 4000), (5, 100_000), (8, 50)]:
        m = Succinct(d=8, s=s, epsilon=1.0)
        eta = m.eta(n)
        exact = np.mean(
            [u[0] * min(eta, max(-eta, sum(u))) for u in itertools.product((-1, 1), repeat=s)]
        )
        assert m.clip_shrinkage(n) == pytest.approx(exact, abs=1e-12)


# -- sampling agrees with the exact law ---------------------------------------------------------


def chi_square_p(observed: Counter[Any], law: dict[Any, Fraction], total: int) -> float:
    """Pearson's test; cells with expected count < 5 pooled into one."""
    obs, exp = [], []
    pool_o, pool_e = 0, 0.0
    assert set(observed) <= set(law)
    for z, p in law.items():
        e = float(p) * total
        if e < 5:
            pool_o += observed.get(z, 0)
            pool_e += e
        else:
            obs.append(observed.get(z, 0))
            exp.append(e)
    if pool_e > 0:
        obs.append(pool_o)
        exp.append(pool_e)
    return float(stats.chisquare(obs, exp).pvalue)


CASES = [
    (PrivKV(d=4, s=2, epsilon=1.0), [0, 2], [1, -1]),
    (PCKVUE(d=3, s=2, epsilon=1.0), [0, 2], [-1, 1]),
    (PCKVGRR(d=4, s=2, epsilon=1.0), [1, 3], [1, 1]),
    (PCKVAGRR(d=4, s=2, epsilon=1.0), [1, 3], [-1, 1]),
    (PCKVAGRR(d=3, s=1, epsilon=2.0, ell=2), [2], [-1]),
]


@pytest.mark.parametrize(("m", "k", "v"), CASES, ids=lambda c: getattr(c, "name", ""))
def test_sampler_matches_exact_distribution(m: Any, k: list[int], v: list[int]) -> None:
    total = 30_000
    keys = np.tile(np.array(k, dtype=np.int64), (total, 1))
    signs = np.tile(np.array(v, dtype=np.int8), (total, 1))
    reports = m.randomise(keys, signs, np.random.default_rng(7))
    observed = Counter(tuple(int(x) for x in row) for row in reports)
    assert chi_square_p(observed, m.exact_distribution(k, v), total) > FAMILY_ALPHA


def test_pckv_ue_aggregate_matches_the_tally_of_full_reports() -> None:
    """run() draws PCKV-UE's counts per key without materialising the n x d' reports; their
    joint law for a key equals that of tallying full reports (chi-square homogeneity)."""
    m = PCKVUE(d=3, s=2, epsilon=1.0)
    keys = np.array([[0, 1], [1, 2], [0, 2]], dtype=np.int64)
    signs = np.array([[1, -1], [1, 1], [-1, 1]], dtype=np.int8)
    draws = 6000
    rng_a, rng_b = np.random.default_rng(8), np.random.default_rng(9)
    for key in (0, 4):  # a real key and a dummy key
        fast = Counter(
            (int(c.n1[key]), int(c.n2[key]))
            for c in (m.aggregate(keys, signs, rng_a) for _ in range(draws))
        )
        slow = Counter(
            (int(c.n1[key]), int(c.n2[key]))
            for c in (m.tally(m.randomise(keys, signs, rng_b)) for _ in range(draws))
        )
        cells = sorted(set(fast) | set(slow))
        table = np.array([[fast.get(z, 0) for z in cells], [slow.get(z, 0) for z in cells]])
        table = table[:, table.sum(axis=0) >= 10]
        assert stats.chi2_contingency(table).pvalue > FAMILY_ALPHA


def test_succinct_fast_decoder_matches_the_explicit_one() -> None:
    """The packed-byte decoder of run() against (1/n) r^T y on the same random stream."""
    d, s, n = 20, 3, 50
    keys, signs = population(n, d, s, seed=6)
    m = Succinct(d=d, s=s, epsilon=1.0)
    fast = m.run(keys, signs, np.random.default_rng(5)).mean
    rng = np.random.default_rng(5)
    raw = rng.integers(0, 256, size=(n, (d + 7) // 8), dtype=np.uint8)
    r = (2 * np.unpackbits(raw, axis=1, count=d).astype(np.int8) - 1).astype(np.int8)
    noisy = m._noisy(keys, signs, r, n, rng)
    np.testing.assert_allclose(fast, Succinct.decode(r, noisy), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    ("s", "n", "epsilon"), [(3, 100_000, 1.0), (3, 100_000, 0.1), (1, 10_000, 0.5)]
)
def test_succinct_randomised_response_follows_its_exact_law(s: int, n: int, epsilon: float) -> None:
    """Chi-square goodness of fit of the public path (``reports``) against
    ``exact_report_law``: users are grouped by their exact law (it depends on the public
    signs), the +-C R counts of each group are compared with its exact probability."""
    d, users = 5, 40_000
    m = Succinct(d=d, s=s, epsilon=epsilon, n=n)  # fixed n: the law does not depend on `users`
    assert m.uses_randomised_response(n)
    keys, signs = population(users, d, s, seed=11)
    r, noisy = m.reports(keys, signs, np.random.default_rng(12))
    out = m.rr_output(n)
    assert set(np.unique(noisy).tolist()) <= {out, -out}
    totals = (r[np.arange(users)[:, None], keys].astype(np.int64) * signs).sum(axis=1)
    statistic, groups = 0.0, 0
    for t in np.unique(totals):
        members = np.flatnonzero(totals == t)
        i = int(members[0])
        law = m.exact_report_law(keys[i].tolist(), signs[i].tolist(), r[i].tolist(), n)
        expected = np.array([law[out], law[-out]], dtype=np.float64) * members.size
        observed = np.array([np.sum(noisy[members] == out), np.sum(noisy[members] == -out)])
        assert expected.min() >= 10
        statistic += float(np.sum((observed - expected) ** 2 / expected))
        groups += 1
    assert groups >= 2
    assert stats.chi2.sf(statistic, df=groups) > FAMILY_ALPHA


def test_succinct_switch_is_the_authors_condition() -> None:
    """Their ``min(2 clip_r, 2k) / eps >= clip_r``: eps <= 2 when clip_r <= s (the paper's
    whole grid), eps <= 2 s / clip_r when their unclamped clip_r exceeds s."""
    for s in (4, 8, 16, 32):
        for eps, rr in [(0.1, True), (1.0, True), (2.0, True), (2.0001, False), (5.0, False)]:
            assert Succinct(d=64, s=s, epsilon=eps).uses_randomised_response(100_000) == rr
    m = Succinct(d=8, s=1, epsilon=1.0)
    big_r = m.rr_range(10_000)
    assert big_r == pytest.approx(math.sqrt(math.log(10_000)) / 2.5)
    assert big_r > 1
    assert m.eta(10_000) == 1
    assert Succinct(d=8, s=1, epsilon=2 / big_r * 0.999).uses_randomised_response(10_000)
    assert not Succinct(d=8, s=1, epsilon=2 / big_r * 1.001).uses_randomised_response(10_000)


# -- contract and input handling ----------------------------------------------------------------


def test_registry_names_and_contract() -> None:
    assert list(BASELINES) == ["PrivKV", "PCKV-UE", "PCKV-GRR", "PCKV-AGRR", "SUCCINCT"]
    keys, signs = population(200, 10, 3, seed=10)
    for name, factory in BASELINES.items():
        m = factory(10, 3, 1.0)
        assert (m.name, m.d, m.s, m.epsilon) == (name, 10, 3, 1.0)
        est = m.run(keys, signs, np.random.default_rng(0))
        assert est.mean.shape == (10,)
        assert est.freq is None if name == "SUCCINCT" else est.freq is not None
        if est.freq is not None:
            assert est.freq.shape == (2, 10)
            np.testing.assert_allclose(est.mean, est.freq[0] - est.freq[1])


@pytest.mark.parametrize("name", list(BASELINES))
def test_bad_input_is_refused_clearly(name: str) -> None:
    m = BASELINES[name](6, 2, 1.0)
    rng = np.random.default_rng(0)
    good_k = np.array([[0, 1]], dtype=np.int64)
    good_s = np.array([[1, -1]], dtype=np.int8)
    with pytest.raises(ValueError, match="distinct"):
        m.run(np.array([[1, 1]]), good_s, rng)
    with pytest.raises(ValueError, match=r"\[0, d=6\)"):
        m.run(np.array([[0, 6]]), good_s, rng)
    with pytest.raises(ValueError, match="shape"):
        m.run(np.array([[0, 1, 2]]), good_s, rng)
    with pytest.raises(ValueError, match=r"\+1 or -1"):
        m.run(good_k, np.array([[1, 0]], dtype=np.int8), rng)


@pytest.mark.parametrize(
    ("d", "s", "epsilon", "message"),
    [
        (1, 1, 1.0, "d must be"),
        (4, 5, 1.0, "s must be"),
        (4, 2, 0.0, "epsilon must be"),
        (4, 2, float("nan"), "epsilon must be"),
    ],
)
def test_bad_parameters_are_refused(d: int, s: int, epsilon: float, message: str) -> None:
    for factory in BASELINES.values():
        with pytest.raises(ValueError, match=message):
            factory(d, s, epsilon)
