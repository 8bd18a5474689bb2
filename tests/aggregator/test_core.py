"""The aggregator's core, property-tested (seeded hypothesis, no broker, real files).

A model broker holds the session's messages until they are acknowledged and redelivers
every unacknowledged one after a crash; the service is the core, its acknowledgement
generations and the real checkpoint files (:func:`write_checkpoint`,
:func:`recover_checkpoint`) in a temporary directory. Any interleaving of deliveries,
re-sent and replayed batches, forged and altered ones, checkpoints, crashes (with the
newest checkpoint file damaged or not) and restarts ends with every genuine batch applied
exactly once and nothing else. And hundreds of bit flips and truncations of a checkpoint
file are each refused, or read back as exactly the same content: never a wrong sum.
"""

from __future__ import annotations

import random
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from aggregator.estimation.estimators import AggregateState
from aggregator.service.checkpoint_files import previous_path, recover_checkpoint, write_checkpoint
from aggregator.service.core.acks import AckGenerations
from aggregator.service.core.batch_codec import encode_batch_arrays
from aggregator.service.core.checkpoint import CheckpointError
from aggregator.service.core.checkpoint_codec import decode_checkpoint, encode_checkpoint
from aggregator.service.core.machine import AggregatorCore
from aggregator.service.core.rules import CoreRules
from edge import MechanismSpec
from edge.batch_auth import BatchSigner

SPEC = MechanismSpec(mechanism="coco", d=6, s=2, epsilon=1.0)
DEPLOYMENT = "core"
SIGNER = BatchSigner.generate(DEPLOYMENT)
FORGER = BatchSigner.generate(DEPLOYMENT)
MIN_BATCH = 3
MAX_UNACKED = 3
NOW = 1_800_000_000.0


def rules() -> CoreRules:
    return CoreRules(
        spec=SPEC,
        deployment=DEPLOYMENT,
        trusted=SIGNER.public_key_hex,
        min_batch=MIN_BATCH,
        retention_rounds=50,
        round_seconds=60,
    )


def genuine_batches(count: int, seed: int) -> list[tuple[bytes, np.ndarray, np.ndarray]]:
    """``(sealed payload, seeds, z)`` of ``count`` distinct batches of recent rounds."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(count):
        size = int(rng.integers(MIN_BATCH, MIN_BATCH + 4))
        seeds = rng.integers(0, 2**32, size, dtype=np.uint32)
        z = rng.integers(0, SPEC.t, size).astype(np.uint16)
        round_ = int(NOW // 60) - int(rng.integers(0, 5))
        raw = encode_batch_arrays(SPEC.fingerprint_int, round_, i.to_bytes(16, "big"), seeds, z)
        out.append((SIGNER.seal(raw), seeds, z))
    return out


def hostile(genuine: list[tuple[bytes, np.ndarray, np.ndarray]], kind: int) -> bytes:
    """A batch nobody trusted sealed: forged under another key, altered after sealing, or
    sealed for another deployment; each a copy of a genuine batch's content."""
    payload = genuine[kind % len(genuine)][0]
    raw = payload[:-64]
    if kind % 3 == 0:
        return FORGER.seal(raw)
    if kind % 3 == 1:
        altered = bytearray(payload)
        altered[-70] ^= 1  # a record byte
        return bytes(altered)
    return BatchSigner.generate("other").seal(raw)


@dataclass
class Broker:
    """One persistent session: messages in order, each with an id; delivered ones wait for
    their PUBACK; a crash of the client makes every unacknowledged one deliverable again."""

    messages: dict[int, bytes] = field(default_factory=dict)
    undelivered: list[int] = field(default_factory=list)
    acked: set[int] = field(default_factory=set)
    next_id: int = 0

    def publish(self, payload: bytes) -> None:
        self.messages[self.next_id] = payload
        self.undelivered.append(self.next_id)
        self.next_id += 1

    def deliver(self) -> tuple[int, bytes] | None:
        if not self.undelivered:
            return None
        mid = self.undelivered.pop(0)
        return mid, self.messages[mid]

    def ack(self, mids: list[int]) -> None:
        for mid in mids:
            self.acked.add(mid)
            self.messages.pop(mid, None)

    def client_lost(self) -> None:
        self.undelivered = sorted(self.messages)


class Service:
    """The service's rules around the core, synchronous: acknowledgements wait for two
    durable generations; a checkpoint every ``MAX_UNACKED`` deliveries or on request."""

    def __init__(self, path: Path, broker: Broker) -> None:
        self.path = path
        self.broker = broker
        self.core = AggregatorCore(rules(), delta=1e-6)
        self.acks: AckGenerations[int] = AckGenerations()
        self.generation = 0
        recovery = recover_checkpoint(path)
        if recovery.checkpoint is not None:
            self.core.restore(recovery.checkpoint)
            self.generation = recovery.checkpoint.generation

    def deliver(self) -> bool:
        delivered = self.broker.deliver()
        if delivered is None:
            return False
        mid, payload = delivered
        self.core.handle(payload, now=NOW)
        self.acks.delivered(mid)
        if len(self.acks.open) >= MAX_UNACKED:
            self.checkpoint()
        return True

    def checkpoint(self) -> None:
        if not self.core.dirty and not self.acks.waiting():
            return
        content = self.core.content(generation=self.generation + 1, written_at=NOW)
        self.acks.snapshot()
        write_checkpoint(self.path, content)
        self.generation += 1
        self.broker.ack(self.acks.written())


def damage(path: Path, rng: random.Random) -> None:
    data = bytearray(path.read_bytes())
    if rng.random() < 0.2:
        path.write_bytes(bytes(data[: rng.randrange(len(data))]))
        return
    position = rng.randrange(len(data))
    data[position] ^= 1 << rng.randrange(8)
    path.write_bytes(bytes(data))


Step = tuple[str, int]
KINDS = ["publish"] * 3 + ["hostile", "crash"] + ["deliver"] * 3 + ["checkpoint"] * 2
KINDS += ["crash-damaged"] * 2
STEPS = st.lists(st.tuples(st.sampled_from(KINDS), st.integers(0, 2**31)), min_size=10, max_size=60)


@settings(max_examples=200, deadline=None, derandomize=True)
@given(steps=STEPS, seed=st.integers(0, 2**16))
def test_any_interleaving_applies_each_genuine_batch_once_and_nothing_forged(
    steps: list[Step], seed: int
) -> None:
    genuine = genuine_batches(12, seed)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "ckpt.json"
        broker = Broker()
        service = Service(path, broker)
        published: set[int] = set()
        for kind, value in steps:
            if kind == "publish":  # a release, or the same batch re-sent after a restart
                broker.publish(genuine[value % len(genuine)][0])
                published.add(value % len(genuine))
            elif kind == "hostile":
                broker.publish(hostile(genuine, value))
            elif kind == "deliver":
                for _ in range(1 + value % 4):
                    service.deliver()
            elif kind == "checkpoint":
                service.checkpoint()
            else:
                broker.client_lost()  # the process dies: no PUBACK of what it held
                if kind == "crash-damaged" and path.exists():
                    damage(path, random.Random(value))
                try:
                    service = Service(path, broker)
                except CheckpointError:
                    # refused: only a first generation existed, so nothing was
                    # acknowledged yet and starting from zero (the operator moving the
                    # file away) loses nothing
                    assert not previous_path(path).exists()
                    assert not broker.acked
                    path.unlink()
                    service = Service(path, broker)
        while service.deliver():  # drain what the broker holds
            pass
        service.checkpoint()
        expected = AggregateState(SPEC)
        for i in sorted(published):
            expected.add(genuine[i][1], genuine[i][2])
        state = service.core.state
        assert state.n == expected.n
        assert np.array_equal(state.sum_u, expected.sum_u)
        assert np.array_equal(state.sum_v, expected.sum_v)
        assert service.core.counters.batches == len(published)
        assert sum(service.core.counters.rejected_reports.values()) == 0  # none verified


def _a_checkpoint(tmp: Path) -> tuple[Path, AggregatorCore]:
    core = AggregatorCore(rules(), delta=1e-6)
    for payload, _, _ in genuine_batches(6, 1):
        assert core.handle(payload, now=NOW) == "applied"
    core.handle(b"junk", now=NOW)
    path = tmp / "ckpt.json"
    write_checkpoint(path, core.content(generation=1, written_at=NOW))
    return path, core


@settings(max_examples=400, deadline=None, derandomize=True)
@given(position=st.floats(0, 1, exclude_max=True), bit=st.integers(0, 7), cut=st.booleans())
def test_a_damaged_checkpoint_is_refused_or_reads_the_same(
    position: float, bit: int, cut: bool
) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path, core = _a_checkpoint(Path(tmp))
        text = path.read_bytes()
        offset = int(position * len(text))
        if cut:
            damaged = text[:offset]
        else:
            flipped = bytearray(text)
            flipped[offset] ^= 1 << bit
            damaged = bytes(flipped)
        try:
            back = decode_checkpoint(damaged.decode("utf-8", errors="strict"), path)
        except (CheckpointError, UnicodeDecodeError):
            return  # refused: recover_checkpoint falls back to the previous generation
        want = core.content(generation=1, written_at=NOW)
        assert back.state.n == want.state.n
        assert np.array_equal(back.state.sum_u, want.state.sum_u)
        assert np.array_equal(back.state.sum_v, want.state.sum_v)
        assert back.batch_rounds == want.batch_rounds
        assert back.counters == want.counters
        assert back.batch_sizes == want.batch_sizes
        assert back.trusted == want.trusted


def test_a_damaged_newest_generation_falls_back_to_the_previous_one(tmp_path: Path) -> None:
    path, core = _a_checkpoint(tmp_path)
    first = core.content(generation=1, written_at=NOW)
    extra = genuine_batches(7, 2)[6][0]
    assert core.handle(extra, now=NOW) == "applied"
    write_checkpoint(path, core.content(generation=2, written_at=NOW))
    text = path.read_text()
    path.write_text(text.replace('"n":', '"n":1', 1))  # a digit more in the sums' count
    recovery = recover_checkpoint(path)
    assert recovery.checkpoint is not None
    assert recovery.checkpoint.generation == 1
    assert recovery.checkpoint.state.n == first.state.n
    assert recovery.fallback is not None
    assert "field 'state'" in recovery.fallback
    assert not path.exists()  # moved aside, so the next write keeps the good generation
    assert (tmp_path / "ckpt.json.damaged").exists()
    # both damaged: one line naming both
    previous_path(path).write_text("{")
    path.write_text(text[:50])
    try:
        recover_checkpoint(path)
    except CheckpointError as exc:
        message = str(exc)
    else:
        raise AssertionError("two damaged generations must be refused")
    assert str(path) in message
    assert str(previous_path(path)) in message
    assert "\n" not in message


def test_encoding_is_stable() -> None:
    """The same content gives the same text (the checksums are of the content)."""
    core = AggregatorCore(rules(), delta=1e-6)
    a = encode_checkpoint(core.content(generation=3, written_at=1.0))
    b = encode_checkpoint(core.content(generation=3, written_at=1.0))
    assert a == b
