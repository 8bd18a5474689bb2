"""A service that starts while a node of ``--broker`` is down, or is up and does not yet serve
the retained messages, starts on the other nodes.

Both were seen on a 3-node NATS cluster with a node killed: an aggregator restarted beside a
just-restarted node spent its whole announcement timeout on that node (it accepted the
connection and delivered nothing) and exited; a shuffler restarted while the first node of
``--broker`` was down exited with ``Connect call failed`` while claiming its lease. Here the
nodes are separate Mosquitto processes: a port with nothing listening is a node that is down,
and a broker without the retained announcement is a node that answers and delivers nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import aiomqtt
import pytest
from prometheus_client import CollectorRegistry

from broker.service.lease import Lease, LeaseLostError, LeaseRefusedError
from broker.service.prepare import PrepareSettings, ShardRunningError, prepare_shard
from broker.service.shuffler import Shuffler, ShufflerConfig
from edge.announce import encode_announcement
from edge.announcement_reader import NotAnnouncedError, fetch_announcement
from edge.errors import CocoError
from edge.topics import shard_lease_topic, spec_topic
from tests.asyncutil import run
from tests.broker.test_shards import DEP, SPEC, config, plan_of, running, signers
from tests.broker.test_shuffler import wait_until
from tests.conftest import Broker, free_port

pytestmark = pytest.mark.integration


async def announce(broker: Broker) -> None:
    payload = encode_announcement(SPEC.to_dict(), min_batch=5, delta=1e-6, round_seconds=8)
    async with aiomqtt.Client("127.0.0.1", broker.port) as client:
        await client.publish(spec_topic(DEP), payload, qos=1, retain=True)


async def lease_on(broker: Broker) -> Lease:
    """The retained lease of shard g0s0 on ``broker``."""
    async with aiomqtt.Client("127.0.0.1", broker.port) as client:
        await client.subscribe(shard_lease_topic(DEP, "g0s0"), qos=1)
        async for message in client.messages:
            assert isinstance(message.payload, bytes)
            held = Lease.decode(message.payload)
            assert held is not None
            return held
    raise AssertionError("the subscription ended")  # pragma: no cover


async def owned(broker: Broker) -> Lease:
    """The announcement and a fresh lease of shard g0s0 held by another owner, retained on
    ``broker``; returns that lease."""
    await announce(broker)
    holder = Lease("the-running-owner", "its-instance", time.time(), 600.0)
    async with aiomqtt.Client("127.0.0.1", broker.port) as client:
        await client.publish(shard_lease_topic(DEP, "g0s0"), holder.encode(), qos=1, retain=True)
    return holder


def two_nodes(
    second: Broker, first: Broker, tmp_path: Path, *, announced: bool = False
) -> ShufflerConfig:
    """Shard g0s0's shuffler (lease ttl 3 s) with ``--broker first,second``."""
    keys = signers(["g0s0"])
    cfg: ShufflerConfig = config(
        second, "g0s0", plan_of(keys), keys["g0s0"], state_dir=tmp_path / "state", lease_ttl=3
    )
    return dataclasses.replace(cfg, broker=f"{first.url},{second.url}", announced=announced)


@pytest.fixture
def silent(tmp_path: Path) -> Iterator[Broker]:
    """A second Mosquitto, which never holds the announcement."""
    workdir = tmp_path / "silent"
    workdir.mkdir()
    broker = Broker(workdir, free_port())
    broker.start()
    try:
        yield broker
    finally:
        broker.stop()


def test_the_announcement_comes_from_the_node_that_has_it(
    mosquitto: Broker, silent: Broker
) -> None:
    down = f"mqtt://127.0.0.1:{free_port()}"
    run(announce(mosquitto), 20)
    for nodes in (
        f"{down},{mosquitto.url}",  # the first node is down
        f"{silent.url},{mosquitto.url}",  # the first node answers and delivers nothing
        f"{down},{silent.url},{mosquitto.url}",
    ):
        got = run(fetch_announcement(nodes, DEP, timeout=10), 30)
        assert got["min_batch"] == 5, nodes
        assert got["spec"] == SPEC.to_dict(), nodes


def test_no_announcement_and_no_broker_are_told_apart(silent: Broker) -> None:
    down = f"mqtt://127.0.0.1:{free_port()}"
    with pytest.raises(NotAnnouncedError, match=f"no announcement on {spec_topic(DEP)}"):
        run(fetch_announcement(f"{down},{silent.url}", DEP, timeout=3), 30)
    other_down = f"mqtt://127.0.0.1:{free_port()}"
    with pytest.raises(CocoError, match="cannot read the spec announcement from") as raised:
        run(fetch_announcement(f"{down},{other_down}", DEP, timeout=3), 30)
    assert not isinstance(raised.value, NotAnnouncedError)


def test_a_shuffler_claims_its_lease_when_the_first_node_is_down(
    mosquitto: Broker, tmp_path: Path
) -> None:
    keys = signers(["g0s0"])
    first_down = f"mqtt://127.0.0.1:{free_port()},{mosquitto.url}"
    cfg = config(
        mosquitto, "g0s0", plan_of(keys), keys["g0s0"], state_dir=tmp_path / "state", lease_ttl=3
    )
    cfg = dataclasses.replace(cfg, broker=first_down)

    async def scenario() -> None:
        async with running(cfg, CollectorRegistry()) as shuffler:
            held = await asyncio.wait_for(lease_on(mosquitto), 10)
            assert held.owner == shuffler._owner

    run(scenario(), 90)


def test_a_refused_login_ends_the_lease_claim_at_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Not authorized is an answer, not a node that is down: no walk, no backoff."""
    caplog.set_level(logging.WARNING, logger="broker.shuffler")
    broker = Broker(tmp_path, free_port(), extra_config="allow_anonymous false\n")
    broker.start()
    keys = signers(["g0s0"])
    cfg = config(broker, "g0s0", plan_of(keys), keys["g0s0"], state_dir=tmp_path / "state")
    cfg = dataclasses.replace(cfg, username="nobody", password="wrong")

    async def scenario() -> None:
        async with Shuffler(cfg, registry=CollectorRegistry()) as shuffler:
            await shuffler.run()

    try:
        with pytest.raises(aiomqtt.MqttError, match=r"[Nn]ot authori[sz]ed"):
            run(scenario(), 120)
    finally:
        broker.stop()
    assert not [r for r in caplog.records if "cannot be reached" in r.getMessage()]


def test_a_node_that_keeps_no_claim_gives_way_to_the_next(
    mosquitto: Broker, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A node that accepts the claim and keeps nothing (as a NATS node just restarted, which
    serves no retained message for a while; here an ACL that drops the lease topic) is not
    a refusal: the shuffler claims its lease through the next node."""
    caplog.set_level(logging.WARNING, logger="broker.shuffler")
    workdir = tmp_path / "forgetful"
    workdir.mkdir()
    acl = workdir / "acl"
    acl.write_text(f"topic readwrite #\ntopic deny {shard_lease_topic(DEP, 'g0s0')}\n")
    forgetful = Broker(workdir, free_port(), extra_config=f"acl_file {acl}\n")
    forgetful.start()
    cfg = two_nodes(mosquitto, forgetful, tmp_path)

    async def scenario() -> None:
        async with running(cfg, CollectorRegistry()) as shuffler:
            held = await asyncio.wait_for(lease_on(mosquitto), 10)
            assert held.owner == shuffler._owner

    try:
        run(scenario(), 90)
    finally:
        forgetful.stop()
    assert [r for r in caplog.records if "kept no lease after the claim" in r.getMessage()]


def test_a_node_serving_no_retained_messages_does_not_hand_over_an_owned_shard(
    mosquitto: Broker, silent: Broker, tmp_path: Path
) -> None:
    """The first node delivers nothing (as a NATS node just restarted, before it serves the
    retained messages); the second holds the announcement and another owner's fresh lease.
    Silence on the first must not read as a free shard: the start is refused, naming the
    holder, and the holder's lease is left as it was."""
    keys = signers(["g0s0"])
    holder = run(owned(mosquitto), 20)
    cfg = config(
        mosquitto, "g0s0", plan_of(keys), keys["g0s0"], state_dir=tmp_path / "state", lease_ttl=3
    )
    cfg = dataclasses.replace(cfg, broker=f"{silent.url},{mosquitto.url}", announced=True)

    async def scenario() -> None:
        async with Shuffler(cfg, registry=CollectorRegistry()) as shuffler:
            await shuffler.run()

    with pytest.raises(LeaseRefusedError, match="the-running-owner"):
        run(scenario(), 90)
    assert run(lease_on(mosquitto), 20) == holder
    assert run(lease_on_or_none(silent), 20) is None  # nothing claimed through the silent node


def test_prepare_asks_the_next_node_when_the_first_serves_no_retained_messages(
    mosquitto: Broker, silent: Broker
) -> None:
    """``coco shuffler prepare`` (which reads the announcement first) on the same nodes: the
    silent first node does not make a running shard look free; the second node's lease
    refuses the preparation, which would have taken over the running shuffler's session."""

    async def scenario() -> None:
        await owned(mosquitto)
        settings = PrepareSettings(
            broker=f"{silent.url},{mosquitto.url}",
            deployment=DEP,
            lease_settle=0.5,
            announced=True,
        )
        with pytest.raises(ShardRunningError, match="the-running-owner"):
            await prepare_shard(settings, "g0s0")

    run(scenario(), 60)


async def lease_on_or_none(broker: Broker, settle: float = 1.0) -> Lease | None:
    """The retained lease of shard g0s0 on ``broker``, or None after ``settle`` seconds."""
    async with aiomqtt.Client("127.0.0.1", broker.port) as client:
        await client.subscribe(shard_lease_topic(DEP, "g0s0"), qos=1)
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(settle):
                async for message in client.messages:
                    assert isinstance(message.payload, bytes)
                    return Lease.decode(message.payload)
    return None


@pytest.mark.parametrize(
    ("case", "stopped_by"),
    [
        ("this owner's earlier instance", "a-newer-owner"),
        ("another owner, stale at the claim", "a-newer-owner"),
        ("another owner, fresh at the claim", "a-live-owner"),
    ],
)
def test_a_late_copy_of_an_older_lease_is_not_a_takeover(
    mosquitto: Broker, tmp_path: Path, case: str, stopped_by: str
) -> None:
    """Seen on a NATS cluster: 0.4 s after a restarted shuffler had acquired its shard, the
    node delivered the previous instance's last renewal, and the shuffler stopped as if
    taken over. A lease renewed before this instance's claim, of the same owner or already
    stale then, is a late copy: ignored. One of another owner still fresh at the claim means
    the claim went over a live owner: a takeover. A newer claim is a takeover. The messages
    arrive in order on the shuffler's watch, so the stop names the first one taken for a
    takeover."""
    keys = signers(["g0s0"])
    cfg = config(
        mosquitto, "g0s0", plan_of(keys), keys["g0s0"], state_dir=tmp_path / "state", lease_ttl=3
    )

    async def scenario() -> None:
        async with running(cfg, CollectorRegistry()) as shuffler:
            assert shuffler._control is not None
            claimed = shuffler._control.claimed_at
            assert claimed is not None
            # the watch renews only once it has subscribed: wait for its first renewal
            async with asyncio.timeout(20):
                while (await lease_on(mosquitto)).renewed <= claimed:
                    await asyncio.sleep(0.1)
            older = {
                "this owner's earlier instance": Lease(shuffler._owner, "i0", claimed - 0.5, 3),
                "another owner, stale at the claim": Lease("a-gone-owner", "i1", claimed - 9, 3),
                "another owner, fresh at the claim": Lease("a-live-owner", "i2", claimed - 0.5, 3),
            }[case]
            newer = Lease("a-newer-owner", "i3", time.time() + 1.0, 3.0)
            async with aiomqtt.Client("127.0.0.1", mosquitto.port) as client:
                for lease in (older, newer):
                    await client.publish(shard_lease_topic(DEP, "g0s0"), lease.encode(), qos=1)
            await wait_until(lambda: shuffler.failure is not None, 20)

    # the run ends with the first lease it took for a takeover
    with pytest.raises(LeaseLostError, match=stopped_by):
        run(scenario(), 90)


def test_a_read_back_of_an_older_lease_gives_way_to_the_next_node(
    mosquitto: Broker, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A node behind the cluster's retained messages: it drops the claim (here an ACL that
    lets the shuffler read the lease topic, not write it) and still serves the lease of this
    state directory's previous process, renewed before the claim. The read-back shows that
    older lease: not another shuffler's claim at the same moment (which would refuse the
    start) but a node that has not caught up; the claim goes to the next node."""
    caplog.set_level(logging.WARNING, logger="broker.shuffler")
    workdir = tmp_path / "behind"
    workdir.mkdir()
    passwords = workdir / "passwords"
    subprocess.run(
        ["mosquitto_passwd", "-b", "-c", str(passwords), "seeder", "seeder-password"],
        check=True,
        capture_output=True,
    )
    base = f"coco/v1/{DEP}"
    acl = workdir / "acl"
    acl.write_text(
        # anonymous (the shuffler): everything it uses, but the lease read-only
        f"topic read {shard_lease_topic(DEP, 'g0s0')}\n"
        f"topic readwrite {base}/ingress/#\ntopic readwrite {base}/batches/#\n"
        f"topic readwrite {base}/manifests/#\ntopic readwrite {spec_topic(DEP)}\n"
        "user seeder\ntopic readwrite #\n"
    )
    behind = Broker(
        workdir, free_port(), extra_config=f"password_file {passwords}\nacl_file {acl}\n"
    )
    behind.start()
    cfg = two_nodes(mosquitto, behind, tmp_path)

    async def scenario() -> None:
        async with Shuffler(cfg, registry=CollectorRegistry()) as shuffler:
            earlier = Lease(shuffler._owner, "the-previous-process", time.time() - 1.0, 3.0)
            async with aiomqtt.Client(
                "127.0.0.1", behind.port, username="seeder", password="seeder-password"
            ) as client:
                topic = shard_lease_topic(DEP, "g0s0")
                await client.publish(topic, earlier.encode(), qos=1, retain=True)
            task = asyncio.create_task(shuffler.run())
            try:
                await wait_until(lambda: shuffler.connected.is_set() or task.done(), 30)
                if task.done():
                    task.result()
                held = await asyncio.wait_for(lease_on(mosquitto), 10)
                assert held.owner == shuffler._owner
                assert held.instance != "the-previous-process"
            finally:
                shuffler.stop()
                async with asyncio.timeout(20):
                    await task

    try:
        run(scenario(), 90)
    finally:
        behind.stop()
    assert [r for r in caplog.records if "renewed before the claim" in r.getMessage()]
