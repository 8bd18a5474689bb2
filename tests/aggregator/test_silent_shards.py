"""A shard of the layout in force that releases nothing while the others do is reported
silent (aggregator.service.core.silence), in deterministic rounds: at the core, then
through the service's log and gauges (no broker)."""

from __future__ import annotations

import logging

import numpy as np
import pytest
from prometheus_client import CollectorRegistry, Gauge

from aggregator.service.core.batch_codec import encode_batch_arrays
from aggregator.service.core.keys import anchor_of
from aggregator.service.core.machine import AggregatorCore
from aggregator.service.core.rules import CoreRules
from aggregator.service.core.silence import TRACKED_ROUNDS, SilenceChange, SilenceWatch
from aggregator.service.intake import log_silence
from aggregator.service.metrics import AggregatorMetrics
from edge import MechanismSpec
from edge.batch_auth import BatchSigner
from edge.shards import ShardPlan
from tests.aggregator.test_sharded_service import layout

SPEC = MechanismSpec(mechanism="coco", d=6, s=2, epsilon=1.0)
DEP = "silence"
NOW = 1_800_000_000.0
ROUND = int(NOW // 60)
RESHARD = ROUND + 20
LABELS = ("g0s0", "g0s1", "g0s2")
SIGNERS = {label: BatchSigner.generate(DEP, label) for label in (*LABELS, "g1s0", "g1s1")}
PLAN = ShardPlan(
    (
        layout(0, [SIGNERS[label] for label in LABELS], ROUND - 10),
        layout(1, [SIGNERS["g1s0"], SIGNERS["g1s1"]], RESHARD),
    )
)


def release(watch: SilenceWatch, round_: int, *labels: str) -> list[SilenceChange]:
    for label in labels:
        watch.released(label, round_)
    return watch.changes(PLAN)


def test_a_shard_silent_while_the_others_release_is_reported_once_and_then_cleared() -> None:
    watch = SilenceWatch(threshold=5)
    assert release(watch, ROUND, *LABELS) == []
    for k in range(1, 5):
        assert release(watch, ROUND + k, "g0s0", "g0s1") == []
        assert watch.silent_rounds(PLAN) == {"g0s0": 0, "g0s1": 0, "g0s2": k}
    assert release(watch, ROUND + 5, "g0s0") == [SilenceChange("g0s2", True, 5)]
    assert watch.silent == ("g0s2",)
    for k in range(6, 9):  # still silent: said once
        assert release(watch, ROUND + k, "g0s1") == []
    assert watch.silent_rounds(PLAN)["g0s2"] == 8
    assert release(watch, ROUND + 9, "g0s2") == [SilenceChange("g0s2", False, 8)]
    assert not watch.silent
    # g0s0 last released round 5: 4 released rounds after it (g0s0 is not silent yet)
    assert watch.silent_rounds(PLAN) == {"g0s0": 4, "g0s1": 1, "g0s2": 0}


def test_an_idle_fleet_and_rounds_nobody_released_raise_nothing() -> None:
    watch = SilenceWatch(threshold=2)
    assert release(watch, ROUND, *LABELS) == []
    for _ in range(10):  # nobody releases: nothing changes, however long
        assert watch.changes(PLAN) == []
    # rounds nobody released in between do not count, nor does a round the others
    # released a little earlier than this shard
    assert release(watch, ROUND + 7, "g0s0", "g0s1") == []
    assert watch.silent_rounds(PLAN) == {"g0s0": 0, "g0s1": 0, "g0s2": 1}
    assert release(watch, ROUND + 7, "g0s2") == []
    assert watch.silent_rounds(PLAN) == {"g0s0": 0, "g0s1": 0, "g0s2": 0}


def test_a_shard_catching_up_old_rounds_stays_silent_until_it_is_back() -> None:
    watch = SilenceWatch(threshold=3)
    release(watch, ROUND, *LABELS)
    for k in range(1, 8):
        release(watch, ROUND + k, "g0s0", "g0s1")
    assert watch.silent == ("g0s2",)
    assert release(watch, ROUND + 1, "g0s2") == []  # 6 rounds behind still
    assert release(watch, ROUND + 2, "g0s2") == []
    assert release(watch, ROUND + 6, "g0s2") == [SilenceChange("g0s2", False, 7)]


def test_a_shard_that_never_released_counts_from_the_start() -> None:
    watch = SilenceWatch(threshold=3)
    release(watch, ROUND, "g0s0", "g0s1")
    release(watch, ROUND + 1, "g0s0", "g0s1")
    assert release(watch, ROUND + 2, "g0s1") == [SilenceChange("g0s2", True, 3)]
    assert release(watch, ROUND + 3, "g0s2") == [SilenceChange("g0s2", False, 3)]
    assert not watch.silent


def test_only_the_layout_in_force_is_watched() -> None:
    watch = SilenceWatch(threshold=3)
    for k in range(3):
        release(watch, ROUND + k, "g0s0", "g0s1")
    assert watch.silent == ("g0s2",)
    # the next layout's first release: the old shards leave the watch without a word
    assert release(watch, RESHARD, "g1s0") == []
    assert not watch.silent
    assert watch.silent_rounds(PLAN) == {"g1s0": 0, "g1s1": 1}
    # a late release of the old layout counts for no one of the layout in force
    assert release(watch, ROUND + 4, "g0s2") == []
    assert watch.silent_rounds(PLAN) == {"g1s0": 0, "g1s1": 1}
    assert watch.changes(None) == []  # an unsharded deployment has no shards to watch


def test_memory_is_bounded() -> None:
    plan = ShardPlan(PLAN.layouts[:1])  # one layout, for ever
    watch = SilenceWatch(threshold=5)
    for k in range(TRACKED_ROUNDS + 50):
        watch.released("g0s0", ROUND + k)
        watch.released("g0s1", ROUND + k)
        watch.silent_rounds(plan)
    assert watch.silent_rounds(plan)["g0s2"] == TRACKED_ROUNDS
    watch.released("g0s2", ROUND + TRACKED_ROUNDS + 50)
    assert watch.silent_rounds(plan) == {"g0s0": 1, "g0s1": 1, "g0s2": 0}
    assert len(watch._rounds) == 1


def test_a_threshold_below_one_is_refused() -> None:
    with pytest.raises(ValueError, match="silent_shard_rounds"):
        SilenceWatch(threshold=0)


def _core() -> AggregatorCore:
    rules = CoreRules(
        spec=SPEC,
        deployment=DEP,
        trusted=anchor_of(None, PLAN),
        min_batch=4,
        retention_rounds=100,
        round_seconds=60,
        silent_shard_rounds=5,
    )
    return AggregatorCore(rules, delta=1e-6)


def _batch(label: str, round_: int, batch_id: int) -> bytes:
    rng = np.random.default_rng(batch_id)
    seeds = rng.integers(0, 2**32, 5, dtype=np.uint32)
    z = rng.integers(0, SPEC.t, 5).astype(np.uint16)
    body = encode_batch_arrays(SPEC.fingerprint_int, round_, batch_id.to_bytes(16, "big"), seeds, z)
    return SIGNERS[label].seal(body)


def test_the_core_feeds_applied_batches_and_the_gauges_follow() -> None:
    core = _core()
    metrics = AggregatorMetrics(CollectorRegistry(), spec=SPEC, dims=[0])
    batch_id = 0
    for k in range(6):
        for label in LABELS[:2] if k else LABELS:
            batch_id += 1
            now = NOW + 60 * k
            assert core.handle(_batch(label, ROUND + k, batch_id), now=now, shard=label) == (
                "applied"
            )
        # a duplicate is no release of a new round
        duplicate = _batch("g0s0", ROUND + k, batch_id - 1) if k else b""
        if k:
            assert core.handle(duplicate, now=now, shard="g0s0") == "duplicate"
    assert core.silence.changes(core.keys.plan) == [SilenceChange("g0s2", True, 5)]
    metrics.sync(core)
    assert _samples(metrics.shard_silent_rounds) == {"g0s0": 0.0, "g0s1": 0.0, "g0s2": 5.0}
    assert _samples(metrics.shard_silent) == {"g0s0": 0.0, "g0s1": 0.0, "g0s2": 1.0}
    # the next layout in force: only its shards are labelled
    for label in ("g1s0", "g1s1"):
        batch_id += 1
        core.handle(_batch(label, RESHARD, batch_id), now=NOW + 60 * 20, shard=label)
    metrics.sync(core)
    assert _samples(metrics.shard_silent_rounds) == {"g1s0": 0.0, "g1s1": 0.0}
    assert _samples(metrics.shard_silent) == {"g1s0": 0.0, "g1s1": 0.0}


def _samples(gauge: Gauge) -> dict[str, float]:
    return {
        sample.labels["shard"]: sample.value
        for family in gauge.collect()
        for sample in family.samples
    }


def test_the_service_logs_one_warning_and_one_info(caplog: pytest.LogCaptureFixture) -> None:
    core = _core()
    batch_id = 0
    with caplog.at_level(logging.INFO, logger="aggregator.service"):
        for k in range(8):
            for label in LABELS if k in (0, 7) else LABELS[:2]:
                batch_id += 1
                core.handle(_batch(label, ROUND + k, batch_id), now=NOW + 60 * k, shard=label)
                log_silence(core)
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    infos = [r.getMessage() for r in caplog.records if "released again" in r.getMessage()]
    assert len(warnings) == 1
    assert warnings[0].startswith("shard g0s2 has released nothing for 5 rounds")
    # round 7: the others released it first, so it counted 7 silent rounds for a moment
    assert infos == ["shard g0s2 released again (it was silent for up to 7 rounds)"]
