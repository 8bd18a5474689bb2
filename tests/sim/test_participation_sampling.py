"""Participation sampling in the simulated fleet (sim/fleet): the realised participation,
what it leaves unchanged (a seed's reports at q = 1), and the estimators under it, with the
sensor model and the real mechanism (``LocalMechanism.randomise_keys`` on each device's
stream, ``AggregateState`` on the aggregator's side), all seeded and offline.

The right truth. With participation ``q`` a round's reports come from the devices sampled
in it, and the aggregator's estimate of the round is the mechanism's unbiased estimate of
the mean of *their* vectors: conditional on who reported, the reports are independent
randomisations of those devices' vectors, and the interval ``mean +- z se`` accounts for
that randomisation only. Its coverage is therefore a statement about the mean over the
devices that reported, and that is the truth checked here (the fleet simulator's ground
truth per round: :mod:`sim.fleet.truth`). The fleet-wide mean differs from it by the
sampling error of a simple random sample of ``n`` of ``N`` devices (given ``n``, Bernoulli
sampling draws every subset of size ``n`` alike): per dimension a standard deviation of
``sqrt(S^2 (1/n - 1/N))`` with ``S^2`` the fleet's variance of ``x_j``, at most
``sqrt(1/n - 1/N)`` for ``x_j`` in ``[-1, 1]`` (here about 0.035 against a per-round
interval half-width of about 0.3): checked below, and the reason an interval checked
against the fleet-wide mean would cover a little less than its nominal level.

Tolerances (K standard errors, a false alarm below ``1e-4`` per check with K = 4):

* a round's count of reports is Binomial(N, q') with ``q' = floor(q 2^32) / 2^32`` (K_EACH
  = 5 for checks made in every round: below ``6e-7`` each);
* the cells of one round are not independent (one report carries ``s`` dimensions), but
  rounds are: the pooled coverage of ``R`` rounds x ``d`` channels is a mean of ``R``
  independent per-round shares, each of variance at most ``c (1 - c)`` (Cauchy-Schwarz), so
  its standard error is at most ``sqrt(c (1 - c) / R)``; each channel's coverage over the
  ``R`` rounds is binomial with ``sqrt(c (1 - c) / R)`` exactly;
* a channel's errors over rounds, divided by their standard errors, are independent and
  about standard normal: their mean is within ``K / sqrt(R)`` of 0 (no bias).
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest

from aggregator.estimation.estimators import AggregateState
from edge import LocalMechanism
from edge.announce import AnnouncedPeriod
from edge.participation import WORD, threshold
from edge.spec import MechanismSpec
from sim.fleet.models import DeviceStreams, device_bits
from sim.fleet.run import Fleet, FleetConfig, RoundReport

K = 4.0
K_EACH = 5.0
"""For a check repeated in every round (hundreds of them): a false alarm below 6e-7 each."""
CONFIDENCE = 0.95
SPEC = MechanismSpec(mechanism="coco", d=6, s=2, epsilon=1.0)
FIRST_ROUND = 29_000_000  # a wall-clock round of 60 s in 2025


def fleet(devices: int, q: float, seed: int = 11) -> Fleet:
    return Fleet(
        FleetConfig(
            broker="mqtt://127.0.0.1:1",
            deployment="d",
            spec=SPEC,
            devices=devices,
            round_seconds=60,
            seed=seed,
            participation=q,
        )
    )


def dense(vectors: list[tuple[list[int], list[int]]], d: int) -> np.ndarray:
    out = np.zeros((len(vectors), d), dtype=np.int64)
    for row, (keys, signs) in enumerate(vectors):
        out[row, keys] = signs
    return out


def reported(reports: list[RoundReport | None]) -> list[RoundReport]:
    return [r for r in reports if r is not None]


@pytest.mark.parametrize("q", [0.1, 0.5, 0.9])
def test_realised_participation_per_round_matches_q(q: float) -> None:
    """2,000 devices over 60 rounds: each round's count within K binomial standard errors of
    N q', the total within K of R N q'; the sampled devices change from round to round."""
    devices, rounds = 2000, 60
    sim = fleet(devices, q)
    p = threshold(q) / WORD
    se = math.sqrt(devices * p * (1 - p))
    counts, previous = [], None
    for r in range(FIRST_ROUND, FIRST_ROUND + rounds):
        present = [report is not None for report in sim.reports(r)]
        counts.append(sum(present))
        assert present != previous
        previous = present
    assert all(abs(c - devices * p) <= K_EACH * se for c in counts), counts
    assert abs(sum(counts) - rounds * devices * p) <= K * se * math.sqrt(rounds)


def test_a_sampler_off_by_two_points_fails_the_check() -> None:
    """The per-round tolerance is tight enough to see q' off by 0.02 at N = 2,000 over 60
    rounds (the total is 10 standard errors away)."""
    devices, rounds, q = 2000, 60, 0.5
    sim = fleet(devices, q)
    counts = [sum(x is not None for x in sim.reports(FIRST_ROUND + r)) for r in range(rounds)]
    wrong = 0.48
    se = math.sqrt(devices * wrong * (1 - wrong))
    assert abs(sum(counts) - rounds * devices * wrong) > K * se * math.sqrt(rounds)


def test_at_q_one_the_reports_are_those_of_before_sampling() -> None:
    """q = 1 draws nothing: each device's report is the randomisation of its vector with its
    randomiser lane from the round's start, exactly what the fleet computed before
    participation existed; with q < 1 the decision is that lane's first word."""
    sim = fleet(50, 1.0)
    mech = LocalMechanism.from_spec(SPEC)
    streams = DeviceStreams(sim.config.seed, 50)  # the device's own lanes, drawn anew
    for r in (FIRST_ROUND, FIRST_ROUND + 7):
        reports = sim.reports(r)
        streams.set_round(r)
        vectors = sim.model.vectors(r, streams)
        expected = [
            (keys, signs, *mech.randomise_keys(keys, signs, getrandbits=device_bits(
                streams.randomiser(i))))
            for i, (keys, signs) in enumerate(vectors)
        ]  # fmt: skip
        assert reports == expected
    sampled = fleet(50, 0.5)
    reports = sampled.reports(FIRST_ROUND)
    streams = DeviceStreams(sampled.config.seed, 50)
    streams.set_round(FIRST_ROUND)
    words = [int(streams.randomiser(i).random_raw()) >> 32 for i in range(50)]
    assert [r is not None for r in reports] == [w < threshold(0.5) for w in words]
    assert 0 < sum(w < threshold(0.5) for w in words) < 50


def _rounds(sim: Fleet, rounds: int) -> list[tuple[AggregateState, np.ndarray, np.ndarray]]:
    """Per round: the aggregate of the reports sent, the vectors of the devices that
    reported, and every device's vectors."""
    out = []
    for r in range(FIRST_ROUND, FIRST_ROUND + rounds):
        vectors, reports = sim.round_data(r)
        sent = reported(reports)
        state = AggregateState(SPEC)
        state.add([x[2] for x in sent], [x[3] for x in sent])
        out.append((state, dense([x[:2] for x in sent], SPEC.d), dense(vectors, SPEC.d)))
    return out


def test_estimators_stay_unbiased_and_cover_with_sampling() -> None:
    """N = 2,000 sensor devices, q = 0.3, 300 rounds: per-round mean intervals cover the
    mean over the devices that reported (pooled and per channel, within K standard errors
    of 95 %), the standardised errors average to 0 per channel, the cumulative estimate over
    all rounds covers the cumulative truth, and the fleet-wide mean of each round lies
    within K sampling standard deviations of the reported mean."""
    devices, q, rounds = 2000, 0.3, 300
    data = _rounds(fleet(devices, q), rounds)
    covered = np.zeros((rounds, SPEC.d), dtype=bool)
    z = np.zeros((rounds, SPEC.d))
    total = AggregateState(SPEC)
    sums, n_all = np.zeros(SPEC.d), 0
    for r, (state, sent, everyone) in enumerate(data):
        est = state.estimate(confidence=CONFIDENCE)
        truth = sent.mean(axis=0)
        covered[r] = (est.mean_lo <= truth) & (truth <= est.mean_hi)
        z[r] = (est.mean - truth) / est.mean_se
        total.merge(state)
        sums += sent.sum(axis=0)
        n_all += len(sent)
        # how far the fleet-wide mean can be: SRS of n of N, per channel
        n = len(sent)
        spread = np.sqrt(everyone.var(axis=0, ddof=1) * (1 / n - 1 / devices))
        assert np.all(np.abs(truth - everyone.mean(axis=0)) <= K_EACH * spread + 1e-12), r
    c = CONFIDENCE
    bound = K * math.sqrt(c * (1 - c) / rounds)
    assert abs(covered.mean() - c) <= bound, covered.mean()
    for j in range(SPEC.d):
        assert abs(covered[:, j].mean() - c) <= bound, (j, covered[:, j].mean())
        assert abs(z[:, j].mean()) <= K / math.sqrt(rounds), (j, z[:, j].mean())
    assert total.n == n_all
    cumulative = total.estimate(confidence=CONFIDENCE)
    truth = sums / n_all
    # one cell per channel: each within K of its standard errors (a false alarm < 1e-4)
    assert np.all(np.abs(cumulative.mean - truth) <= K * cumulative.mean_se)


def test_the_coverage_check_sees_the_wrong_truth() -> None:
    """The same check against a truth off by one interval half-width (what a truth over the
    wrong set of devices can be, at smaller q) fails: coverage drops far below 95 %."""
    data = _rounds(fleet(1000, 0.3, seed=5), 120)
    hits = []
    for state, sent, _ in data:
        est = state.estimate(confidence=CONFIDENCE)
        wrong = sent.mean(axis=0) + est.mean_halfwidth
        hits.append((est.mean_lo <= wrong) & (wrong <= est.mean_hi))
    assert np.mean(hits) < CONFIDENCE - K * math.sqrt(CONFIDENCE * 0.05 / len(data))


def test_threshold_probability_is_the_announced_decimal_rounded_down() -> None:
    assert Fraction(threshold(0.3), WORD) <= Fraction("0.3") < Fraction(threshold(0.3) + 1, WORD)


def capped(devices: int, q: float, period_rounds: int, budget: float, seed: int = 3) -> Fleet:
    return Fleet(
        FleetConfig(
            broker="mqtt://127.0.0.1:1",
            deployment="d",
            spec=SPEC,
            devices=devices,
            round_seconds=60,
            seed=seed,
            participation=q,
            period=AnnouncedPeriod(60 * period_rounds, budget),
        )
    )


@pytest.mark.parametrize("q", [1.0, 0.4])
def test_the_announced_period_cap_is_kept_and_a_restart_renews_nothing(q: float) -> None:
    """A cap of floor(2.5 / 1) = 2 reports per period of 6 rounds: over three periods each
    device reports at most twice per period, in the first two rounds of the period it is
    sampled in (q = 1: the period's first two rounds); a fleet started in the middle of a
    period sends exactly what a fleet that ran from its start sends (no fresh budget)."""
    devices, period_rounds = 60, 6
    first = (FIRST_ROUND // period_rounds + 1) * period_rounds  # a period's first round
    rounds = range(first, first + 3 * period_rounds)
    sim = capped(devices, q, period_rounds, 2.5)
    free = fleet(devices, q, seed=3)  # the same devices without a cap
    sent = {r: sim.reports(r) for r in rounds}
    for i in range(devices):
        for k in range(3):
            period = rounds[k * period_rounds : (k + 1) * period_rounds]
            sampled = [r for r in period if free.reports(r)[i] is not None]
            mine = [r for r in period if sent[r][i] is not None]
            assert mine == sampled[:2], (i, k)
            for r in mine:
                assert sent[r][i] == free.reports(r)[i]  # the same report when it reports
    middle = first + period_rounds + 3
    restarted = capped(devices, q, period_rounds, 2.5)
    for r in range(middle, first + 3 * period_rounds):
        assert restarted.reports(r) == sent[r], r
    if q == 1:
        assert all(x is not None for x in sent[first + 1])
        assert all(x is None for x in sent[first + 2])
