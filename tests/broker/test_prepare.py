"""``coco shuffler prepare`` against real brokers: a prepared shard's reports, published while
no shuffler runs, are queued by the broker and released once its shuffler starts; the same
reports to a shard nobody prepared are lost (the control that shows the test can fail). On
Mosquitto and on a 3-node NATS cluster (publisher, preparer and shuffler on different
nodes). A shard whose shuffler runs is refused, and that shuffler goes on unharmed."""

from __future__ import annotations

import asyncio
import contextlib
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiomqtt
import pytest
from prometheus_client import CollectorRegistry

from broker.service.config import SESSION_EXPIRY
from broker.service.prepare import Prepared, PrepareSettings, ShardRunningError, prepare_shard
from broker.service.shuffler import ShufflerConfig
from edge.announce import encode_announcement
from edge.batch_auth import BatchSigner, BatchVerifier
from edge.codec import decode_batch, encode_report
from edge.mqtt_url import parse_broker_urls
from edge.rounds import current_round
from edge.shards import ShardLayout, ShardPlan
from edge.spec import MechanismSpec
from edge.topics import batches_filter, ingress_topic, spec_topic
from tests.broker.test_shards import running
from tests.broker.test_shuffler import run, value, wait_until
from tests.clusters import NatsCluster
from tests.conftest import Broker
from tests.processes import coco, error_lines

pytestmark = pytest.mark.integration

DEP = "prepared"
SPEC = MechanismSpec(mechanism="coco", d=16, s=2, epsilon=1.0)
L = 2
N = 12
"""Reports published to each shard while no shuffler runs."""


def keys_of(labels: list[str]) -> dict[str, BatchSigner]:
    return {label: BatchSigner.generate(DEP, label) for label in labels}


def layout(keys: dict[str, BatchSigner], generation: int, count: int, from_round: int) -> Any:
    return ShardLayout(
        count=count,
        from_round=from_round,
        generation=generation,
        seed=11,
        keys=tuple(keys[f"g{generation}s{i}"].public_key_hex for i in range(count)),
    )


def config(url: str, shard: str, plan: ShardPlan, signer: BatchSigner, state: Path) -> Any:
    return ShufflerConfig(
        broker=url,
        deployment=DEP,
        spec=SPEC,
        min_batch=5,
        round_seconds=L,
        max_skew=0.5,
        flush_interval=0.1,
        reconnect_min=0.05,
        reconnect_max=0.5,
        drain_timeout=5.0,
        shard=shard,
        plan=plan,
        signer=signer,
        state_dir=state,
        lease_settle=0.5,
        backlog_quiet=0.5,
    )


def client(url: str) -> aiomqtt.Client:
    address = parse_broker_urls(url)[0]  # 3.1.1: what NATS speaks, and Mosquitto too
    return aiomqtt.Client(address.host, address.port, protocol=aiomqtt.ProtocolVersion.V311)


async def publish(url: str, reports: list[tuple[str, str, bytes]]) -> None:
    """``(shard, device, payload)`` at QoS 1 (each PUBACK awaited: acknowledged reports)."""
    async with client(url) as c:
        for label, device, payload in reports:
            await c.publish(ingress_topic(DEP, device, label), payload, qos=1)


async def announce(url: str, plan: ShardPlan) -> None:
    payload = encode_announcement(
        SPEC.to_dict(), min_batch=5, delta=1e-6, round_seconds=L, shards=plan
    )
    async with client(url) as c:
        await c.publish(spec_topic(DEP), payload, qos=1, retain=True)


@contextlib.asynccontextmanager
async def released(url: str, keys: dict[str, BatchSigner]) -> AsyncIterator[Counter[int]]:
    """Every seed released in a verified batch, counted (a batch subscriber on ``url``)."""
    seeds: Counter[int] = Counter()
    async with client(url) as c:
        await c.subscribe(batches_filter(DEP), qos=1)

        async def collect() -> None:
            async for message in c.messages:
                label = str(message.topic).rsplit("/", 1)[1]
                assert isinstance(message.payload, bytes)
                opened = BatchVerifier(keys[label].public_key_hex, DEP, label).open(message.payload)
                seeds.update(decode_batch(bytes(opened))[3])

        task = asyncio.create_task(collect())
        try:
            yield seeds
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task


def devices_of(plan: ShardPlan, label: str, round_: int) -> list[str]:
    found = [d for d in (f"dev{i}" for i in range(10 * N)) if plan.label_for(d, round_) == label]
    assert len(found) >= N
    return found[:N]


async def queued_until_the_shuffler_starts(
    nodes: str, publisher: str, observer: str, tmp_path: Path
) -> tuple[list[Prepared], dict[str, float], int]:
    """Prepare g0s0 (twice: idempotent) through ``nodes``, not g0s1; publish :data:`N`
    reports to each shard through ``publisher`` while no shuffler runs; then start both
    shufflers (on ``nodes``) and wait until g0s0 released all of its reports. What the
    preparations returned, the reports each shard received, and g0s0's seeds released."""
    keys = keys_of(["g0s0", "g0s1"])
    plan = ShardPlan((layout(keys, 0, 2, 0),))
    settings = PrepareSettings(broker=nodes, deployment=DEP, lease_settle=0.5)
    prepared = [await prepare_shard(settings, "g0s0"), await prepare_shard(settings, "g0s0")]
    round_ = current_round(L)
    sent = {
        label: [(label, d, encode_report(SPEC.fingerprint_int, round_, seed, seed % SPEC.t))
                for seed, d in enumerate(devices_of(plan, label, round_), start=base)]
        for label, base in (("g0s0", 1000), ("g0s1", 2000))
    }  # fmt: skip
    await publish(publisher, sent["g0s0"] + sent["g0s1"])
    registries = {label: CollectorRegistry() for label in sent}
    async with released(observer, keys) as seeds, contextlib.AsyncExitStack() as stack:
        for label, registry in registries.items():
            cfg = config(nodes, label, plan, keys[label], tmp_path / label)
            await stack.enter_async_context(running(cfg, registry, connect_within=30))
        theirs = [1000 + i for i in range(N)]

        def done() -> int:
            return sum(seeds[s] for s in theirs)

        await wait_until(lambda: done() >= N, 40, progress=done)
        await asyncio.sleep(1.0)  # a late g0s1 report, or a double, would show by now
        received = {
            label: value(registry, "coco_shuffler_reports_received_total")
            for label, registry in registries.items()
        }
        doubled = sum(count > 1 for count in seeds.values())
        return prepared, received, done() + doubled


def check(prepared: list[Prepared], received: dict[str, float], released_seeds: int) -> None:
    first, again = prepared
    assert not first.session_present  # created by the first preparation
    assert again.session_present  # the second found it: preparing is idempotent
    assert first.client_id == "coco-shuffler-prepared-g0s0"  # the shuffler's own session
    assert first.expiry == (SESSION_EXPIRY if first.version == "5" else None)
    assert "prepared shard g0s0" in first.line()
    assert received["g0s0"] == N  # everything published before the shuffler started
    assert released_seeds == N  # released, each once
    assert received["g0s1"] == 0  # the control: not prepared, so the broker dropped them


def test_a_prepared_shard_gets_what_was_published_before_its_shuffler_on_mosquitto(
    mosquitto: Broker, tmp_path: Path
) -> None:
    url = mosquitto.url
    check(*run(queued_until_the_shuffler_starts(url, url, url, tmp_path), 90))


def test_a_prepared_shard_gets_what_was_published_before_its_shuffler_on_a_nats_cluster(
    nats_cluster: NatsCluster, tmp_path: Path
) -> None:
    urls = nats_cluster.urls
    nodes = ",".join(urls)  # prepared and served through n1
    outcome = run(queued_until_the_shuffler_starts(nodes, urls[1], urls[2], tmp_path), 120)
    prepared, _, _ = outcome
    assert all(p.version == "3.1.1" for p in prepared)  # NATS speaks 3.1.1 only
    check(*outcome)


def test_prepare_refuses_a_running_shard_and_leaves_it_unharmed(
    mosquitto: Broker, tmp_path: Path
) -> None:
    """``coco shuffler prepare`` (a real process): by default, every shard of the layout not
    begun yet, one line each; ``--shard`` of a shard whose shuffler runs: one ``error:``
    line, exit 1, and that shuffler keeps its session and takes the next report."""
    keys = keys_of(["g0s0", "g1s0", "g1s1"])
    now = current_round(L)
    plan = ShardPlan((layout(keys, 0, 1, 0), layout(keys, 1, 2, now + 100)))
    url = mosquitto.url
    prepare = ["shuffler", "prepare", "--deployment", DEP, "--broker", url]

    async def scenario() -> None:
        await announce(url, plan)
        ahead = await asyncio.to_thread(coco, *prepare)
        assert ahead.returncode == 0, ahead.stderr
        lines = ahead.stdout.splitlines()
        assert [line.split(":")[0] for line in lines] == [
            "prepared shard g1s0",
            "prepared shard g1s1",
        ], ahead.stdout
        registry = CollectorRegistry()
        cfg = config(url, "g0s0", plan, keys["g0s0"], tmp_path / "g0s0")
        async with running(cfg, registry, connect_within=30) as shuffler:
            refused = await asyncio.to_thread(coco, *prepare, "--shard", "g0s0")
            assert refused.returncode == 1, refused.stdout + refused.stderr
            errors = error_lines(refused.stderr)
            assert len(errors) == 1, refused.stderr
            assert "shard g0s0 is held by a running shuffler" in errors[0]
            assert refused.stdout == ""
            with pytest.raises(ShardRunningError):  # the library refuses the same way
                await prepare_shard(PrepareSettings(broker=url, deployment=DEP), "g0s0")
            round_ = current_round(L)
            device = devices_of(plan, "g0s0", round_)[0]
            payload = encode_report(SPEC.fingerprint_int, round_, 7, 7 % SPEC.t)
            await publish(url, [("g0s0", device, payload)])
            received = "coco_shuffler_reports_received_total"
            await wait_until(lambda: value(registry, received) == 1, 15)
            assert shuffler.connected.is_set()
            assert shuffler.failure is None  # its session was never taken over
            assert value(registry, "coco_shuffler_reconnects_total") == 0

    run(scenario(), 90)
