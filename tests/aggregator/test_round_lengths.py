"""Rounds are times: a change of ``round_seconds`` in either direction, at the core.

The aggregator's core (no broker, no clock of its own: synthetic times) is fed what a
shuffler releases over rounds whose length changes, 2 -> 3 -> 2 s and 60 -> 10 -> 60 s,
as wire-version-2 batches and manifests (each with its round's length), with the last
release of each length arriving after the first of the next, every batch delivered again
at the end, and the core either left running or restarted at each change from its
checkpoint text (under the newly announced length) and its ledger file. Every batch is
applied once (nothing ``stale_round``, nothing kept), the series has one row per round
(its own interval of time), the manifests reconcile with nothing missing or unlisted, and
the privacy ledger charges exactly one participation per source round.

Also: the codec reads both wire versions; the batch memory's horizon in seconds; a
checkpoint and a ledger file written when rounds were numbers are read under the
announced length (or the checkpoint refused when that length cannot be the one it was
written under).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from aggregator.ledger.ledger_file import decode_ledger, encode_ledger, encode_ledger_content
from aggregator.ledger.privacy_ledger import PrivacyLedger
from aggregator.series.core import Delta
from aggregator.service.core.batch_codec import encode_batch_arrays
from aggregator.service.core.checkpoint import Checkpoint
from aggregator.service.core.checkpoint_codec import decode_checkpoint, encode_checkpoint
from aggregator.service.core.machine import AggregatorCore, check_resumable
from aggregator.service.core.memory import BatchMemory
from aggregator.service.core.rules import CoreRules
from edge import MechanismSpec, codec
from edge.batch_auth import BatchSigner
from edge.codec import CodecError

SPEC = MechanismSpec(mechanism="coco", d=6, s=2, epsilon=1.0)
DEPLOYMENT = "lengths"
SIGNER = BatchSigner.generate(DEPLOYMENT)
MIN_BATCH = 3
DELTA = 1e-6
T0 = 1_800_000_000  # a multiple of 2, 3, 10 and 60
GRACE = 30.0


def rules(round_seconds: int | None, retention_rounds: int = 50) -> CoreRules:
    return CoreRules(
        spec=SPEC,
        deployment=DEPLOYMENT,
        trusted=SIGNER.public_key_hex,
        min_batch=MIN_BATCH,
        retention_rounds=retention_rounds,
        round_seconds=round_seconds,
        manifest_grace=GRACE,
    )


@dataclass
class Release:
    """One round's release: its batches (sealed) and manifest (sealed), and when it comes."""

    round: int
    length: int
    at: float
    batches: list[bytes]
    sizes: list[int]
    manifest: bytes


@dataclass
class Schedule:
    releases: list[Release] = field(default_factory=list)
    n: int = 0


def schedule(phases: list[tuple[int, int]], seed: int) -> Schedule:
    """The releases of ``phases`` (``(round_seconds, rounds)``, one after the other in
    time: each length's first round starts at or after the previous one's last ended),
    two batches a round; the last release of each length comes after the next length's
    first (in flight across the change)."""
    rng = np.random.default_rng(seed)
    out = Schedule()
    t = T0
    next_id = 0
    for length, rounds in phases:
        first = -(-t // length)
        for round_ in range(first, first + rounds):
            sizes = [int(rng.integers(MIN_BATCH, MIN_BATCH + 5)) for _ in range(2)]
            sealed, entries = [], []
            for size in sizes:
                seeds = rng.integers(0, 2**32, size, dtype=np.uint32)
                z = rng.integers(0, SPEC.t, size).astype(np.uint16)
                batch_id = next_id.to_bytes(16, "big")
                next_id += 1
                raw = encode_batch_arrays(
                    SPEC.fingerprint_int, round_, batch_id, seeds, z, round_seconds=length
                )
                sealed.append(SIGNER.seal(raw))
                entries.append((batch_id, size))
            manifest = codec.encode_manifest(
                SPEC.fingerprint_int,
                round_,
                next_id.to_bytes(16, "big"),
                entries,
                [(round_, length, sum(sizes))],
                round_seconds=length,
            )
            next_id += 1
            at = (round_ + 1) * length + 0.5
            out.releases.append(
                Release(round_, length, at, sealed, sizes, SIGNER.seal_manifest(manifest))
            )
            out.n += sum(sizes)
        t = (first + rounds) * length
    # the last release of each length arrives after the first of the next one
    order = list(out.releases)
    index = 0
    for _, rounds in phases[:-1]:
        index += rounds
        order[index - 1], order[index] = order[index], order[index - 1]
    out.releases = order
    return out


def restart(
    core: AggregatorCore, round_seconds: int, now: float, series_file: list[Delta]
) -> AggregatorCore:
    """A new core under the announced ``round_seconds``, from ``core``'s checkpoint text,
    ledger file text and series records (as a restarted service reads them)."""
    content = core.content(generation=1, written_at=now)
    series_file.extend(content.series_deltas)
    text = encode_checkpoint(content)
    ledger_text = encode_ledger(core.ledger)
    checkpoint = decode_checkpoint(text, Path("c.json"))
    fresh = AggregatorCore(rules(round_seconds), delta=DELTA)
    assert check_resumable(fresh, checkpoint) is None
    fresh.restore(checkpoint)
    assert fresh.series is not None
    fresh.series.replay(series_file)
    fresh.ledger = decode_ledger(ledger_text, path=Path("l"), spec=SPEC, delta=DELTA)
    assert not fresh.ledger.numbered
    fresh.ledger.round_seconds = round_seconds
    return fresh


CASES = {
    "2-3-2": [(2, 5), (3, 5), (2, 5)],
    "60-10-60": [(60, 3), (10, 8), (60, 3)],
}


@pytest.mark.parametrize("restarted", [False, True], ids=["running", "restarted"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_a_change_of_round_length_applies_every_batch_once(case: str, restarted: bool) -> None:
    phases = CASES[case]
    plan = schedule(phases, seed=len(case) + restarted)
    core = AggregatorCore(rules(phases[0][0]), delta=DELTA)
    length_now = phases[0][0]
    outcomes: list[str] = []
    series_file: list[Delta] = []
    for release in plan.releases:
        if restarted and release.length != length_now:
            # the new length announced, the aggregator restarted
            core = restart(core, release.length, release.at, series_file)
            length_now = release.length
        for sealed in release.batches:
            outcomes.append(core.handle(sealed, now=release.at))
        outcomes.append(core.manifest(release.manifest, now=release.at))
    end = max(r.at for r in plan.releases)
    for release in plan.releases:  # every batch and manifest re-sent: each a duplicate
        for sealed in release.batches:
            assert core.handle(sealed, now=end) == "duplicate"
        assert core.manifest(release.manifest, now=end) == "duplicate"
    batches = sum(len(r.batches) for r in plan.releases)
    assert outcomes.count("applied") == batches
    assert outcomes.count("accepted") == len(plan.releases)
    assert len(outcomes) == batches + len(plan.releases)
    assert core.counters.rejected == {}
    assert core.counters.manifests_rejected == {}
    assert len(core.quarantine) == 0
    assert core.state.n == plan.n == core.counters.reports
    # the manifests: every batch they list came, none unlisted
    core.reconcile(end + 3 * GRACE)
    counts = core.reconciler.counts
    assert (counts.reports_missing, counts.batches_unlisted) == (0, 0)
    # the series: one row per round, its own interval of time
    assert core.series is not None
    rows = {(row.start, row.end): row for row in core.series.rows()}
    expected = {(r.round * r.length, (r.round + 1) * r.length): sum(r.sizes) for r in plan.releases}
    assert {key: row.state.n for key, row in rows.items()} == expected
    # the ledger: one participation per source round, never fewer
    core.compact_ledger()
    assert sum(core.ledger.rounds().values()) == len(plan.releases)
    assert core.ledger.smallest == min(sum(r.sizes) for r in plan.releases)


def test_a_batch_of_an_old_round_is_stale_by_its_time_not_its_number() -> None:
    """After 2 s -> 3 s the 3-s round numbers are below the 2-s ones: a 3-s batch is
    applied (its time is after them), a 2-s batch from before the horizon's time is
    stale; and after 60 s -> 10 s, a 10-s round whose number is far above is not
    future_round while its time is now."""
    core = AggregatorCore(rules(2, retention_rounds=5), delta=DELTA)
    plan = schedule([(2, 8), (3, 2)], seed=3)
    for release in plan.releases:
        for sealed in release.batches:
            assert core.handle(sealed, now=release.at) == "applied"
    old = schedule([(2, 1)], seed=4).releases[0]  # round T0 / 2: 20 s before the newest
    assert core.handle(old.batches[0], now=old.at + 20) == "stale_round"
    short = AggregatorCore(rules(60), delta=DELTA)
    plan = schedule([(60, 1), (10, 2)], seed=5)
    for release in plan.releases:
        for sealed in release.batches:
            assert short.handle(sealed, now=release.at) == "applied"
    # the retention's numbers count rounds of the unit (the announced 60 s), its starts are
    # times: the newest is a 10-s round's start, not a multiple of 60 in general
    newest = max(release.round * release.length for release in plan.releases)
    assert short.memory.unit == 60
    assert short.memory.newest_start == newest
    assert short.memory.newest_round == newest // 60


def test_a_version_1_batch_is_read_under_the_announced_length() -> None:
    core = AggregatorCore(rules(60), delta=DELTA)
    round_ = T0 // 60
    seeds = np.arange(5, dtype=np.uint32)
    z = np.zeros(5, dtype=np.uint16)
    raw = encode_batch_arrays(SPEC.fingerprint_int, round_, b"\x01" * 16, seeds, z)
    assert raw[0] == 1
    assert core.handle(SIGNER.seal(raw), now=T0 + 61) == "applied"
    assert core.memory.by_round() == {round_ * 60: (b"\x01" * 16,)}
    # the same round as version 2: the same key (a duplicate of the same id)
    again = encode_batch_arrays(
        SPEC.fingerprint_int, round_, b"\x01" * 16, seeds, z, round_seconds=60
    )
    assert core.handle(SIGNER.seal(again), now=T0 + 61) == "duplicate"


def test_a_batch_without_manifest_is_charged_for_the_time_its_round_ended() -> None:
    """Announced 10 s; a version-2 batch of a 60-s round (sent before the change) with no
    manifest yet: the ledger dates its participation at the end of its own 60-s round,
    whether applied or refused and charged (below min_batch); a version-1 batch at the end
    of its round under the announced length."""
    core = AggregatorCore(rules(10), delta=DELTA)
    round_ = T0 // 60
    start = round_ * 60
    for batch_id, size in ((b"\x07" * 16, 5), (b"\x08" * 16, MIN_BATCH - 1)):
        raw = encode_batch_arrays(
            SPEC.fingerprint_int, round_, batch_id, np.arange(size, dtype=np.uint32),
            np.zeros(size, dtype=np.uint16), round_seconds=60,
        )  # fmt: skip
        expected = "applied" if size >= MIN_BATCH else "below_min_batch"
        assert core.handle(SIGNER.seal(raw), now=start + 61) == expected
    v1 = encode_batch_arrays(
        SPEC.fingerprint_int, start // 10 + 6, b"\x09" * 16, np.arange(4, dtype=np.uint32),
        np.zeros(4, dtype=np.uint16),
    )  # fmt: skip
    assert core.handle(SIGNER.seal(v1), now=start + 71) == "applied"
    assert core.ledger.period_rounds(start, start + 59) == {}
    assert core.ledger.period_rounds(start + 59, start + 60) == {MIN_BATCH - 1: 1, 5: 1}
    assert core.ledger.period_rounds(start + 60, start + 70) == {4: 1}


def test_without_a_round_length_the_horizon_counts_rounds_of_the_newest_length() -> None:
    """A spec file without ``round_seconds``: version-2 batches still carry theirs, and
    the horizon counts ``retention_rounds`` of the newest round's length."""
    core = AggregatorCore(rules(None, retention_rounds=5), delta=DELTA)
    plan = schedule([(60, 12)], seed=6)
    outcomes = [
        core.handle(sealed, now=release.at)
        for release in sorted(plan.releases, key=lambda r: r.round)[:4]
        for sealed in release.batches
    ]
    assert outcomes == ["applied"] * 8
    assert core.memory.floor == (T0 // 60 + 3 - 5 + 1) * 60
    late = sorted(plan.releases, key=lambda r: r.round)[11]
    assert core.handle(late.batches[0], now=late.at) == "applied"
    early = sorted(plan.releases, key=lambda r: r.round)[4]
    assert core.handle(early.batches[0], now=late.at) == "stale_round"


# -- the batch memory --------------------------------------------------------------------


@settings(max_examples=200, deadline=None, derandomize=True)
@given(
    st.lists(st.tuples(st.sampled_from([1, 2, 3, 10, 60]), st.integers(0, 400)), min_size=1),
    st.integers(1, 20),
    st.sampled_from([1, 2, 60, None]),
)
def test_the_memory_forgets_only_below_a_floor_that_never_moves_back(
    batches: list[tuple[int, int]], retention: int, unit: int | None
) -> None:
    memory = BatchMemory(retention, unit)
    floors: list[int] = []
    applied: dict[bytes, int] = {}
    for i, (length, round_) in enumerate(batches):
        start = T0 + round_ * length
        batch_id = i.to_bytes(16, "big")
        if memory.stale(start):
            assert memory.floor is not None
            assert start < memory.floor
            continue
        memory.remember(batch_id, start, length)
        applied[batch_id] = start
        assert memory.floor is not None
        floors.append(memory.floor)
    assert floors == sorted(floors)
    for batch_id, start in applied.items():  # remembered exactly while not stale
        assert (batch_id in memory) == (not memory.stale(start))
    if memory.newest_start is not None and unit is not None:
        assert memory.floor == max(0, memory.newest_start - retention * unit + unit)
    # restored (a restart): nothing forgotten is accepted again, nothing kept is stale
    again = BatchMemory(retention, unit)
    again.restore({s: list(ids) for s, ids in memory.by_round().items()}, memory.newest_length)
    assert len(again) == len(memory)
    for batch_id in applied:
        if batch_id in memory:
            assert batch_id in again
    if unit is not None:  # the same floor: nothing forgotten is accepted again
        assert again.floor == memory.floor
        for batch_id, start in applied.items():
            assert again.stale(start) == (batch_id not in again)


# -- the codec -----------------------------------------------------------------------------


@settings(max_examples=200, deadline=None, derandomize=True)
@given(
    st.integers(0, 2**32 - 1),
    st.integers(0, 2**32 - 1),
    st.lists(st.tuples(st.integers(0, 2**32 - 1), st.integers(0, 2**16 - 1)), max_size=6),
    st.sampled_from([0, 1, 2, 3, 60, 86_400]),
)
def test_both_wire_versions_round_trip(
    fingerprint: int, round_: int, records: list[tuple[int, int]], round_seconds: int
) -> None:
    seeds = [s for s, _ in records]
    zs = [z for _, z in records]
    batch = codec.encode_batch(
        fingerprint, round_, b"b" * 16, seeds, zs, round_seconds=round_seconds
    )
    assert batch[0] == (2 if round_seconds else 1)
    assert len(batch) == 30 + 6 * len(records) + (4 if round_seconds else 0)
    assert codec.decode_batch(batch) == (fingerprint, round_, b"b" * 16, seeds, zs)
    assert codec.round_seconds_of(batch) == round_seconds
    vectorised = encode_batch_arrays(
        fingerprint,
        round_,
        b"b" * 16,
        np.array(seeds, dtype=np.uint32),
        np.array(zs, dtype=np.uint16),
        round_seconds=round_seconds,
    )
    assert vectorised == batch
    entries = [(b"e" * 16, 5), (b"f" * 16, 7)]
    sources = [(round_, 3, 4), (codec.U32_MAX, 0, 8)]
    manifest = codec.encode_manifest(
        fingerprint, round_, b"r" * 16, entries, sources, round_seconds=round_seconds
    )
    assert manifest[0] == (2 if round_seconds else 1)
    assert codec.decode_manifest(manifest) == (
        fingerprint, round_, b"r" * 16, entries, sources
    )  # fmt: skip
    assert codec.round_seconds_of(manifest) == round_seconds


def reason(payload: bytes, decode: str) -> str:
    with pytest.raises(CodecError) as caught:
        getattr(codec, decode)(payload)
    return caught.value.reason


def test_malformed_version_2_messages_are_refused_with_their_reason() -> None:
    batch = codec.encode_batch(7, 9, b"b" * 16, [1, 2], [0, 1], round_seconds=3)
    manifest = codec.encode_manifest(
        7, 9, b"r" * 16, [(b"e" * 16, 2)], [(9, 3, 2)], round_seconds=3
    )
    assert reason(batch[:-4], "decode_batch") == "bad_count"  # the trailer missing
    assert reason(batch + b"\0" * 4, "decode_batch") == "bad_count"
    assert reason(batch[:-4] + (0).to_bytes(4, "big"), "decode_batch") == "bad_field"
    assert reason(batch[:-4] + (86_401).to_bytes(4, "big"), "decode_batch") == "bad_field"
    assert reason(manifest[:-4], "decode_manifest") == "bad_count"
    assert reason(manifest[:-4] + (0).to_bytes(4, "big"), "decode_manifest") == "bad_field"
    v1 = codec.encode_batch(7, 9, b"b" * 16, [1, 2], [0, 1])
    assert reason(v1 + b"\0" * 4, "decode_batch") == "bad_count"
    assert reason(b"\x03" + batch[1:], "decode_batch") == "bad_version"
    report = codec.encode_report(7, 9, 1, 0)
    assert reason(b"\x02" + report[1:], "decode_report") == "bad_version"  # reports stay 1
    for bad in (86_401, -1, True):
        with pytest.raises(CodecError):
            codec.encode_batch(7, 9, b"b" * 16, [1], [0], round_seconds=bad)


# -- files written when rounds were numbers ----------------------------------------------


def old_checkpoint(unit: int, written_at: float) -> tuple[Checkpoint, int]:
    """A version-3 checkpoint of a core that applied one v1 batch of round
    ``written_at // unit - 1`` under round length ``unit``, and its round."""
    core = AggregatorCore(rules(unit), delta=DELTA)
    round_ = int(written_at // unit) - 1
    raw = encode_batch_arrays(
        SPEC.fingerprint_int, round_, b"\x05" * 16, np.arange(4, dtype=np.uint32),
        np.zeros(4, dtype=np.uint16),
    )  # fmt: skip
    assert core.handle(SIGNER.seal(raw), now=written_at) == "applied"
    content = core.content(generation=3, written_at=written_at)
    numbered = {start // unit: ids for start, ids in content.batch_rounds.items()}
    reconciliation = dict(content.reconciliation or {})
    reconciliation["losses"] = [
        {"shard": None, "round": round_, "batches": 1, "reports": 9, "at": written_at}
    ]
    checkpoint = Checkpoint(
        **{
            **content.__dict__,
            "version": 3,
            "batch_rounds": numbered,
            "reconciliation": reconciliation,
        }
    )
    text = encode_checkpoint(checkpoint)
    assert json.loads(text)["version"] == 3
    return decode_checkpoint(text, Path("old.json")), round_


def test_a_version_3_checkpoint_is_read_under_the_announced_length() -> None:
    written_at = float(T0 + 600)
    checkpoint, round_ = old_checkpoint(60, written_at)
    core = AggregatorCore(rules(60), delta=DELTA)
    assert check_resumable(core, checkpoint) is None
    core.restore(checkpoint)
    assert core.dirty  # rewritten as version 4
    assert core.memory.by_round() == {round_ * 60: (b"\x05" * 16,)}
    assert [loss.start for loss in core.reconciler.losses] == [round_ * 60]
    raw = encode_batch_arrays(
        SPEC.fingerprint_int, round_, b"\x05" * 16, np.arange(4, dtype=np.uint32),
        np.zeros(4, dtype=np.uint16), round_seconds=60,
    )  # fmt: skip
    assert core.handle(SIGNER.seal(raw), now=written_at) == "duplicate"
    text = encode_checkpoint(core.content(generation=4, written_at=written_at))
    assert json.loads(text)["version"] == 4


def test_a_version_3_checkpoint_of_another_length_is_refused_when_that_shows() -> None:
    written_at = float(T0 + 600)
    checkpoint, _ = old_checkpoint(60, written_at)
    longer = AggregatorCore(rules(120), delta=DELTA)  # its rounds would start in the future
    problem = check_resumable(longer, checkpoint)
    assert problem is not None
    assert "another round length" in problem
    assert "round_seconds 120" in problem


def test_a_ledger_file_of_round_numbers_is_renumbered_with_the_same_participations() -> None:
    ledger = PrivacyLedger(SPEC, delta=DELTA, round_seconds=60)
    base = T0 // 60
    for i in range(6):
        ledger.record_manifest(
            round=base + i,
            shard="",
            release_id=bytes([i]) * 16,
            batches=[(bytes([100 + i]) * 16, 10 + i)],
            sources=[(base + i, 60)],
        )
    ledger.record_batch(round=base + 5, shard="", batch_id=b"\xee" * 16, size=4)
    ledger.compact(base + 2)
    before = ledger.rounds()
    data = json.loads(encode_ledger(ledger))
    del data["ledger"]["rounds"]  # as written when rounds were numbers
    text = encode_ledger_content(data["ledger"])
    old = decode_ledger(text, path=Path("l"), spec=SPEC, delta=DELTA)
    assert old.numbered
    old.renumber(60)
    assert not old.numbered
    assert old.rounds() == before
    document = old.to_dict()
    assert document["compacted_through"] == (base + 3) * 60 - 1
    assert [m[0] for m in document["manifests"]] == [(base + i) * 60 for i in (3, 4, 5)]
    # a release of the next round, as a start, is recorded (not late)
    assert (
        old.record_manifest(
            round=(base + 6) * 60,
            shard="",
            release_id=b"\x77" * 16,
            batches=[(b"\x78" * 16, 9)],
            sources=[(base + 6, 60)],
        )
        == "recorded"
    )


def test_a_restart_under_a_longer_length_never_lets_a_forgotten_batch_back_in() -> None:
    """Retention 5 rounds at 10 s: a batch of the first round is forgotten after 12 rounds
    and refused as ``stale_round`` (the quarantine keeps such a batch and replays it at
    every start). Restarted under 60 s, the horizon in seconds is 6 times wider: it must
    not move back below where it was, or that batch would be applied a second time."""
    core = AggregatorCore(rules(10, retention_rounds=5), delta=DELTA)
    plan = schedule([(10, 12)], seed=7)
    for release in plan.releases:
        for sealed in release.batches:
            assert core.handle(sealed, now=release.at) == "applied"
    first = plan.releases[0].batches[0]
    now = plan.releases[-1].at
    assert core.handle(first, now=now) == "stale_round"
    n = core.state.n
    restarted = restart(core, 60, now, [])
    assert restarted.handle(first, now=now + 1) == "stale_round"
    assert restarted.state.n == n
