"""A restart through the real log gives the live core's very state.

A seeded workload drives a core as the service does (socket reads of reports offered and
settled in one group commit, ticks that release, carry and drop, acknowledgements, the
log compacted as it grows), writing every effect through :class:`EffectLog` before
applying it. At each restart a fresh core replays the log file with
:meth:`EffectLog.recover` (one record decoded at a time from the mapped file) and must hold
exactly the live state: pools with their carried entries and sources, duplicate tokens,
the outbox with its bytes, the counts. The start's compaction (written record by record)
must replay to the same state again, and its file must be the one-buffer encoding of the
snapshot, byte for byte.
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from broker.core.machine import Acked, CoreConfig, Effect, ShufflerCore, batch_id_of
from broker.store.records import FILE_HEADER_SIZE, encode_effects, read_header
from broker.store.wal import EffectLog
from tests.broker.test_core import FP, T0, L, maker, report, token

DEVICES = 3_000


def _config() -> CoreConfig:
    return CoreConfig(
        fingerprint=FP,
        t=8,
        round_seconds=L,
        min_batch=40,
        max_batch=250,
        max_skew=2.0,
        late_seconds=15.0,
        round_policy="carry",
        release_size=900,
    )


class Live:
    """A core whose every effect goes through the log first, as in the service."""

    def __init__(self, path: Path) -> None:
        self.log = EffectLog(path)
        self.core = ShufflerCore(_config())
        for effect in self.log.recover():
            self.core.apply(effect)
        self.commit(self.core.reconfigure(maker()))
        self.log.compact(self.core.snapshot())

    def commit(self, effects: list[Effect]) -> None:
        for effect in effects:
            self.log.stage(effect)
        self.log.flush()
        for effect in effects:
            self.core.apply(effect)


def _read(live: Live, rng: random.Random, now: float) -> None:
    """One socket read: up to 400 reports of random devices (duplicates and late rounds
    among them), then their settle, logged and applied."""
    current = int(now // L)
    for _ in range(rng.randint(1, 400)):
        device = rng.randrange(DEVICES)
        round_ = current - (rng.random() < 0.2)
        live.core.offer(now, token(device), report(round_, rng.randrange(2**32), device % 8))
    admitted, _ = live.core.settle()
    live.commit(list(admitted))
    for effect in admitted:
        if live.core.due_early(effect.round):
            release = live.core.release_early(effect.round, maker(rng.randrange(100)))
            if release is not None:
                live.commit([release])


def _restart(live: Live, path: Path) -> Live:
    """Kill the live core (its log closed as after a crash: nothing staged) and start a
    new one from the file; the recovered state must be the live one."""
    want = live.core.state_digest()
    live.log.close()
    fresh = ShufflerCore(_config())
    for effect in EffectLog(path).recover():
        fresh.apply(effect)
    assert fresh.state_digest() == want
    started = Live(path)  # recovers, reconfigures (nothing to do) and compacts, as on start
    assert started.core.state_digest() == want
    data = path.read_bytes()
    salt = read_header(data)
    assert salt is not None
    snapshot = encode_effects(started.core.snapshot(), salt)
    assert data[FILE_HEADER_SIZE:] == snapshot, "the streamed compaction is not the snapshot"
    return started


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_a_restart_recovers_the_live_state_exactly(tmp_path: Path, seed: int) -> None:
    rng = random.Random(seed)
    path = tmp_path / "effects.log"
    live = Live(path)
    now = T0
    restarts = carried = 0
    for step in range(240):
        now += rng.choice([0.05, 0.1, 0.5, 1.5])
        action = rng.random()
        if action < 0.7:
            _read(live, rng, now)
        elif action < 0.85:
            live.commit(live.core.tick(now, maker(step), hold=rng.random() < 0.3))
        elif action < 0.95:
            outbox = live.core.outbox()
            if outbox:
                live.commit([Acked(batch_id_of(outbox[rng.randrange(len(outbox))]))])
        elif rng.random() < 0.5:
            live.log.compact(live.core.snapshot())  # the service's compaction as it grows
        pools = live.core.state_digest()[4]
        assert isinstance(pools, dict)
        carried = max([carried, *(pool[0] for pool in pools.values())])
        if step % 40 == 39:
            live = _restart(live, path)
            restarts += 1
    # the workload reached what a restart must bring back: several pools, carried entries
    # with their source rounds, and unacknowledged batches
    assert restarts == 6
    assert carried > 0
    assert live.core.buffered > 0
    assert live.core.outbox_reports > 0
    live.log.close()
