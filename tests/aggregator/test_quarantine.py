"""The quarantine: verified messages refused for a reason an operator can fix are kept, bounded
and checksummed, and applied exactly once after the fix; forgeries are never kept.

The core and its files, no broker: the model broker and service of tests/aggregator/test_core.py,
with the quarantine file written before each checkpoint (as
:class:`~aggregator.service.generations.Generations` does), crashes between the two files, and a
key rotation (the shuffler's new key announced, then trusted) at any point of the interleaving.
"""

from __future__ import annotations

import random
import tempfile
from pathlib import Path

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from aggregator.service.checkpoint_files import recover_checkpoint, write_checkpoint
from aggregator.service.core.acks import AckGenerations
from aggregator.service.core.batch_codec import encode_batch_arrays
from aggregator.service.core.machine import AggregatorCore
from aggregator.service.core.quarantine import Entry, Quarantine
from aggregator.service.core.replay import replay
from aggregator.service.core.rules import CoreRules
from aggregator.service.quarantine_file import (
    QuarantineFileError,
    encode_quarantine,
    quarantine_path,
    read_quarantine,
    write_quarantine,
)
from edge import MechanismSpec
from edge.batch_auth import BatchSigner
from edge.codec import encode_manifest
from tests.aggregator.test_core import Broker

SPEC = MechanismSpec(mechanism="coco", d=6, s=2, epsilon=1.0)
DEPLOYMENT = "core"
OLD = BatchSigner.generate(DEPLOYMENT)
NEW = BatchSigner.generate(DEPLOYMENT)
FORGER = BatchSigner.generate(DEPLOYMENT)
MIN_BATCH = 3
NOW = 1_800_000_000.0
ROUND = int(NOW // 60)


def rules(trusted: str, retention_rounds: int = 50) -> CoreRules:
    return CoreRules(
        spec=SPEC,
        deployment=DEPLOYMENT,
        trusted=trusted,
        min_batch=MIN_BATCH,
        retention_rounds=retention_rounds,
        round_seconds=60,
    )


def raw_batch(i: int, rng: np.random.Generator, round_: int = ROUND) -> tuple[bytes, int]:
    size = int(rng.integers(MIN_BATCH, MIN_BATCH + 4))
    seeds = rng.integers(0, 2**32, size, dtype=np.uint32)
    z = rng.integers(0, SPEC.t, size).astype(np.uint16)
    return encode_batch_arrays(SPEC.fingerprint_int, round_, i.to_bytes(16, "big"), seeds, z), size


def hostile(payload: bytes, kind: int) -> bytes:
    """Not signed by any announced key: forged, altered after sealing, another deployment's."""
    raw = payload[:-64]
    if kind % 3 == 0:
        return FORGER.seal(raw)
    if kind % 3 == 1:
        altered = bytearray(payload)
        altered[-70] ^= 1
        return bytes(altered)
    return BatchSigner.generate("other").seal(raw)


# -- the pure core -------------------------------------------------------------------------


def entry(i: int, size: int) -> Entry:
    payload = i.to_bytes(4, "big") * (size // 4 + 1)
    return Entry(kind="batch", shard=None, reason="untrusted_key", at=float(i), payload=payload)


@settings(max_examples=200, deadline=None, derandomize=True)
@given(
    sizes=st.lists(st.integers(1, 400), min_size=1, max_size=80),
    max_entries=st.integers(1, 30),
    max_bytes=st.integers(1, 4000),
)
def test_the_quarantine_keeps_its_bounds_and_drops_the_oldest_counted(
    sizes: list[int], max_entries: int, max_bytes: int
) -> None:
    quarantine = Quarantine(max_entries=max_entries, max_bytes=max_bytes)
    added = [entry(i, size) for i, size in enumerate(sizes)]
    for e in added:
        quarantine.add(e)
        assert not quarantine.add(e)  # a redelivery is kept once
        assert len(quarantine) <= max_entries
        assert quarantine.bytes <= max_bytes
        assert quarantine.bytes == sum(len(k.payload) for k in quarantine)
    kept = list(quarantine)
    # what is kept is the newest entries, in order; everything else was dropped and counted
    # (one larger than the byte bound by itself at each attempt: it is never kept)
    fits = [e for e in added if len(e.payload) <= max_bytes]
    assert kept == fits[len(fits) - len(kept) :]
    assert quarantine.dropped == len(fits) - len(kept) + 2 * (len(added) - len(fits))


def test_retired_entries_stay_in_the_file_until_two_generations_hold_them() -> None:
    quarantine = Quarantine()
    e = entry(1, 10)
    quarantine.add(e)
    quarantine.retire(e.key)
    assert len(quarantine) == 0
    assert quarantine.persisted() == [(e, True)]
    quarantine.assign(5)  # snapshotted with generation 5
    quarantine.durable(5)
    assert quarantine.persisted() == [(e, True)]  # one generation holds it
    quarantine.durable(6)
    assert quarantine.persisted() == []
    assert not quarantine.add(e) or len(quarantine) == 1  # a later redelivery may be kept


# -- a key rotation in the core ------------------------------------------------------------


def test_a_rotation_keeps_what_the_announced_key_signed_and_applies_it_once_trusted() -> None:
    rng = np.random.default_rng(3)
    core = AggregatorCore(rules(OLD.public_key_hex), delta=1e-6)
    core.announce(NEW.public_key_hex)
    batches = [raw_batch(i, rng) for i in range(6)]
    sealed = [NEW.seal(raw) for raw, _ in batches]
    for payload in sealed:
        assert core.handle(payload, now=NOW) == "untrusted_key"
    assert core.handle(sealed[0], now=NOW) == "untrusted_key"  # redelivered: kept once
    for kind in range(6):
        assert core.handle(hostile(sealed[kind], kind), now=NOW) == "bad_signature"
    assert len(core.quarantine) == len(sealed)
    assert {e.payload for e in core.quarantine} == set(sealed)  # no forgery kept
    assert core.state.n == 0

    assert replay(core, now=NOW) == {"kept": len(sealed)}  # not trusted yet: nothing applied
    core.trust(NEW.public_key_hex)
    assert replay(core, now=NOW) == {"applied": len(sealed)}
    assert core.state.n == sum(size for _, size in batches)
    assert len(core.quarantine) == 0
    assert replay(core, now=NOW) == {}
    assert core.handle(sealed[1], now=NOW) == "duplicate"
    assert core.handle(OLD.seal(batches[0][0]), now=NOW) == "bad_signature"


def test_a_manifest_of_the_announced_key_is_kept_and_reconciled_once_trusted() -> None:
    rng = np.random.default_rng(6)
    core = AggregatorCore(rules(OLD.public_key_hex), delta=1e-6)
    core.announce(NEW.public_key_hex)
    batches = [raw_batch(i, rng) for i in range(2)]
    entries = [(i.to_bytes(16, "big"), size) for i, (_, size) in enumerate(batches)]
    total = sum(size for _, size in batches)
    body = encode_manifest(SPEC.fingerprint_int, ROUND, b"r" * 16, entries, [(ROUND, 60, total)])
    sealed = NEW.seal_manifest(body)
    assert core.manifest(sealed, now=NOW) == "untrusted_key"
    assert core.manifest(FORGER.seal_manifest(body), now=NOW) == "bad_signature"
    assert [(e.kind, e.reason) for e in core.quarantine] == [("manifest", "untrusted_key")]
    for raw, _ in batches:
        assert core.handle(NEW.seal(raw), now=NOW) == "untrusted_key"
    core.trust(NEW.public_key_hex)
    assert replay(core, now=NOW) == {"accepted": 1, "applied": 2}
    assert core.reconciler.counts.manifests == 1
    assert core.reconcile(NOW + 1_000) == []  # every batch it lists came: nothing missing
    assert core.manifest(sealed, now=NOW) == "duplicate"


def test_a_stale_round_is_kept_and_applied_after_a_restart_with_a_longer_retention() -> None:
    rng = np.random.default_rng(4)
    core = AggregatorCore(rules(OLD.public_key_hex, retention_rounds=5), delta=1e-6)
    recent, _ = raw_batch(0, rng, ROUND)
    old, size = raw_batch(1, rng, ROUND - 20)
    assert core.handle(OLD.seal(recent), now=NOW) == "applied"
    assert core.handle(OLD.seal(old), now=NOW) == "stale_round"
    assert [e.reason for e in core.quarantine] == ["stale_round"]
    text = encode_quarantine(core.quarantine, DEPLOYMENT)
    content = core.content(generation=1, written_at=NOW)

    longer = AggregatorCore(rules(OLD.public_key_hex, retention_rounds=30), delta=1e-6)
    longer.restore(content)
    with tempfile.TemporaryDirectory() as tmp:
        checkpoint = Path(tmp) / "c.json"
        write_quarantine(checkpoint, text)
        loaded = read_quarantine(checkpoint, DEPLOYMENT)
    assert loaded is not None
    longer.quarantine.restore(loaded.entries)
    n = longer.state.n
    assert replay(longer, now=NOW) == {"applied": 1}
    assert longer.state.n == n + size


# -- the file -----------------------------------------------------------------------------


def kept_file(tmp: Path, count: int) -> tuple[Path, list[bytes]]:
    rng = np.random.default_rng(5)
    core = AggregatorCore(rules(OLD.public_key_hex), delta=1e-6)
    core.announce(NEW.public_key_hex)
    sealed = [NEW.seal(raw_batch(i, rng)[0]) for i in range(count)]
    for payload in sealed:
        core.handle(payload, now=NOW)
    checkpoint = tmp / "c.json"
    write_quarantine(checkpoint, encode_quarantine(core.quarantine, DEPLOYMENT))
    return checkpoint, sealed


@pytest.mark.parametrize("seed", range(60))
def test_a_damaged_quarantine_file_is_refused_or_its_damaged_entries_dropped(
    tmp_path: Path, seed: int
) -> None:
    checkpoint, sealed = kept_file(tmp_path, 5)
    path = quarantine_path(checkpoint)
    data = bytearray(path.read_bytes())
    rng = random.Random(seed)
    if seed % 4 == 0:
        data = data[: rng.randrange(len(data))]
    else:
        data[rng.randrange(len(data))] ^= 1 << rng.randrange(8)
    path.write_bytes(bytes(data))
    try:
        loaded = read_quarantine(checkpoint, DEPLOYMENT)
    except QuarantineFileError as exc:
        message = str(exc)
        assert str(path) in message
        return
    assert loaded is not None
    # every entry read back is one that was kept, byte for byte; the others are counted
    assert {e.payload for e in loaded.entries} <= set(sealed)
    assert len(loaded.entries) + loaded.damaged == len(sealed)


def test_another_deployments_quarantine_file_is_refused(tmp_path: Path) -> None:
    checkpoint, _ = kept_file(tmp_path, 1)
    with pytest.raises(QuarantineFileError, match="deployment"):
        read_quarantine(checkpoint, "elsewhere")


# -- any interleaving, crashes between the two files ---------------------------------------


class Service:
    """The core with its two files, as the service writes them: the quarantine first, then
    the checkpoint; acknowledgements after two durable generations. ``trusted`` is the trust
    file (it survives crashes)."""

    def __init__(self, path: Path, broker: Broker, trusted: list[bool]) -> None:
        self.path = path
        self.broker = broker
        self.trusted = trusted
        self.core = AggregatorCore(rules(OLD.public_key_hex), delta=1e-6)
        self.acks: AckGenerations[int] = AckGenerations()
        self.generation = 0
        self.written = 0
        recovery = recover_checkpoint(path)
        if recovery.checkpoint is not None:
            self.core.restore(recovery.checkpoint)
            self.generation = recovery.checkpoint.generation
        if trusted[0]:
            self.core.trust(NEW.public_key_hex)
        else:
            self.core.announce(NEW.public_key_hex)
        loaded = read_quarantine(path, DEPLOYMENT)
        if loaded is not None:
            assert loaded.damaged == 0
            self.core.quarantine.restore(loaded.every)
        self.written = self.core.quarantine.version
        replay(self.core, now=NOW)

    def deliver(self) -> bool:
        delivered = self.broker.deliver()
        if delivered is None:
            return False
        mid, payload = delivered
        self.core.handle(payload, now=NOW)
        self.acks.delivered(mid)
        if len(self.acks.open) >= 3:
            self.checkpoint()
        return True

    def trust(self) -> None:
        self.trusted[0] = True
        self.core.trust(NEW.public_key_hex)
        replay(self.core, now=NOW)

    def checkpoint(self, *, crash: bool = False) -> None:
        """One generation; ``crash``: the process dies after the quarantine file."""
        if not self.core.dirty and not self.acks.waiting():
            return
        generation = self.generation + 1
        content = self.core.content(generation=generation, written_at=NOW)
        quarantine = self.core.quarantine
        quarantine.assign(generation)
        version = quarantine.version
        if version != self.written:
            write_quarantine(self.path, encode_quarantine(quarantine, DEPLOYMENT))
        if crash:
            return
        self.acks.snapshot()
        write_checkpoint(self.path, content)
        self.generation = generation
        self.written = version
        quarantine.durable(generation)
        self.broker.ack(self.acks.written())


KINDS = ["publish"] * 4 + ["hostile", "crash", "crash-mid", "trust"]
KINDS += ["deliver"] * 4 + ["checkpoint"] * 2
STEPS = st.lists(st.tuples(st.sampled_from(KINDS), st.integers(0, 2**31)), min_size=10, max_size=60)


ACKED_THEN_TRUSTED_THEN_CRASH = [
    *[("publish", i) for i in range(3)],
    ("deliver", 3),  # three deliveries: kept, and a checkpoint
    ("checkpoint", 0),  # a second generation: the three are acknowledged
    ("trust", 0),  # replayed: applied, not yet in a checkpoint
    ("crash-mid", 0),  # the quarantine file written, the checkpoint not
]


@settings(max_examples=150, deadline=None, derandomize=True)
@given(steps=STEPS, seed=st.integers(0, 2**16))
@example(steps=ACKED_THEN_TRUSTED_THEN_CRASH, seed=1)
def test_a_rotation_at_any_point_applies_each_batch_of_the_new_key_once_and_no_forgery(
    steps: list[tuple[str, int]], seed: int
) -> None:
    rng = np.random.default_rng(seed)
    batches = [raw_batch(i, rng) for i in range(10)]
    sealed = [NEW.seal(raw) for raw, _ in batches]
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "ckpt.json"
        broker, trusted = Broker(), [False]
        service = Service(path, broker, trusted)
        published: set[int] = set()
        for kind, value in steps:
            i = value % len(sealed)
            if kind == "publish":
                broker.publish(sealed[i])
                published.add(i)
            elif kind == "hostile":
                broker.publish(hostile(sealed[i], value))
            elif kind == "deliver":
                for _ in range(1 + value % 4):
                    service.deliver()
            elif kind == "checkpoint":
                service.checkpoint()
            elif kind == "trust":
                service.trust()
            else:
                if kind == "crash-mid":
                    service.checkpoint(crash=True)
                broker.client_lost()
                service = Service(path, broker, trusted)
            assert {e.payload for e in service.core.quarantine} <= set(sealed)  # no forgery
        while service.deliver():
            pass
        if not trusted[0]:
            service.trust()
        core = service.core
        assert len(core.quarantine) == 0
        assert core.counters.batches == len(published)
        assert core.state.n == sum(batches[i][1] for i in published)
        assert set(core.memory.by_round().get(ROUND * core.rules.unit, [])) == {
            i.to_bytes(16, "big") for i in published
        }
