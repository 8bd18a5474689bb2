"""Sharded shufflers against a real Mosquitto: each shard takes only its own devices'
reports (``wrong_shard`` otherwise), signs its batches with its label, holds a lease that
keeps a second process off its shard, and retires when a newer layout takes over; a
reshard K=1 -> K=2 at a round boundary loses and doubles nothing."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import subprocess
import time
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiomqtt
import pytest
from prometheus_client import CollectorRegistry

from broker.service.lease import Lease, LeaseRefusedError
from broker.service.shuffler import Shuffler, ShufflerConfig
from edge.announce import encode_announcement
from edge.batch_auth import BatchSigner, BatchVerifier
from edge.codec import decode_batch, decode_manifest, encode_report
from edge.rounds import current_round
from edge.shards import ShardLayout, ShardPlan
from edge.spec import MechanismSpec
from edge.topics import (
    batches_filter,
    ingress_topic,
    manifests_filter,
    shard_lease_topic,
    spec_topic,
)
from tests import waiting
from tests.broker.test_shuffler import run, value, wait_until
from tests.conftest import Broker
from tests.processes import COCO

pytestmark = pytest.mark.integration

DEP = "sharded"
SPEC = MechanismSpec(mechanism="coco", d=16, s=2, epsilon=1.0)
L = 2


def signers(plan_labels: list[str]) -> dict[str, BatchSigner]:
    return {label: BatchSigner.generate(DEP, label) for label in plan_labels}


def plan_of(keys: dict[str, BatchSigner], second_from: int | None = None) -> ShardPlan:
    first = ShardLayout(
        count=1, from_round=0, generation=0, seed=7, keys=(keys["g0s0"].public_key_hex,)
    )
    if second_from is None:
        return ShardPlan((first,))
    second = ShardLayout(
        count=2,
        from_round=second_from,
        generation=1,
        seed=9,
        keys=(keys["g1s0"].public_key_hex, keys["g1s1"].public_key_hex),
    )
    return ShardPlan((first, second))


def config(broker: Broker, shard: str, plan: ShardPlan, signer: BatchSigner, **kw: Any) -> Any:
    settings: dict[str, Any] = {
        "broker": broker.url,
        "deployment": DEP,
        "spec": SPEC,
        "min_batch": 5,
        "round_seconds": L,
        "max_skew": 0.5,
        "flush_interval": 0.1,
        "reconnect_min": 0.05,
        "reconnect_max": 0.5,
        "drain_timeout": 5.0,
        "shard": shard,
        "plan": plan,
        "signer": signer,
        "lease_settle": 0.5,
        "backlog_quiet": 0.5,
        **kw,
    }
    return ShufflerConfig(**settings)


class Sink:
    """Every batch and manifest of every shard, by topic."""

    def __init__(self) -> None:
        self.messages: list[tuple[str, bytes]] = []

    def batches(self, keys: dict[str, BatchSigner]) -> list[tuple[str, tuple[Any, ...]]]:
        out = []
        for topic, payload in self.messages:
            label = topic.rsplit("/", 1)[1]
            if "/batches/" in topic:
                verifier = BatchVerifier(keys[label].public_key_hex, DEP, label)
                out.append((label, decode_batch(bytes(verifier.open(payload)))))
        return out

    def manifests(self, keys: dict[str, BatchSigner]) -> list[tuple[str, tuple[Any, ...]]]:
        out = []
        for topic, payload in self.messages:
            label = topic.rsplit("/", 1)[1]
            if "/manifests/" in topic:
                verifier = BatchVerifier(keys[label].public_key_hex, DEP, label)
                out.append((label, decode_manifest(bytes(verifier.open_manifest(payload)))))
        return out


@contextlib.asynccontextmanager
async def sink(broker: Broker) -> AsyncIterator[Sink]:
    collected = Sink()
    async with aiomqtt.Client("127.0.0.1", broker.port) as client:
        await client.subscribe(batches_filter(DEP), qos=1)
        await client.subscribe(manifests_filter(DEP), qos=1)

        async def collect() -> None:
            async for message in client.messages:
                payload = message.payload
                assert isinstance(payload, bytes)
                collected.messages.append((str(message.topic), payload))

        task = asyncio.create_task(collect())
        try:
            yield collected
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task


async def publish(broker: Broker, reports: list[tuple[str, str, bytes]]) -> None:
    """``(shard label, device, payload)`` on the device's ingress topic of that shard."""
    async with aiomqtt.Client("127.0.0.1", broker.port) as client:
        for label, device, payload in reports:
            await client.publish(ingress_topic(DEP, device, label), payload, qos=1)


async def round_start() -> int:
    """Wait for a fresh round to begin; its number."""
    now = time.time()
    await asyncio.sleep((current_round(L, now) + 1) * L - now + 0.01)
    return current_round(L)


def report(round_: int, seed: int) -> bytes:
    return encode_report(SPEC.fingerprint_int, round_, seed, seed % SPEC.t)


@contextlib.asynccontextmanager
async def running(
    cfg: ShufflerConfig, registry: CollectorRegistry, *, connect_within: float = 20
) -> AsyncIterator[Shuffler]:
    """A shuffler running in this event loop for the block (its start's failure raised),
    stopped and awaited at the end."""
    async with Shuffler(cfg, registry=registry) as shuffler:
        task = asyncio.create_task(shuffler.run())
        await wait_until(lambda: shuffler.connected.is_set() or task.done(), connect_within)
        if task.done():
            task.result()
        try:
            yield shuffler
        finally:
            shuffler.stop()
            async with asyncio.timeout(20):
                await task


def test_a_shard_takes_only_its_devices_and_signs_with_its_label(
    mosquitto: Broker, tmp_path: Path
) -> None:
    keys = signers(["g1s0", "g1s1"])
    layout = ShardLayout(
        count=2,
        from_round=0,
        generation=1,
        seed=9,
        keys=(keys["g1s0"].public_key_hex, keys["g1s1"].public_key_hex),
    )
    plan = ShardPlan((layout,))
    registries = {label: CollectorRegistry() for label in ("g1s0", "g1s1")}

    async def scenario() -> Sink:
        async with sink(mosquitto) as collected, contextlib.AsyncExitStack() as stack:
            for label, registry in registries.items():
                cfg = config(mosquitto, label, plan, keys[label], state_dir=tmp_path / label)
                await stack.enter_async_context(running(cfg, registry))
            round_ = await round_start()
            devices = [f"d{i}" for i in range(40)]
            honest = [
                (str(plan.label_for(d, round_)), d, report(round_, i))
                for i, d in enumerate(devices)
            ]
            other = {"g1s0": "g1s1", "g1s1": "g1s0"}
            wrong = [
                (other[label], d, report(round_, 100 + i))
                for i, (label, d, _) in enumerate(honest[:6])
            ]
            await publish(mosquitto, honest + wrong)
            await wait_until(
                lambda: (
                    sum(
                        value(r, "coco_shuffler_reports_received_total")
                        for r in registries.values()
                    )
                    == 46
                )
            )
            await wait_until(lambda: len(collected.batches(keys)) == 2, 30)
            await wait_until(lambda: len(collected.manifests(keys)) == 2, 30)
            return collected

    collected = run(scenario(), 90)
    released: Counter[str] = Counter()
    for label, (_fp, _round, _batch_id, seeds, _zs) in collected.batches(keys):
        released[label] += len(seeds)
        assert all(seed < 100 for seed in seeds)  # no report from the wrong shard's topic
    assert sum(released.values()) == 40
    wrong_total = sum(
        value(r, "coco_shuffler_reports_rejected_total", reason="wrong_shard")
        for r in registries.values()
    )
    assert wrong_total == 6
    for label, (_fp, _round, _release, entries, _sources) in collected.manifests(keys):
        assert sum(count for _, count in entries) == released[label]


def test_the_lease_keeps_a_second_process_off_a_shard(mosquitto: Broker, tmp_path: Path) -> None:
    keys = signers(["g0s0"])
    plan = plan_of(keys)
    cfg = config(mosquitto, "g0s0", plan, keys["g0s0"], state_dir=tmp_path / "a", lease_ttl=3.0)
    other = config(mosquitto, "g0s0", plan, keys["g0s0"], state_dir=tmp_path / "b", lease_ttl=3.0)

    async def lease() -> Lease | None:
        async with aiomqtt.Client("127.0.0.1", mosquitto.port) as client:
            await client.subscribe(shard_lease_topic(DEP, "g0s0"), qos=1)
            async with asyncio.timeout(5):
                async for message in client.messages:
                    assert isinstance(message.payload, bytes)
                    return Lease.decode(message.payload)
        return None

    async def scenario() -> None:
        async with running(cfg, CollectorRegistry()) as first:
            held = await lease()
            assert held is not None
            assert held.owner == first._owner
            # another state directory: refused while the lease is fresh, nothing started
            with pytest.raises(LeaseRefusedError, match="held by another shuffler"):
                async with Shuffler(other, registry=CollectorRegistry()) as second:
                    await second.run()
        # the same state directory again: takes over at once (its lease is still fresh)
        async with running(cfg, CollectorRegistry()) as again:
            assert again.connected.is_set()
        # after ttl without renewal the lease is stale: another directory may take it
        await asyncio.sleep(3.5)
        async with running(other, CollectorRegistry()) as taken:
            assert taken.connected.is_set()

    run(scenario(), 90)


def test_a_reshard_from_one_to_two_shards_loses_and_doubles_nothing(
    mosquitto: Broker, tmp_path: Path
) -> None:
    """K=1 -> K=2 announced for a round a few rounds ahead: every device reports every
    round to the shard of that round's layout; the old shard releases its last round and
    retires (run returns, exit 0 in the CLI), the new ones take every later round. Every
    report is released once, and no device is in two batches of one round."""
    keys = signers(["g0s0", "g1s0", "g1s1"])
    devices = [f"r{i}" for i in range(12)]

    async def scenario() -> tuple[Sink, ShardPlan, Shuffler, int, int]:
        start = current_round(L)
        plan = plan_of(keys, second_from=start + 3)
        async with sink(mosquitto) as collected, contextlib.AsyncExitStack() as stack:
            shufflers = {}
            for label in ("g0s0", "g1s0", "g1s1"):
                cfg = config(mosquitto, label, plan, keys[label], state_dir=tmp_path / label)
                shufflers[label] = await stack.enter_async_context(
                    Shuffler(cfg, registry=CollectorRegistry())
                )
            tasks = {label: asyncio.create_task(s.run()) for label, s in shufflers.items()}
            await wait_until(lambda: all(s.connected.is_set() for s in shufflers.values()), 20)
            sent = 0
            for round_ in range(start, start + 6):
                while current_round(L) < round_:
                    await asyncio.sleep(0.02)
                if current_round(L) != round_:
                    continue
                batch = [
                    (str(plan.label_for(d, round_)), d, report(round_, 1000 * round_ % 10**6 + i))
                    for i, d in enumerate(devices)
                ]
                await publish(mosquitto, batch)
                sent += len(batch)
            old = tasks.pop("g0s0")
            await asyncio.wait_for(old, 30)  # retires by itself

            def held() -> int:
                return sum(shufflers[label].core.buffered for label in tasks)

            def accounted() -> int:
                return sum(len(b[1][3]) for b in collected.batches(keys)) + held()

            await wait_until(lambda: accounted() == sent, 30, progress=accounted)
            await asyncio.sleep(1.0)  # anything released twice would show by now
            pooled = held()
            for label, task in tasks.items():
                shufflers[label].stop()
                await asyncio.wait_for(task, 20)
            return collected, plan, shufflers["g0s0"], sent, pooled

    collected, plan, old, sent, pooled = run(scenario(), 120)
    assert old.retired
    released: Counter[int] = Counter()
    per_round: dict[int, Counter[int]] = {}
    for label, (_fp, round_, _id, seeds, _zs) in collected.batches(keys):
        layout = plan.layout_of_label(label)
        assert layout is not None
        first, end = plan.rounds_of(layout)
        assert first <= round_  # only its layout's rounds
        assert end is None or round_ < end
        for seed in seeds:
            released[seed] += 1
            per_round.setdefault(round_, Counter())[seed % 1000] += 1
    assert all(count == 1 for count in released.values())  # nothing doubled
    for counts in per_round.values():
        assert all(count == 1 for count in counts.values())  # one device once per round
    assert sum(released.values()) + pooled == sent  # nothing lost (the rest is pooled)
    assert sent == 12 * len(per_round) or sent >= 12 * 4


# --- as `coco shuffler --shard`, real processes -----------------------------------------------


def coco_shuffler(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [*COCO, "shuffler", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def write_key(path: Path, signer_seed: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(signer_seed.hex() + "\n")
    path.chmod(0o600)


def test_coco_shuffler_shard_refuses_an_owned_shard_and_a_wrong_key_then_retires(
    mosquitto: Broker, tmp_path: Path
) -> None:
    """Real processes: ``coco shuffler --shard g0s0`` takes its shard; a second one with
    another state directory exits 1 with one line naming the shard; one with a key that is
    not the shard's announced key exits 1 naming both keys; and once a newer layout is
    announced, the first one releases its last round and exits 0 with one INFO line."""
    from cryptography.hazmat.primitives import serialization  # noqa: PLC0415
    from cryptography.hazmat.primitives.asymmetric.ed25519 import (  # noqa: PLC0415
        Ed25519PrivateKey,
    )

    seeds = {label: Ed25519PrivateKey.generate() for label in ("g0s0", "g1s0", "other")}
    raw = {
        label: key.private_bytes(
            serialization.Encoding.Raw,
            serialization.PrivateFormat.Raw,
            serialization.NoEncryption(),
        )
        for label, key in seeds.items()
    }
    for label, seed in raw.items():
        write_key(tmp_path / "keys" / f"{label}.key", seed)
    public = {label: BatchSigner(key, DEP, label).public_key_hex for label, key in seeds.items()}
    first = ShardLayout(count=1, from_round=0, generation=0, seed=7, keys=(public["g0s0"],))

    def announce(plan: ShardPlan) -> None:
        payload = encode_announcement(
            SPEC.to_dict(), min_batch=5, delta=1e-6, round_seconds=L, shards=plan
        )

        async def send() -> None:
            async with aiomqtt.Client("127.0.0.1", mosquitto.port) as client:
                await client.publish(spec_topic(DEP), payload, qos=1, retain=True)

        asyncio.run(send())

    announce(ShardPlan((first,)))
    common = ["--broker", mosquitto.url, "--deployment", DEP, "--shard", "g0s0"]
    common += ["--max-skew", "0.5", "--flush-interval", "0.1", "--lease-ttl", "30"]
    owner = coco_shuffler(
        *common,
        *("--state-dir", str(tmp_path / "a"), "--signing-key", str(tmp_path / "keys/g0s0.key")),
    )
    try:

        def owning() -> bool:
            assert owner.poll() is None, owner.communicate()[0]
            return (tmp_path / "a" / "effects.log").exists() and lease_held(mosquitto)

        waiting.wait_until(
            owning,
            progress=lambda: waiting.cpu_seconds(owner.pid),  # starting up is CPU work
            stall=60,
            what="the first shuffler owns the shard",
            interval=0.1,
        )
        second = coco_shuffler(
            *common,
            *("--state-dir", str(tmp_path / "b")),
            *("--signing-key", str(tmp_path / "keys/g0s0.key")),
        )
        out, _ = second.communicate(timeout=60)
        errors = [line for line in out.splitlines() if line.startswith("error:")]
        assert second.returncode == 1, out
        assert len(errors) == 1, out
        assert "shard g0s0 is held by another shuffler" in errors[0]
        wrong = coco_shuffler(
            *common,
            *("--state-dir", str(tmp_path / "c")),
            *("--signing-key", str(tmp_path / "keys/other.key")),
        )
        out, _ = wrong.communicate(timeout=60)
        errors = [line for line in out.splitlines() if line.startswith("error:")]
        assert wrong.returncode == 1, out
        assert len(errors) == 1, out
        assert public["other"] in errors[0]
        assert public["g0s0"] in errors[0]
        assert "key of shard g0s0" in errors[0]
        # a reshard: generation 1 serves from two rounds ahead; g0s0 retires
        second_layout = ShardLayout(
            count=1, from_round=current_round(L) + 2, generation=1, seed=9, keys=(public["g1s0"],)
        )
        announce(ShardPlan((first, second_layout)))
        out, _ = owner.communicate(timeout=60)
        assert owner.returncode == 0, out
        retired = [line for line in out.splitlines() if "retired" in line]
        assert len(retired) == 1, out
        assert "shard g0s0 retired" in retired[0]
    finally:
        if owner.poll() is None:
            owner.kill()
            owner.communicate()


def lease_held(broker: Broker) -> bool:
    async def read() -> bool:
        async with aiomqtt.Client("127.0.0.1", broker.port) as client:
            await client.subscribe(shard_lease_topic(DEP, "g0s0"), qos=1)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(1.0):
                    async for message in client.messages:
                        return bool(message.payload)
        return False

    return asyncio.run(read())


def test_a_new_session_warns_only_when_a_shard_may_have_lost_reports(
    mosquitto: Broker, caplog: pytest.LogCaptureFixture
) -> None:
    """A first layout's shard (from round 0) starting: INFO, however late the clock; a
    reshard's shard subscribing first after its layout's first round began: WARNING (devices
    sent it reports no session queued)."""
    caplog.set_level(logging.INFO, logger="broker.shuffler")
    keys = signers(["g0s0", "g1s0", "g1s1"])

    async def scenario() -> None:
        registry = CollectorRegistry()
        async with running(config(mosquitto, "g0s0", plan_of(keys), keys["g0s0"]), registry):
            pass
        assert registry.get_sample_value("coco_shuffler_sessions_new_total") == 1
        said = [(r.levelno, r.getMessage()) for r in caplog.records if "session" in r.getMessage()]
        assert said == [(logging.INFO, "a new session on the broker (first start)")]
        caplog.clear()
        registry = CollectorRegistry()
        plan = plan_of(keys, second_from=current_round(L) - 1)  # begun before its start
        async with running(config(mosquitto, "g1s0", plan, keys["g1s0"]), registry):
            pass
        assert registry.get_sample_value("coco_shuffler_sessions_new_total") == 1
        lost = [r for r in caplog.records if "held no session" in r.getMessage()]
        assert [r.levelno for r in lost] == [logging.WARNING], lost
        assert "its shard's first round had begun" in lost[0].getMessage()

    run(scenario())
