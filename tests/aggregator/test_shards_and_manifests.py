"""Shards and manifests in the aggregator's core (no broker): exactly the announced
per-shard keys, each for its own topic and its layout's rounds; per-shard batch sizes;
manifests reconciled against batches (missing, late, unlisted, mismatched, duplicate), and
all of it through a checkpoint and back. The MQTT path is in test_sharded_service.py."""

from __future__ import annotations

from pathlib import Path
from random import Random

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from aggregator.service.core.batch_codec import encode_batch_arrays
from aggregator.service.core.checkpoint_codec import decode_checkpoint, encode_checkpoint
from aggregator.service.core.keys import anchor_of, describe_anchor, is_anchor
from aggregator.service.core.machine import AggregatorCore
from aggregator.service.core.rules import CoreRules
from edge import MechanismSpec
from edge.batch_auth import BatchSigner
from edge.codec import encode_manifest
from edge.shards import ShardLayout, ShardPlan

SPEC = MechanismSpec(mechanism="coco", d=6, s=2, epsilon=1.0)
DEP = "sharded"
MIN_BATCH = 4
NOW = 1_800_000_000.0
ROUND = int(NOW // 60)
RESHARD = ROUND + 3
GRACE = 30.0

OLD = {label: BatchSigner.generate(DEP, label) for label in ("g0s0", "g0s1")}
NEW = {label: BatchSigner.generate(DEP, label) for label in ("g1s0", "g1s1", "g1s2")}
PLAN = ShardPlan(
    (
        ShardLayout(
            count=2,
            from_round=ROUND - 10,
            generation=0,
            seed=7,
            keys=tuple(OLD[f"g0s{i}"].public_key_hex for i in range(2)),
        ),
        ShardLayout(
            count=3,
            from_round=RESHARD,
            generation=1,
            seed=8,
            keys=tuple(NEW[f"g1s{i}"].public_key_hex for i in range(3)),
        ),
    )
)
SIGNERS = {**OLD, **NEW}


def core(grace: float = GRACE, retention_rounds: int = 100) -> AggregatorCore:
    rules = CoreRules(
        spec=SPEC,
        deployment=DEP,
        trusted=anchor_of(None, PLAN),
        min_batch=MIN_BATCH,
        retention_rounds=retention_rounds,
        round_seconds=60,
        manifest_grace=grace,
    )
    return AggregatorCore(rules, delta=1e-6)


def raw(size: int, batch_id: int, round_: int = ROUND, seed: int = 0) -> bytes:
    rng = np.random.default_rng(seed + batch_id)
    seeds = rng.integers(0, 2**32, size, dtype=np.uint32)
    z = rng.integers(0, SPEC.t, size).astype(np.uint16)
    return encode_batch_arrays(SPEC.fingerprint_int, round_, bid(batch_id), seeds, z)


def bid(n: int) -> bytes:
    return n.to_bytes(16, "big")


def manifest(label: str, round_: int, release: int, entries: list[tuple[int, int]]) -> bytes:
    body = encode_manifest(
        SPEC.fingerprint_int,
        round_,
        bid(10_000 + release),
        [(bid(b), c) for b, c in entries],
        [(round_, 60, sum(c for _, c in entries))],
    )
    return SIGNERS[label].seal_manifest(body)


def test_exactly_the_announced_keys_for_their_topics_and_rounds() -> None:
    agg = core()
    assert agg.keys.labels == ("g0s0", "g0s1", "g1s0", "g1s1", "g1s2")
    ok = OLD["g0s0"].seal(raw(5, 1))
    assert agg.handle(ok, now=NOW) == "unknown_shard"  # the unsharded topic: no key there
    checks = [
        (OLD["g0s0"].seal(raw(5, 1)), "g0s0", "applied"),
        (OLD["g0s1"].seal(raw(6, 2)), "g0s0", "bad_signature"),  # another shard's key
        (OLD["g0s1"].seal(raw(6, 2)), "g0s1", "applied"),
        (BatchSigner.generate(DEP, "g0s0").seal(raw(6, 3)), "g0s0", "bad_signature"),
        (OLD["g0s0"].seal(raw(7, 4)), "g9s0", "unknown_shard"),  # not announced
        (OLD["g0s0"].seal(raw(7, 5, RESHARD)), "g0s0", "wrong_shard"),  # the new layout's round
        (NEW["g1s2"].seal(raw(7, 6, ROUND)), "g1s2", "wrong_shard"),  # before its layout
        (NEW["g1s2"].seal(raw(9, 7, RESHARD)), "g1s2", "applied"),
        (OLD["g0s0"].seal(raw(8, 8)), "g0s0", "applied"),
    ]
    for payload, shard, want in checks:
        assert agg.handle(payload, now=NOW, shard=shard) == want, (shard, want)
    assert {label: s.to_json() for label, s in agg.shards.items()} == {
        "g0s0": {"batches": 2, "reports": 13, "smallest": 5, "latest": 8},
        "g0s1": {"batches": 1, "reports": 6, "smallest": 6, "latest": 6},
        "g1s2": {"batches": 1, "reports": 9, "smallest": 9, "latest": 9},
    }
    assert agg.smallest_batch == 5  # the guarantee every report has
    assert agg.counters.rejected_reports == {"wrong_shard": 14}
    assert describe_anchor(agg.rules.trusted).startswith("shards g0s0=")
    assert is_anchor(agg.rules.trusted)
    assert not is_anchor("[1, 2]")


def test_manifests_reconcile_against_batches() -> None:
    agg = core()
    g0 = OLD["g0s0"]
    assert agg.handle(g0.seal(raw(5, 1)), now=NOW) == "unknown_shard"

    def apply(label: str, size: int, batch_id: int, at: float = NOW) -> None:
        payload = SIGNERS[label].seal(raw(size, batch_id))
        assert agg.handle(payload, now=at, shard=label) == "applied"

    apply("g0s0", 5, 1)
    apply("g0s0", 6, 2)
    # release 1 listed batches 1, 2 and 3; 3 never comes
    assert (
        agg.manifest(manifest("g0s0", ROUND, 1, [(1, 5), (2, 6), (3, 7)]), now=NOW, shard="g0s0")
        == "accepted"
    )
    # the same manifest again: a duplicate
    assert (
        agg.manifest(manifest("g0s0", ROUND, 1, [(1, 5), (2, 6), (3, 7)]), now=NOW, shard="g0s0")
        == "duplicate"
    )
    # one that disagrees with a batch received (count 5, not 9): rejected, nothing changes
    before = agg.reconciler.to_json()
    assert (
        agg.manifest(manifest("g0s0", ROUND, 2, [(1, 9)]), now=NOW, shard="g0s0")
        == "manifest_mismatch"
    )
    assert agg.reconciler.to_json() == before
    # signed by another shard's key, or sent on another shard's topic
    assert (
        agg.manifest(manifest("g0s1", ROUND, 3, [(4, 5)]), now=NOW, shard="g0s0") == "bad_signature"
    )
    assert (
        agg.manifest(manifest("g0s0", ROUND, 3, [(4, 5)]), now=NOW, shard="g4s0") == "unknown_shard"
    )
    assert (
        agg.manifest(manifest("g0s0", RESHARD, 3, [(4, 5)]), now=NOW, shard="g0s0") == "wrong_shard"
    )
    # a batch no manifest of its (shard, round) lists
    apply("g0s0", 4, 5)
    # g0s1: its manifest first, then a batch that disagrees with it: the manifest goes, and
    # the privacy ledger charges the batch on its own (ledger_conflict)
    assert agg.manifest(manifest("g0s1", ROUND, 4, [(6, 8)]), now=NOW, shard="g0s1") == "accepted"
    apply("g0s1", 9, 6)
    assert agg.counters.manifests_rejected == {
        "ledger_conflict": 1,
        "manifest_mismatch": 2,
        "bad_signature": 1,
        "unknown_shard": 1,
        "wrong_shard": 1,
    }
    assert agg.counters.manifests_duplicate == 1
    # within the grace period nothing is missing yet
    assert agg.reconcile(NOW + GRACE / 2) == []
    losses = agg.reconcile(NOW + GRACE + 1)
    assert [(loss.shard, loss.start, loss.batches, loss.reports) for loss in losses] == [
        ("g0s0", ROUND * agg.rules.unit, 1, 7)  # a round is told by its start
    ]
    counts = agg.reconciler.counts
    assert (counts.reports_missing, counts.batches_missing, counts.batches_unlisted) == (7, 1, 1)
    # batch 3 comes late: applied once, counted late
    apply("g0s0", 7, 3, NOW + GRACE + 2)
    assert agg.reconciler.counts.reports_late == 7
    assert agg.state.n == 5 + 6 + 4 + 9 + 7

    # all of it survives a checkpoint
    text = encode_checkpoint(agg.content(generation=1, written_at=NOW))
    restored = core()
    restored.restore(decode_checkpoint(text, Path("ckpt.json")))
    assert restored.reconciler.counts == agg.reconciler.counts
    assert list(restored.reconciler.losses) == list(agg.reconciler.losses)
    assert {k: v.to_json() for k, v in restored.shards.items()} == {
        k: v.to_json() for k, v in agg.shards.items()
    }
    assert restored.counters.manifests_rejected == agg.counters.manifests_rejected
    # a manifest re-sent after the restart is still a duplicate
    assert (
        restored.manifest(
            manifest("g0s0", ROUND, 1, [(1, 5), (2, 6), (3, 7)]), now=NOW, shard="g0s0"
        )
        == "duplicate"
    )


def test_an_unsharded_deployment_has_one_key_and_manifests_on_its_own_topic() -> None:
    signer = BatchSigner.generate(DEP)
    rules = CoreRules(
        spec=SPEC,
        deployment=DEP,
        trusted=signer.public_key_hex,
        min_batch=MIN_BATCH,
        retention_rounds=100,
        manifest_grace=GRACE,
    )
    agg = AggregatorCore(rules, delta=1e-6)
    assert agg.keys.labels == ()
    assert agg.handle(signer.seal(raw(5, 1)), now=NOW) == "applied"
    assert agg.shards == {}
    body = encode_manifest(
        SPEC.fingerprint_int, ROUND, bid(1), [(bid(1), 5), (bid(2), 6)], [(ROUND, 60, 11)]
    )
    assert agg.manifest(signer.seal_manifest(body), now=NOW) == "accepted"
    assert agg.manifest(signer.seal_manifest(body), now=NOW, shard="g0s0") == "unknown_shard"
    assert [loss.reports for loss in agg.reconcile(NOW + GRACE)] == [6]


@pytest.mark.parametrize("anchor", ["", "ab" * 31, "[]", '[{"count": 1}]'])
def test_anchors_that_are_neither_a_key_nor_layouts(anchor: str) -> None:
    assert not is_anchor(anchor)


@settings(max_examples=200, deadline=None, derandomize=True)
@given(
    releases=st.lists(
        st.lists(st.tuples(st.integers(MIN_BATCH, 40), st.booleans()), min_size=1, max_size=4),
        min_size=1,
        max_size=4,
    ),
    order=st.randoms(use_true_random=False),
)
def test_missing_reports_are_exactly_the_batches_that_never_came(
    releases: list[list[tuple[int, bool]]], order: Random
) -> None:
    """Any order of batches and manifests, any of the batches lost: once the grace period
    passed, the reports counted missing are exactly those of the lost batches, and every
    batch that came is applied once (a lost one that comes late is counted late)."""
    agg = core()
    events: list[tuple[str, int, int]] = []  # (kind, release, batch index)
    batch_ids: dict[tuple[int, int], int] = {}
    for r, batches in enumerate(releases):
        events.append(("manifest", r, -1))
        for i, (_size, arrives) in enumerate(batches):
            batch_ids[(r, i)] = 100 * (r + 1) + i
            if arrives:
                events.append(("batch", r, i))
    order.shuffle(events)
    label = "g0s1"
    for kind, r, i in events:
        if kind == "manifest":
            entries = [(batch_ids[(r, j)], size) for j, (size, _) in enumerate(releases[r])]
            assert (
                agg.manifest(manifest(label, ROUND, r, entries), now=NOW, shard=label) == "accepted"
            )
        else:
            size = releases[r][i][0]
            payload = SIGNERS[label].seal(raw(size, batch_ids[(r, i)]))
            assert agg.handle(payload, now=NOW, shard=label) == "applied"
    agg.reconcile(NOW + GRACE)
    lost = [
        (r, i) for r, bs in enumerate(releases) for i, (_, arrives) in enumerate(bs) if not arrives
    ]
    counts = agg.reconciler.counts
    assert counts.reports_missing == sum(releases[r][i][0] for r, i in lost)
    assert counts.batches_missing == len(lost)
    assert counts.batches_unlisted == 0
    assert agg.counters.manifests_rejected == {}
    came = sum(size for bs in releases for size, arrives in bs if arrives)
    assert agg.state.n == came
    for r, i in lost:  # late
        payload = SIGNERS[label].seal(raw(releases[r][i][0], batch_ids[(r, i)]))
        assert agg.handle(payload, now=NOW + GRACE + 1, shard=label) == "applied"
    assert agg.reconciler.counts.reports_late == counts.reports_missing


def test_the_ledger_accounts_every_release_applied_here_or_not() -> None:
    """Issue 19 item 6 at the aggregator: a release known from its manifest only, a batch
    refused for its round (wrong_shard) and applied batches all go into the privacy ledger;
    a batch without its manifest is a participation of its own, a manifest charges the
    rounds its reports were sent in."""
    agg = core()
    assert agg.handle(OLD["g0s0"].seal(raw(9, 1)), now=NOW, shard="g0s0") == "applied"
    assert agg.handle(OLD["g0s1"].seal(raw(12, 2)), now=NOW, shard="g0s1") == "applied"
    assert agg.ledger.rounds() == {9: 1, 12: 1}  # no manifest yet: a participation each
    # their manifests: both releases hold reports of round ROUND only, one participation
    assert agg.manifest(manifest("g0s0", ROUND, 1, [(1, 9)]), now=NOW, shard="g0s0") == ("accepted")
    assert agg.manifest(manifest("g0s1", ROUND, 2, [(2, 12)]), now=NOW, shard="g0s1") == (
        "accepted"
    )
    assert agg.ledger.rounds() == {9: 1}  # round ROUND: one participation, at 9
    # a release whose batches never came here (lost at the broker): its manifest counts
    entries = [(77, 5), (78, 6)]
    assert agg.manifest(manifest("g0s1", ROUND + 1, 7, entries), now=NOW, shard="g0s1") == (
        "accepted"
    )
    assert agg.ledger.rounds() == {9: 1, 11: 1}  # the release of 11 reports, once
    # a batch the old layout's shuffler released for a round of the new layout: refused,
    # but released all the same: accounted
    late = OLD["g0s0"].seal(raw(4, 3, RESHARD))
    assert agg.handle(late, now=NOW, shard="g0s0") == "wrong_shard"
    assert agg.ledger.rounds() == {4: 1, 9: 1, 11: 1}
    assert agg.ledger.smallest == 4  # the guarantee every report has
    assert agg.handle(late, now=NOW, shard="g0s0") == "wrong_shard"  # a replay: once
    assert agg.ledger.rounds() == {4: 1, 9: 1, 11: 1}
