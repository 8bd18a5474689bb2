"""Sharded deployments: the device's shard, layouts, labels, topics and the announcement."""

from __future__ import annotations

import json
import math
import random
import secrets
from collections.abc import Callable
from typing import Any

import pytest
import xxhash
from hypothesis import given
from hypothesis import strategies as st

from edge import topics
from edge.announce import decode_announcement, encode_announcement, shard_plan
from edge.device import shard_index, xxh32
from edge.errors import SpecError
from edge.shards import ShardLayout, ShardPlan, parse_label, shard_label
from edge.spec import MechanismSpec

SPEC = MechanismSpec(mechanism="coco", d=6, s=2, epsilon=1.0).to_dict()


def _keys(n: int) -> tuple[str, ...]:
    return tuple(secrets.token_hex(32) for _ in range(n))


def _layout(
    count: int = 3, *, from_round: int = 0, generation: int = 0, seed: int = 7
) -> ShardLayout:
    return ShardLayout(
        count=count, from_round=from_round, generation=generation, seed=seed, keys=_keys(count)
    )


@given(st.binary(max_size=80), st.integers(0, 2**32 - 1))
def test_xxh32_is_the_standard_algorithm(data: bytes, seed: int) -> None:
    assert xxh32(data, seed) == xxhash.xxh32_intdigest(data, seed=seed)


@given(st.text(min_size=1, max_size=64), st.integers(0, 2**32 - 1), st.integers(1, 256))
def test_shard_index_is_the_range_reduced_hash(device: str, seed: int, count: int) -> None:
    index = shard_index(device.encode(), seed, count)
    assert 0 <= index < count
    assert index == (xxhash.xxh32_intdigest(device.encode(), seed=seed) * count) >> 32


def test_shard_sizes_are_binomial() -> None:
    """Each of K shards gets about N/K of N devices: every count within 5 binomial standard
    deviations (a failure probability far below 1e-5 for this seeded draw)."""
    n, k = 20_000, 8
    counts = [0] * k
    for i in range(n):
        counts[shard_index(f"device-{i:06d}".encode(), 12345, k)] += 1
    sd = math.sqrt(n * (1 / k) * (1 - 1 / k))
    assert all(abs(c - n / k) <= 5 * sd for c in counts), counts


def test_labels_round_trip_and_reject_everything_else() -> None:
    for generation, index in [(0, 0), (3, 17), (65535, 255)]:
        assert parse_label(shard_label(generation, index)) == (generation, index)
    for bad in ["", "g0", "s0", "g01s0", "g0s01", "g0s256", "g65536s0", "G0S0", "g0s0 ", "g-1s0"]:
        with pytest.raises(SpecError):
            parse_label(bad)


def test_layout_validation() -> None:
    with pytest.raises(SpecError, match="need 3 keys"):
        ShardLayout(count=3, from_round=0, generation=0, seed=0, keys=_keys(2))
    key = _keys(1)[0]
    with pytest.raises(SpecError, match="its own key"):
        ShardLayout(count=2, from_round=0, generation=0, seed=0, keys=(key, key))
    with pytest.raises(SpecError, match="count"):
        ShardLayout(count=0, from_round=0, generation=0, seed=0, keys=())
    with pytest.raises(SpecError, match="hex"):
        ShardLayout(count=1, from_round=0, generation=0, seed=0, keys=("AB" * 32,))
    with pytest.raises(SpecError, match="seed"):
        ShardLayout(count=1, from_round=0, generation=0, seed=2**32, keys=_keys(1))


def test_plan_picks_one_layout_per_round() -> None:
    old, new = _layout(2, from_round=100, generation=0), _layout(3, from_round=200, generation=1)
    plan = ShardPlan((old, new))
    assert plan.layout_for_round(99) is None
    assert plan.layout_for_round(100) is old
    assert plan.layout_for_round(199) is old
    assert plan.layout_for_round(200) is new
    assert plan.rounds_of(old) == (100, 200)
    assert plan.rounds_of(new) == (200, None)
    assert plan.label_for("dev", 99) is None
    assert plan.label_for("dev", 150) in old.labels
    assert plan.label_for("dev", 250) in new.labels
    assert plan.serves("g0s1", 150)
    assert not plan.serves("g0s1", 200)
    assert plan.serves("g1s2", 200)
    assert not plan.serves("g1s2", 199)
    assert not plan.serves("g1s3", 250)  # no such shard
    assert plan.key_of("g1s2") == new.keys[2]
    assert plan.key_of("g2s0") is None
    assert plan.labels == ("g0s0", "g0s1", "g1s0", "g1s1", "g1s2")


def test_plan_validation() -> None:
    with pytest.raises(SpecError, match="one or two"):
        ShardPlan(())
    with pytest.raises(SpecError, match="sorted"):
        ShardPlan((_layout(from_round=5, generation=0), _layout(from_round=5, generation=1)))
    with pytest.raises(SpecError, match="higher generation"):
        ShardPlan((_layout(from_round=5, generation=1), _layout(from_round=6, generation=1)))
    with pytest.raises(SpecError, match="one or two"):
        ShardPlan(tuple(_layout(from_round=r, generation=r) for r in range(3)))
    a = _layout(1, from_round=0, generation=0)
    b = ShardLayout(count=1, from_round=1, generation=1, seed=0, keys=a.keys)
    with pytest.raises(SpecError, match="two layouts"):
        ShardPlan((a, b))


def test_every_device_has_exactly_one_shard_per_round() -> None:
    """Across a reshard, a device's report of any round goes to exactly one shard."""
    plan = ShardPlan(
        (_layout(2, from_round=10, generation=4), _layout(5, from_round=13, generation=5))
    )
    rng = random.Random(3)
    for _ in range(200):
        device = f"d{rng.getrandbits(40)}"
        for round_ in range(10, 20):
            serving = [label for label in plan.labels if plan.serves(label, round_)]
            mine = [label for label in serving if plan.label_for(device, round_) == label]
            assert len(mine) == 1


def test_topics_of_a_shard() -> None:
    assert topics.ingress_topic("lab", "dev-1", "g0s2") == "coco/v1/lab/ingress/g0s2/dev-1"
    assert topics.ingress_filter("lab", "g0s2") == "coco/v1/lab/ingress/g0s2/+"
    assert topics.ingress_filter("lab") == "coco/v1/lab/ingress/+"
    assert topics.batches_topic("lab", "g1s0") == "coco/v1/lab/batches/g1s0"
    assert topics.manifests_topic("lab") == "coco/v1/lab/manifests"
    assert topics.shard_lease_topic("lab", "g0s0") == "coco/v1/lab/shards/g0s0/lease"
    assert topics.shard_lease_topic("lab", None) == "coco/v1/lab/shards/-/lease"
    assert topics.shard_of_topic("lab", "coco/v1/lab/batches/g1s0", "batches") == "g1s0"
    assert topics.shard_of_topic("lab", "coco/v1/lab/batches", "batches") == ""
    assert topics.shard_of_topic("lab", "coco/v1/lab/batches/x", "batches") is None
    assert topics.shard_of_topic("lab", "coco/v1/other/batches/g0s0", "batches") is None
    with pytest.raises(SpecError):
        topics.ingress_topic("lab", "dev", "shard1")


def test_announcement_round_trips_shards() -> None:
    plan = ShardPlan(
        (_layout(2, from_round=5, generation=0), _layout(3, from_round=9, generation=1))
    )
    payload = encode_announcement(SPEC, min_batch=10, delta=1e-6, round_seconds=5, shards=plan)
    decoded = decode_announcement(payload)
    assert shard_plan(decoded) == plan
    assert "batch_public_key" not in decoded
    unsharded = decode_announcement(encode_announcement(SPEC, min_batch=10, delta=1e-6))
    assert shard_plan(unsharded) is None


def test_announcement_refuses_bad_shards() -> None:
    plan = ShardPlan((_layout(1),))
    with pytest.raises(SpecError, match="one key per shard"):
        encode_announcement(
            SPEC, min_batch=10, delta=1e-6, batch_public_key=_keys(1)[0], shards=plan
        )
    good = json.loads(encode_announcement(SPEC, min_batch=10, delta=1e-6, shards=plan))
    mutations: list[Callable[[dict[str, Any]], object]] = [
        lambda m: m.update(batch_public_key=_keys(1)[0]),
        lambda m: m.update(shards={}),
        lambda m: m.update(shards=[]),
        lambda m: m["shards"][0].update(count=2),
        lambda m: m["shards"][0].update(extra=1),
        lambda m: m["shards"][0].pop("seed"),
        lambda m: m["shards"][0].update(generation=True),
    ]
    for mutate in mutations:
        message = json.loads(json.dumps(good))
        mutate(message)
        with pytest.raises(SpecError):
            decode_announcement(json.dumps(message).encode())


def test_labels_ahead_are_the_shards_of_layouts_not_begun() -> None:
    """``coco shuffler prepare``'s default: the shards of every layout whose first round
    is after the current one (not the one that begins now: devices publish to it already)."""
    plan = ShardPlan((_layout(1), _layout(2, from_round=10, generation=1)))
    assert plan.labels_ahead(9) == ("g1s0", "g1s1")
    assert plan.labels_ahead(10) == ()
    assert ShardPlan((_layout(2, from_round=5),)).labels_ahead(0) == ("g0s0", "g0s1")
