"""The shuffler's pure core: rounds, pools, duplicates and release, without any I/O.

Property-based: hypothesis drives random event sequences (reports of honest and hostile
devices with any round number, time passing, acknowledgements, crashes and restarts from
the log) and checks after every step that

* no batch is below ``min_batch``;
* no batch holds two reports of one device, and no device has two reports accepted for
  one round, across restarts and compactions (a replay is a duplicate in any batch);
* no report is released twice, and every accepted report is released, dropped with a
  reason, or still buffered (exact counts);
* a restart from the log, or from a compacted snapshot, gives the very same state.
"""

from __future__ import annotations

import itertools
import random
from collections import Counter
from dataclasses import dataclass, field

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from broker.core.machine import (
    Acked,
    Admitted,
    BatchMaker,
    CoreConfig,
    Effect,
    Released,
    ShufflerCore,
    batch_id_of,
)
from broker.store.records import FILE_HEADER_SIZE, encode_effect, file_header, scan
from edge.codec import KIND_MANIFEST, decode_batch, encode_batch, round_seconds_of

L = 10  # round_seconds
T0 = 1_800_000_000.0  # a Unix time after the clock floor, at a round boundary
FP = 0xC0C0
TPARAM = 8


def config(**overrides: object) -> CoreConfig:
    settings_: dict[str, object] = {
        "fingerprint": FP,
        "t": TPARAM,
        "round_seconds": L,
        "min_batch": 3,
        "max_batch": 7,
        "max_skew": 2.0,
        **overrides,
    }
    return CoreConfig(**settings_)  # type: ignore[arg-type]


_BATCH_IDS = itertools.count()  # unique across makers, like 16 random bytes


def maker(seed: int = 0) -> BatchMaker:
    rng = random.Random(seed)
    return BatchMaker(
        shuffle=rng.shuffle,
        new_batch_id=lambda: next(_BATCH_IDS).to_bytes(16, "big"),
        seal=lambda batch: batch,  # no signature: the core never looks inside the seal
        # every other release with a manifest: restarts must keep it with its batches
        seal_manifest=(lambda manifest: manifest) if seed % 2 else None,
    )


def batches_in(messages: list[bytes]) -> list[bytes]:
    return [m for m in messages if m[1] != KIND_MANIFEST]


def token(device: int) -> int:
    return (device * 0x9E3779B97F4A7C15 + 1) % 2**64  # distinct, spread over the u64 range


SALT = 0x5A17


def report(round_: int, seed: int, z: int = 0, fp: int = FP) -> tuple[int, int, int, int]:
    return (fp, round_, seed, z)


@dataclass
class Harness:
    """A core plus its log, and an independent ledger of what it must have done."""

    cfg: CoreConfig
    core: ShufflerCore = field(init=False)
    log: list[bytes] = field(default_factory=list)
    released: Counter[int] = field(default_factory=Counter)  # seed -> times released
    accepted: int = 0
    dropped: int = 0
    batches: list[bytes] = field(default_factory=list)
    rng_seed: int = 0
    reported: set[tuple[int, int]] = field(default_factory=set)  # (device, round) accepted

    def __post_init__(self) -> None:
        self.core = ShufflerCore(self.cfg)
        self.log.append(file_header(SALT)[0])
        self.commit(self.core.reconfigure(maker()))

    def commit(self, effects: list[Effect]) -> None:
        for effect in effects:
            self.log.append(encode_effect(effect, SALT))
            applied = self.core.apply(effect)
            self.dropped += sum(applied.dropped.values())
            if isinstance(effect, Released):
                for message in effect.messages:
                    if message[1] != KIND_MANIFEST:
                        self.check_batch(message)

    def check_batch(self, message: bytes) -> None:
        _, _, _, seeds, _ = decode_batch(message)
        assert len(seeds) >= self.cfg.min_batch
        devices = [seed // 1000 for seed in seeds]
        assert len(set(devices)) == len(devices), "two reports of one device in a batch"
        for seed in seeds:
            self.released[seed] += 1
            assert self.released[seed] == 1, "a report released twice"
        self.batches.append(message)

    def send(self, now: float, device: int, round_: int, serial: int) -> str | None:
        outcome = self.core.accept(now, token(device), report(round_, device * 1000 + serial))
        if isinstance(outcome, str):
            return outcome
        # One report per device per round, whatever happened in between (restarts,
        # compactions, releases): a replay is never accepted twice, even in another batch.
        assert (device, round_) not in self.reported, "a second report of a device in a round"
        self.reported.add((device, round_))
        self.accepted += 1
        self.commit([outcome])
        if self.core.due_early(round_):
            release = self.core.release_early(round_, maker(self.rng_seed))
            if release is not None:
                self.commit([release])
        return None

    def tick(self, now: float, *, hold: bool = False) -> None:
        self.rng_seed += 1
        self.commit(self.core.tick(now, maker(self.rng_seed), hold=hold))

    def ack_oldest(self) -> None:
        outbox = self.core.outbox()
        if outbox:
            self.commit([Acked(batch_id_of(outbox[0]))])

    def restart(self, *, compact: bool, bounded: bool = True) -> None:
        """Crash and restart: a new core replays the log (or its compaction). ``bounded``:
        check the snapshot is not much larger than the log (not after a change to shorter
        rounds, which copies an old round's tokens to each new round it overlaps)."""
        data = b"".join(self.log)
        result = scan(data, FILE_HEADER_SIZE, SALT)
        assert result.problem is None
        assert result.end == len(data)
        fresh = ShufflerCore(self.cfg)
        for effect in result.effects:
            fresh.apply(effect)
        assert fresh.state_digest() == self.core.state_digest()
        assert fresh.reconfigure(maker()) == []
        if compact:
            snapshot = [file_header(SALT)[0]] + [encode_effect(e, SALT) for e in fresh.snapshot()]
            # one bulk record per round and pool: never much more than the log it replaces
            if bounded:
                assert sum(map(len, snapshot)) <= len(data) + 8 * len(fresh.pool_sizes()) + 64
            self.log = snapshot
            again = ShufflerCore(self.cfg)
            for effect in scan(b"".join(self.log), FILE_HEADER_SIZE, SALT).effects:
                again.apply(effect)
            assert again.state_digest() == fresh.state_digest()
            fresh = again
        self.core = fresh

    def conserved(self) -> None:
        released = sum(self.released.values())
        assert self.accepted == released + self.dropped + self.core.buffered


HOSTILE_ROUNDS = [0, 1, 2**31, 0xFFFFFFF8, 0xFFFFFFFF]

_send = st.tuples(
    st.just("send"),
    st.integers(0, 11),  # device
    st.one_of(
        st.tuples(st.just("relative"), st.integers(-1, 1)),
        st.tuples(st.just("absolute"), st.sampled_from(HOSTILE_ROUNDS)),
    ),
)
_burst = st.tuples(  # several devices report in one round (one of them maybe twice)
    st.just("burst"), st.lists(st.integers(0, 11), min_size=2, max_size=8), st.integers(-1, 1)
)
events = st.lists(
    st.one_of(
        _send,
        _burst,
        _burst,
        st.tuples(st.just("wait"), st.sampled_from([0.5, 1.0, 3.0, 4.5, 6.0, 9.5, 10.0, 25.0])),
        st.tuples(st.just("tick"), st.booleans()),
        st.tuples(st.just("ack")),
        st.tuples(st.just("restart"), st.booleans()),
    ),
    min_size=5,
    max_size=100,
)


@settings(max_examples=500, deadline=None)
@given(
    events=events,
    policy=st.sampled_from(["carry", "drop"]),
    release_size=st.sampled_from([None, 4]),
    late=st.sampled_from([0.0, 15.0]),
)
def test_invariants_over_random_event_sequences(
    events: list[tuple[object, ...]], policy: str, release_size: int | None, late: float
) -> None:
    # skew 4 s of 10 s rounds: two rounds are often open at once (the boundary cases)
    h = Harness(
        config(round_policy=policy, release_size=release_size, max_skew=4.0, late_seconds=late)
    )
    now = T0
    serial = 0
    for event in events:
        match event:
            case ("send", device, (kind, number)):
                assert isinstance(device, int)
                assert isinstance(number, int)
                round_ = number if kind == "absolute" else int(now // L) + number
                before = h.core.state_digest()
                serial += 1
                reason = h.send(now, device, round_, serial)
                if reason is not None:
                    assert h.core.state_digest() == before, "a rejection changed the state"
                    lowest, highest = h.core.open_rounds(now)
                    if not lowest <= round_ <= highest:
                        assert reason in {"round_too_old", "round_in_future"}
            case ("burst", devices, offset):
                assert isinstance(devices, list)
                assert isinstance(offset, int)
                for device in devices:
                    serial += 1
                    h.send(now, device, int(now // L) + offset, serial)
            case ("wait", seconds):
                assert isinstance(seconds, float)
                now += seconds
            case ("tick", hold):
                h.tick(now, hold=bool(hold))
            case ("ack",):
                h.ack_oldest()
            case ("restart", compact):
                h.restart(compact=bool(compact))
        h.conserved()
    # in the end every round closes: nothing stays buffered but a carried remnant
    for _ in range(3):
        now += 3 * L
        h.tick(now)
        h.conserved()
    assert sum(h.core.pool_sizes().values()) < h.cfg.min_batch  # superseded ones aside


def test_round_window_and_hostile_rounds_change_nothing() -> None:
    h = Harness(config())
    now = T0 + 5
    current = int(now // L)
    for device, round_ in enumerate(HOSTILE_ROUNDS):
        reason = h.send(now, device, round_, 1)
        assert reason in {"round_too_old", "round_in_future"}
    assert h.core.state_digest() == ShufflerCore(h.cfg).state_digest()
    assert h.send(now, 1, current, 1) is None
    assert h.send(now, 1, current, 2) == "duplicate_in_round"
    # skew: 2 s either way; at T0 + 5 only the current round is open
    assert h.send(now, 2, current - 1, 1) == "round_too_old"
    assert h.send(now, 2, current + 1, 1) == "round_in_future"
    # near the end of the round, the next one opens early (a device clock 2 s ahead)
    assert h.send(T0 + 8.5, 3, current + 1, 1) is None
    # near the start, the previous one is still open (a device clock 2 s behind)
    assert h.send(T0 + L + 1, 4, current, 1) is None


def test_a_released_round_is_closed_and_accepts_nothing_more() -> None:
    """The one closed-round rule: once a round's pool has left, a report of that round is
    ``round_too_old``, however much of ``late_seconds`` is left; so one device cannot
    make an old round accept (and carry) report after report."""
    h = Harness(config(min_batch=3, max_skew=2.0, late_seconds=300.0))
    r = int(T0 // L)
    for device in range(3):
        assert h.send(T0 + 1, device, r, 1) is None
    h.tick(T0 + L + 2)
    assert len(h.batches) == 1  # round r was due and released
    for device in range(3, 6):
        assert h.send(T0 + L + 20, device, r, 1) == "round_too_old"
    # the 100-past-rounds inflation: every round before the current one is closed
    now = T0 + 101 * L + 3
    h.tick(now)
    current = int(now // L)
    for back in range(1, 30):
        assert h.send(now, 7, current - back, back) == "round_too_old"
    assert h.accepted == 3
    h.conserved()


def test_a_held_round_takes_the_queued_backlog_then_leaves_whole() -> None:
    """While the shell holds (not subscribed, or a backlog still arriving), a round that
    ended stays open for reports queued at the broker; released whole once the hold ends,
    and the hold never outlasts ``late_seconds``."""
    h = Harness(config(min_batch=3, max_skew=2.0, late_seconds=30.0))
    r = int(T0 // L)
    for device in range(3):
        assert h.send(T0 + 1, device, r, 1) is None
    h.tick(T0 + L + 2, hold=True)
    assert not h.batches  # held: ended, but the backlog may hold more of it
    for device in range(3, 6):
        assert h.send(T0 + L + 20, device, r, 1) is None
    assert h.send(T0 + L + 20, 0, r, 2) == "duplicate_in_round"  # its tokens are kept
    h.tick(T0 + L + 21)  # the backlog drained: hold over
    (batch,) = h.batches
    assert decode_batch(batch)[1] == r
    assert len(decode_batch(batch)[3]) == 6  # the whole round, in one batch
    assert h.send(T0 + L + 22, 9, r, 1) == "round_too_old"
    # a hold never outlasts late_seconds: a round that ended S + G ago is released anyway
    r2 = r + 10
    for device in range(3):
        assert h.send(r2 * L + 1, device, r2, 5) is None
    h.tick((r2 + 1) * L + 2 + 29, hold=True)
    assert len(h.batches) == 1
    h.tick((r2 + 1) * L + 2 + 30, hold=True)
    assert len(h.batches) == 2
    h.conserved()


def test_reports_of_other_specs_and_out_of_range_z_are_rejected() -> None:
    core = ShufflerCore(config())
    now = T0 + 5
    r = int(now // L)
    assert core.accept(now, token(1), report(r, 1, fp=FP + 1)) == "unknown_fingerprint"
    assert core.accept(now, token(1), report(r, 1, z=TPARAM)) == "z_out_of_range"
    assert isinstance(core.accept(now, token(1), report(r, 1, z=TPARAM - 1)), Admitted)


def test_whole_round_released_as_one_batch_when_it_closes() -> None:
    h = Harness(config(min_batch=3, max_batch=1000))
    now = T0 + 1
    r = int(now // L)
    for device in range(50):
        assert h.send(now, device, r, 1) is None
    h.tick(T0 + L + 1.9)  # still open: skew 2 s
    assert not h.batches
    h.tick(T0 + L + 2.0)
    assert len(h.batches) == 1
    assert len(decode_batch(h.batches[0])[3]) == 50
    assert h.core.closed == (r + 1) * L
    # the closed round never reopens, whatever the clock says afterwards
    assert h.send(T0 + 1, 99, r, 1) == "round_too_old"


def test_a_released_batch_is_the_codec_s_batch_of_its_records() -> None:
    """The core writes records with its own fast encoder: byte for byte edge.codec's."""
    h = Harness(config(min_batch=3, max_batch=1000))
    r = int(T0 // L)
    for device in range(40):
        h.send(T0, device, r, 1)
    h.tick(T0 + L + 2)
    (batch,) = h.batches
    fingerprint, round_, batch_id, seeds, zs = decode_batch(batch)
    assert round_seconds_of(batch) == L  # wire version 2: the round's length at its end
    assert encode_batch(fingerprint, round_, batch_id, seeds, zs, round_seconds=L) == batch


def test_split_above_max_batch_into_near_equal_slices() -> None:
    h = Harness(config(min_batch=3, max_batch=7))
    r = int(T0 // L)
    for device in range(15):
        h.send(T0, device, r, 1)
    h.tick(T0 + L + 2)
    sizes = sorted(len(decode_batch(b)[3]) for b in h.batches)
    assert sizes == [5, 5, 5]


@pytest.mark.parametrize("policy", ["carry", "drop"])
def test_small_round_is_carried_or_dropped(policy: str) -> None:
    h = Harness(config(min_batch=3, round_policy=policy))
    r = int(T0 // L)
    h.send(T0, 1, r, 1)
    h.send(T0, 2, r, 1)
    h.tick(T0 + L + 2)
    assert not h.batches
    if policy == "drop":
        assert h.dropped == 2
        assert h.core.buffered == 0
        return
    assert h.core.pool_sizes() == {r + 1: 2}
    # device 1 reports again in the next round: its carried report is superseded
    h.send(T0 + L + 3, 1, r + 1, 2)
    h.send(T0 + L + 3, 3, r + 1, 1)
    h.tick(T0 + 2 * L + 2)
    (batch,) = h.batches
    seeds = sorted(decode_batch(batch)[3])
    assert seeds == [1002, 2001, 3001]  # the newer report of device 1, not both
    assert h.dropped == 1  # carry_superseded
    h.conserved()


def test_full_outbox_keeps_pools_until_there_is_room() -> None:
    h = Harness(config(min_batch=3, max_batch=6, max_outbox_batches=1))
    r = int(T0 // L)
    for device in range(3):
        h.send(T0, device, r, 1)
        h.send(T0 + L, device, r + 1, 2)
    h.tick(T0 + 2 * L + 2)
    assert len(batches_in(h.core.outbox())) == 1
    assert h.core.buffered == 3
    h.ack_oldest()
    h.tick(T0 + 2 * L + 3)
    assert len(batches_in(h.core.outbox())) == 1
    assert h.core.buffered == 0
    h.conserved()


def test_round_full_caps_the_duplicate_state() -> None:
    h = Harness(config(min_batch=3, max_reports_per_round=3))
    r = int(T0 // L)
    for device in range(3):
        assert h.send(T0, device, r, 1) is None
    assert h.send(T0, 9, r, 1) == "round_full"


def test_config_refuses_unsafe_sizes() -> None:
    with pytest.raises(ValueError, match="max_batch"):
        config(min_batch=5, max_batch=9)
    with pytest.raises(ValueError, match="min_batch"):
        config(min_batch=1)
    with pytest.raises(ValueError, match="release_size"):
        config(min_batch=5, max_batch=10, release_size=4)
    with pytest.raises(ValueError, match="round_seconds"):
        config(round_seconds=0)
    with pytest.raises(ValueError, match="max_skew"):
        config(max_skew=float("nan"))
    with pytest.raises(ValueError, match="late_seconds"):
        config(late_seconds=-1.0)


def restarted(h: Harness, **overrides: object) -> Harness:
    """The harness's log replayed by a core of another configuration, reconfigured."""
    data = b"".join(h.log)
    again = Harness(config(**{**_settings(h.cfg), **overrides}))
    again.log = list(h.log)
    again.core = ShufflerCore(again.cfg)
    for effect in scan(data, FILE_HEADER_SIZE, SALT).effects:
        again.core.apply(effect)
    again.accepted, again.released, again.dropped = h.accepted, h.released, h.dropped
    again.commit(again.core.reconfigure(maker(99)))
    return again


def _settings(cfg: CoreConfig) -> dict[str, object]:
    return {name: getattr(cfg, name) for name in ("min_batch", "max_batch", "max_skew")}


def test_a_new_round_seconds_keeps_closed_rounds_closed_and_open_ones_open() -> None:
    """round_seconds 10 -> 20 between runs: what is closed is a time, so it stays closed
    (and not 'every round too old for decades'); the open round's pool and tokens move
    to the new round that holds its start."""
    h = Harness(config(min_batch=3))
    r = int(T0 // L)
    for device in range(3):
        h.send(T0 + 1, device, r, 1)
    h.tick(T0 + L + 2)  # round r released and closed
    h.send(T0 + L + 3, 1, r + 1, 2)
    h.send(T0 + L + 3, 2, r + 1, 2)
    again = restarted(h, round_seconds=20)
    now = T0 + L + 4
    new_round = int(now // 20)
    assert again.core.pool_sizes() == {(r + 1) * L // 20: 2}
    assert again.send(now, 1, new_round, 3) == "duplicate_in_round"  # its token moved
    assert again.send(now, 5, new_round, 3) is None
    assert again.send(now, 6, int((T0 - 30) // 20), 3) == "round_too_old"
    again.tick((new_round + 1) * 20 + 2)
    assert len(again.batches) == 1
    assert len(decode_batch(again.batches[0])[3]) == 3
    again.conserved()


def test_a_higher_min_batch_after_a_restart_holds_the_pool_back() -> None:
    h = Harness(config(min_batch=3, max_batch=20))
    r = int(T0 // L)
    for device in range(4):
        h.send(T0 + 1, device, r, 1)
    again = restarted(h, min_batch=5, max_batch=20)
    assert again.core.reconfigure(maker()) == []  # nothing recorded depends on min_batch
    again.tick(T0 + L + 2)
    assert not again.batches  # 4 < 5: carried, never released small
    assert again.core.pool_sizes() == {r + 1: 4}


def test_a_new_spec_releases_or_drops_the_old_spec_s_pools() -> None:
    """Reports of the old spec never share a batch with the new one: a full pool leaves
    at once under the old fingerprint, a small one is dropped (spec_changed)."""
    h = Harness(config(min_batch=3))
    r = int(T0 // L)
    for device in range(4):
        h.send(T0 + 1, device, r, 1)
    assert h.send(T0 + 9, 9, r + 1, 1) is None
    again = restarted(h, fingerprint=FP + 1)
    (batch,) = again.batches
    assert decode_batch(batch)[0] == FP  # the old spec's batch
    assert again.dropped == 1
    assert again.core.pool_sizes() == {}
    new = FP + 1
    assert again.core.accept(T0 + 9, token(9), report(r + 1, 9, fp=new)) == "duplicate_in_round"
    assert isinstance(again.core.accept(T0 + 9, token(11), report(r + 1, 1, fp=new)), Admitted)


def test_each_release_has_one_manifest_after_its_batches() -> None:
    from edge.codec import decode_manifest  # noqa: PLC0415

    h = Harness(config(min_batch=3, max_batch=7))
    r = int(T0 // L)
    for device in range(15):
        h.send(T0, device, r, 1)
    manifests = maker(5)
    with_manifest = BatchMaker(
        shuffle=manifests.shuffle,
        new_batch_id=manifests.new_batch_id,
        seal=manifests.seal,
        seal_manifest=lambda manifest: manifest + b"S" * 64,
    )
    h.commit(h.core.tick(T0 + L + 2, with_manifest))
    outbox = h.core.outbox()
    assert len(outbox) == 4  # three slices, then the manifest
    fingerprint, round_, release_id, entries, sources = decode_manifest(outbox[-1][:-64])
    assert (fingerprint, round_) == (FP, r)
    assert sources == [(r, L, 15)]  # every report was sent in the release's round
    assert entries == [(batch_id_of(m), len(decode_batch(m)[3])) for m in outbox[:3]]
    assert release_id not in {batch_id_of(m) for m in outbox[:3]}
    assert h.core.outbox_reports == 15  # the manifest holds no report
    for message in outbox:
        h.commit([Acked(batch_id_of(message))])
    assert h.core.outbox_reports == 0
    assert h.core.outbox() == []


def test_a_device_s_token_survives_round_seconds_10_20_10() -> None:
    """round_seconds 10 -> 20 -> 10 between runs: a device that reported in the second
    10-second round of a 20-second one (an odd round) is still refused in that round once
    the length is back to 10. The 20-second round unites both halves' tokens; going back,
    they must reach every 10-second round the 20-second one covers, not only the one that
    holds its start (which gave the device a second report in the round)."""
    h = Harness(config(min_batch=3))
    r = int(T0 // L)  # T0 is a multiple of 20: round r + 1 is the second half of T0 // 20
    now = T0 + L + 1
    for device in range(2):
        assert h.send(now, device, r + 1, 1) is None
    longer = restarted(h, round_seconds=20)
    longer.reported = set(h.reported)
    assert longer.send(now, 0, int(now // 20), 2) == "duplicate_in_round"
    back = restarted(longer, round_seconds=L)
    back.reported = set(h.reported)
    for device in range(2):
        assert back.send(now, device, r + 1, 3) == "duplicate_in_round"
    assert back.send(now, 7, r + 1, 3) is None  # another device is welcome
    back.restart(compact=True)  # the tokens survive a replay and a compaction
    assert back.send(now, 1, r + 1, 4) == "duplicate_in_round"
    back.tick(T0 + 2 * L + 3)
    back.conserved()


@pytest.mark.parametrize(
    "lengths", [(10, 20, 10), (10, 30, 10), (10, 15, 10), (10, 4, 10), (10, 20, 5, 10)]
)
def test_one_report_per_device_and_round_across_round_seconds_changes(
    lengths: tuple[int, ...],
) -> None:
    """Every device reports once in every round a length allows at one instant, before
    and after each change of round_seconds; whatever the sequence, a device is never
    admitted twice for an interval of time it already reported in: after each restart,
    each device is refused in every current round that overlaps a round it reported in."""
    h = Harness(config(round_seconds=lengths[0], min_batch=3, max_skew=2.0))
    now = T0 + 51.0  # in an odd 10-second round, the second half of a 20-second one
    spans: dict[int, list[tuple[float, float]]] = {}  # device -> intervals reported in
    for step, length in enumerate(lengths):
        if step:
            again = restarted(h, round_seconds=length)
            again.reported = set()  # (rounds are numbered anew: checked by intervals)
            h = again
        for device in range(6):
            round_ = int(now // length)
            start, end = round_ * length, (round_ + 1) * length
            outcome = h.send(now + 0.5 * step, device, round_, step)
            if any(a < end and start < b for a, b in spans.get(device, [])):
                assert outcome == "duplicate_in_round", (lengths, step, device)
            elif outcome is None:
                spans.setdefault(device, []).append((start, end))
        now += 0.5
    h.conserved()


@settings(max_examples=150, deadline=None)
@given(
    steps=st.lists(
        st.tuples(
            st.sampled_from([4, 5, 10, 15, 20, 30]),  # round_seconds of this run
            st.lists(  # (device, seconds after the previous report, round offset)
                st.tuples(st.integers(0, 5), st.floats(0.0, 6.0), st.integers(-1, 1)),
                max_size=8,
            ),
            st.booleans(),  # compact the log before the next run
        ),
        min_size=2,
        max_size=5,
    )
)
def test_no_device_reports_twice_in_a_round_whatever_the_lengths(
    steps: list[tuple[int, list[tuple[int, float, int]], bool]],
) -> None:
    """Random runs of random round lengths, restarts (with or without compaction) between
    them, reports of random devices at increasing times: a device is never admitted twice
    for one round of one length ``(round, round_seconds)``, whatever lengths came in
    between (10 -> 20 -> 10 readmitted it), never twice in a batch (the harness checks
    every batch), and every admitted report is released once or counted as dropped."""
    h = Harness(config(round_seconds=steps[0][0], min_batch=2, max_batch=20, max_skew=2.0))
    now = T0 + 1.0
    admitted: set[tuple[int, int, int]] = set()  # (device, round, round_seconds)
    serial = itertools.count()
    for index, (length, sends, compact) in enumerate(steps):
        if index:
            h = restarted(h, round_seconds=length)
        h.reported = set()  # (the harness's check is per round number: this one is keyed)
        for device, wait, offset in sends:
            now += wait
            round_ = int(now // length) + offset
            if h.send(now, device, round_, next(serial)) is None:
                key = (device, round_, length)
                assert key not in admitted, "a second report of a device in a round"
                admitted.add(key)
            h.tick(now)
        if compact:
            h.restart(compact=True, bounded=False)
    h.conserved()
