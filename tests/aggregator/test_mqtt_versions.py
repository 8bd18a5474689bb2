"""MQTT 3.1.1 as well as 5 (issue 17 item 1): ``mqtt_version`` auto, 5 or 3.1.1.

Against a real NATS server (its MQTT listener speaks 3.1.1 only) ``auto`` falls back to
3.1.1, reads the announcement, keeps a persistent session and confirms its lease; forcing
MQTT 5 there is a one-line error. Against Mosquitto over 3.1.1, a second aggregator of the
same account takes the session over and the first stops: 3.1.1 brokers send no DISCONNECT
0x8E, so the lease is the only signal, and it works."""

from __future__ import annotations

import asyncio
import logging
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from aggregator.service.checkpoint_files import load_checkpoint
from aggregator.service.service import Aggregator
from aggregator.service.session import SessionTakenOverError, make_client
from aggregator.service.session import mqtt_connection as connection_of
from edge.announce import encode_announcement
from edge.announcement_reader import fetch_announcement
from edge.errors import CocoError
from edge.topics import batches_topic, spec_topic
from tests import waiting
from tests.aggregator.test_service import (
    DELTA,
    DEPLOYMENT,
    MIN_BATCH,
    SPEC,
    assert_same_estimates,
    batch,
    config,
    moving,
    offline,
    reports,
)
from tests.clusters import NATS_SERVER, nats_server_or_skip
from tests.conftest import Broker, free_port
from tests.waiting import until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


class Nats:
    """One NATS server with JetStream and its MQTT listener (3.1.1 only) on free ports."""

    def __init__(self, workdir: Path) -> None:
        self.port = free_port()
        self.url = f"mqtt://127.0.0.1:{self.port}"
        conf = workdir / "nats.conf"
        conf.write_text(
            f'server_name: "coco-test"\nlisten: 127.0.0.1:{free_port()}\n'
            f'jetstream {{ store_dir: "{workdir / "js"}" }}\n'
            f"mqtt {{ listen: 127.0.0.1:{self.port} }}\n"
        )
        self.log = (workdir / "nats.log").open("wb")
        self.proc = subprocess.Popen(
            [NATS_SERVER, "-c", str(conf)], stdout=self.log, stderr=self.log
        )
        proc = self.proc

        def listening() -> bool:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2):
                    return True
            except OSError:
                if proc.poll() is not None:
                    raise RuntimeError("nats-server exited") from None
                return False

        # its progress: the CPU time it spends starting (tests/waiting.py)
        waiting.wait_until(
            listening,
            progress=lambda: waiting.cpu_seconds(proc.pid),
            stall=20,
            what="nats-server listening",
            interval=0.05,
        )

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.log.close()


@pytest.fixture
def nats(tmp_path: Path) -> Iterator[Nats]:
    nats_server_or_skip()
    server = Nats(tmp_path)
    try:
        yield server
    finally:
        server.stop()


async def publish_311(url: str, topic: str, *payloads: bytes, retain: bool = False) -> None:
    client = make_client(connection_of(url), "3.1.1")
    async with asyncio.timeout(20), client:
        for payload in payloads:
            await client.publish(topic, payload, qos=1, retain=retain)


def test_auto_falls_back_to_3_1_1_on_nats_with_its_lease(
    nats: Nats, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    broker = Broker(tmp_path, nats.port)  # only its url and port are used
    broker.url = nats.url
    announcement = encode_announcement(SPEC.to_dict(), min_batch=MIN_BATCH, delta=DELTA)
    rs = [reports(MIN_BATCH + 5 * i, 70 + i) for i in range(3)]

    async def scenario() -> Aggregator:
        await publish_311(nats.url, spec_topic(DEPLOYMENT), announcement, retain=True)
        fetched = await fetch_announcement(nats.url, DEPLOYMENT, timeout=20)
        assert fetched["min_batch"] == MIN_BATCH
        cfg = config(broker, tmp_path, mqtt_version="auto", lease_timeout=30)
        async with Aggregator(cfg) as agg:
            task = asyncio.create_task(agg.run())
            try:
                await until(agg.subscribed.is_set, 30)
                assert agg.session.version.current == "3.1.1"
                await publish_311(
                    nats.url,
                    batches_topic(DEPLOYMENT),
                    *(batch(r, 500 + i) for i, r in enumerate(rs)),
                )
                await until(lambda: agg.counters.batches == 3, 30, progress=moving(agg))
            finally:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
        return agg

    agg = asyncio.run(scenario())
    assert_same_estimates(agg, offline(*rs))
    messages = [r.getMessage() for r in caplog.records]
    assert any("does not speak MQTT 5; using MQTT 3.1.1" in m for m in messages)
    assert not any("without the lease" in m for m in messages)  # its claim came back

    async def forced_5() -> None:
        cfg = config(broker, None, mqtt_version="5")
        async with Aggregator(cfg) as agg:
            await agg.run()

    with pytest.raises(CocoError, match=r"refused MQTT 5 .* use --mqtt-version 3\.1\.1 or auto"):
        asyncio.run(asyncio.wait_for(forced_5(), 30))


def test_a_takeover_over_3_1_1_is_told_by_the_lease(mosquitto: Broker, tmp_path: Path) -> None:
    rs = [reports(MIN_BATCH + i, 80 + i) for i in range(2)]
    first_dir, second_dir = tmp_path / "first", tmp_path / "second"

    async def scenario() -> tuple[Aggregator, Aggregator, BaseException | None]:
        # no checkpoint before the takeover (as in test_single_writer.py): a PUBACK sent in
        # the instant the broker hands the session over is lost with the connection
        cfg = config(
            mosquitto,
            first_dir,
            mqtt_version="3.1.1",
            client_id="agg-311",
            checkpoint_interval=3600,
        )
        first = Aggregator(cfg)
        second = Aggregator(
            config(mosquitto, second_dir, mqtt_version="3.1.1", client_id="agg-311")
        )
        async with first:
            first_task = asyncio.create_task(first.run())
            await until(first.subscribed.is_set)
            await publish_311(mosquitto.url, batches_topic(DEPLOYMENT), batch(rs[0], 1))
            # its lease came back
            await until(lambda: first.counters.batches == 1, progress=moving(first))
            async with second:
                second_task = asyncio.create_task(second.run())
                done, _ = await asyncio.wait({first_task}, timeout=30)
                assert done == {first_task}
                error = first_task.exception()
                await until(second.subscribed.is_set, 20)
                await publish_311(mosquitto.url, batches_topic(DEPLOYMENT), batch(rs[1], 2))
                await until(
                    lambda: second.counters.batches >= 1 and second.state.n >= rs[1][0].size, 20
                )
                second_task.cancel()
                await asyncio.gather(second_task, return_exceptions=True)
        return first, second, error

    _, _, error = asyncio.run(scenario())
    assert isinstance(error, SessionTakenOverError)
    # each batch is in exactly one of the two checkpoints: what the first one had not
    # acknowledged was redelivered to the second
    held = []
    for directory in (first_dir, second_dir):
        path = directory / "ckpt.json"
        ids = load_checkpoint(path).batch_rounds.get(1, []) if path.exists() else []
        held.append({int.from_bytes(i, "big") for i in ids})
    assert held[0] | held[1] == {1, 2}
    assert not held[0] & held[1]
