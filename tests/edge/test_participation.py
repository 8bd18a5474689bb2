"""Participation sampling (edge/participation.py) and ``participation`` in the announcement."""

from __future__ import annotations

import json
import math
import random

import numpy as np
import pytest

from edge.announce import decode_announcement, encode_announcement, participation_of
from edge.errors import SpecError
from edge.participation import WORD, participates, threshold
from edge.spec import MechanismSpec

SPEC = MechanismSpec(mechanism="coco", d=4, s=2, epsilon=1.0)
K = 5  # standard errors: a false alarm below 1e-6 per check


def announcement(**kw: object) -> bytes:
    return encode_announcement(SPEC.to_dict(), min_batch=10, delta=1e-6, **kw)  # type: ignore[arg-type]


@pytest.mark.parametrize("q", [0.01, 0.1, 0.3, 0.5, 0.9])
def test_realised_participation_per_round_matches_q(q: float) -> None:
    """A fleet of 2000 devices over 50 rounds, each deciding from its own seeded stream: the
    count per round is Binomial(2000, q) (each round within K standard errors) and the
    total over the rounds is within K standard errors of its mean."""
    devices, rounds_ = 2000, 50
    streams = [random.Random(1000 * i + 7) for i in range(devices)]
    counts = np.array(
        [sum(participates(q, s.getrandbits) for s in streams) for _ in range(rounds_)]
    )
    p = threshold(q) / WORD  # the exact probability: q rounded down to 2^-32
    assert q - 2**-32 < p <= q
    se = math.sqrt(devices * p * (1 - p))
    assert np.all(np.abs(counts - devices * p) <= K * se)
    total_se = math.sqrt(rounds_ * devices * p * (1 - p))
    assert abs(counts.sum() - rounds_ * devices * p) <= K * total_se


def test_a_sampler_off_by_a_little_fails_the_test() -> None:
    """The test above can fail: a device deciding with q + 0.02 is caught over the rounds."""
    q, devices, rounds_ = 0.3, 2000, 50
    rng = random.Random(3)
    total = sum(participates(q + 0.02, rng.getrandbits) for _ in range(devices * rounds_))
    se = math.sqrt(rounds_ * devices * q * (1 - q))
    assert abs(total - rounds_ * devices * q) > K * se


def test_q_of_one_draws_nothing_and_always_reports() -> None:
    def no_draw(_k: int) -> int:
        raise AssertionError("q = 1 must not draw")

    assert all(participates(1.0, no_draw) for _ in range(10))
    assert threshold(1.0) == WORD


def test_threshold_is_the_decimal_rounded_down() -> None:
    assert threshold(0.5) == WORD // 2
    assert threshold(0.1) == math.floor(WORD / 10)  # the decimal 0.1, not the binary float
    assert threshold(1e-300) == 0
    assert participates(0.5, lambda _k: WORD // 2 - 1)
    assert not participates(0.5, lambda _k: WORD // 2)


def test_the_announcement_carries_q_and_an_old_one_means_one() -> None:
    old = announcement()
    assert b"participation" not in old  # q = 1 is not written: the old bytes
    assert participation_of(decode_announcement(old)) == 1.0
    assert participation_of(None) == 1.0
    sampled = announcement(participation=0.25)
    assert json.loads(sampled)["participation"] == 0.25
    assert participation_of(decode_announcement(sampled)) == 0.25


@pytest.mark.parametrize("q", [0, -0.5, 1.5, 1.0000001, "0.5", True, None, float("nan")])
def test_a_q_outside_zero_to_one_is_refused(q: object) -> None:
    doc = json.loads(announcement())
    doc["participation"] = q
    with pytest.raises(SpecError, match="participation"):
        decode_announcement(json.dumps(doc).encode())
    with pytest.raises(SpecError, match="participation"):
        announcement(participation=q)
