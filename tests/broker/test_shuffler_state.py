"""The shuffler's state under operation, against a real Mosquitto: readiness (an HTTP
endpoint and a gauge, false until the state is recovered and the ingest subscribed; no
zeros served before recovery), a full disk (acknowledgements pause and are retried, and
once space returns nothing is lost or doubled: a real, small tmpfs filled and freed), and
the signing key (never created by accident, refused when it is not the announced one)."""

from __future__ import annotations

import asyncio
import json
import logging
import math
import subprocess
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import aiomqtt
import pytest
from prometheus_client import CollectorRegistry
from typer.testing import CliRunner

from broker.service.keys import SigningKeyError, load_signer
from broker.service.metrics import serve_http
from broker.service.shuffler import Shuffler
from edge.batch_auth import BatchSigner, BatchVerifier, load_or_create_signing_key, public_key_hex
from edge.codec import decode_batch, decode_manifest
from edge.errors import CocoError
from edge.rounds import current_round
from edge.topics import batches_topic, manifests_topic
from sim.cli import app
from tests.broker.test_shuffler import (
    SPEC,
    config,
    publish,
    report,
    run,
    running,
    value,
    wait_until,
)
from tests.broker.test_store import fill
from tests.clusters import NATS_SERVER
from tests.conftest import Broker, free_port
from tests.edge.test_mqtt_version import _nats_mqtt
from tests.ports import busy_port
from tests.processes import COCO, ROOT, env, error_lines

pytestmark = pytest.mark.integration


def ready(port: int) -> int:
    return ready_answer(port)[0]


def ready_answer(port: int) -> tuple[int, str]:
    """``GET /ready``: its status and body."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/ready", timeout=5) as response:
            return int(response.status), response.read().decode()
    except urllib.error.HTTPError as exc:
        with exc:
            return exc.code, exc.read().decode()


def test_readiness_only_once_recovered_and_subscribed(mosquitto: Broker, tmp_path: Path) -> None:
    registry = CollectorRegistry()
    port = free_port()
    server = serve_http(port, registry, "127.0.0.1")
    cfg = config(mosquitto, state_dir=tmp_path / "state", round_seconds=60)

    async def scenario() -> None:
        async with running(cfg, CollectorRegistry()) as first:
            await publish(mosquitto, [(f"r{i}", report(current_round(60), i)) for i in range(7)])
            await wait_until(lambda: first.buffered == 7, progress=lambda: first.buffered)
        shuffler = Shuffler(cfg, registry=registry)
        # before recovery: not ready, and the pool gauges are not zeros
        assert await asyncio.to_thread(ready, port) == 503
        assert value(registry, "coco_shuffler_ready") == 0
        assert math.isnan(registry.get_sample_value("coco_shuffler_buffer_reports") or 0.0)
        assert math.isnan(registry.get_sample_value("coco_shuffler_outbox_reports") or 0.0)
        # not "nothing recovered" either
        assert math.isnan(registry.get_sample_value("coco_shuffler_recovered_reports") or 0.0)
        assert await asyncio.to_thread(ready_answer, port) == (
            503,
            "not ready: recovering the state\n",
        )
        async with shuffler:
            assert value(registry, "coco_shuffler_buffer_reports") == 7  # recovered
            assert value(registry, "coco_shuffler_recovered_reports") == 7
            assert await asyncio.to_thread(ready, port) == 503  # not subscribed yet
            task = asyncio.create_task(shuffler.run())
            await wait_until(
                lambda: value(registry, "coco_shuffler_ready") == 1,
                progress=lambda: value(registry, "coco_shuffler_ready"),
            )
            assert await asyncio.to_thread(ready, port) == 200
            shuffler.stop()
            await task
        assert value(registry, "coco_shuffler_ready") == 0
        assert await asyncio.to_thread(ready, port) == 503

    try:
        run(scenario(), 60)
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
def small_fs(tmp_path: Path) -> Iterator[Path]:
    """A real 1 MiB tmpfs (root only), unmounted at the end."""
    mount = tmp_path / "small"
    mount.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mount)],
        check=False,
        capture_output=True,
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.decode().strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def test_a_full_disk_pauses_acknowledgements_and_loses_or_doubles_nothing(
    mosquitto: Broker, small_fs: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The state directory's disk fills while reports stream in: the shuffler does not
    exit; it stops acknowledging (an ERROR line, ``coco_shuffler_log_paused`` 1, not
    ready), and once space is freed it resumes: every report published is accepted once,
    none twice, none lost (the broker kept what was not acknowledged)."""
    caplog.set_level(logging.INFO)
    registry = CollectorRegistry()
    port = free_port()
    server = serve_http(port, registry, "127.0.0.1")
    cfg = config(mosquitto, state_dir=small_fs / "state", round_seconds=60, min_batch=5)

    def accepted() -> float:
        return value(registry, "coco_shuffler_reports_accepted_total")

    async def scenario() -> None:
        async with running(cfg, CollectorRegistry()):
            pass  # the persistent session exists from here on
        round_ = current_round(60)
        async with running(cfg, registry) as shuffler:
            await publish(mosquitto, [(f"a{i}", report(round_, i)) for i in range(50)])
            await wait_until(lambda: accepted() == 50, progress=accepted)
            filler = fill(small_fs)
            publisher = asyncio.create_task(
                publish(mosquitto, [(f"b{i}", report(round_, 100 + i)) for i in range(400)])
            )
            await wait_until(
                lambda: value(registry, "coco_shuffler_log_paused") == 1,
                30,
                progress=lambda: value(registry, "coco_shuffler_log_paused"),
            )
            assert value(registry, "coco_shuffler_ready") == 0
            assert await asyncio.to_thread(ready_answer, port) == (
                503,
                "not ready: the state directory's disk is full: acknowledgements paused, "
                "retrying\n",
            )
            assert shuffler.failure is None  # paused, not stopped
            await asyncio.sleep(1.0)
            assert value(registry, "coco_shuffler_log_paused") == 1  # still retrying
            filler.unlink()
            await publisher
            await wait_until(lambda: accepted() == 450, 30, progress=accepted)
            await wait_until(
                lambda: value(registry, "coco_shuffler_ready") == 1,
                progress=lambda: value(registry, "coco_shuffler_ready"),
            )
            assert await asyncio.to_thread(ready, port) == 200
            assert value(registry, "coco_shuffler_log_paused") == 0
            await asyncio.sleep(0.5)  # anything delivered twice would be counted by now
            assert accepted() == 450
            assert shuffler.buffered == 450
            rejected = value(
                registry, "coco_shuffler_reports_rejected_total", reason="duplicate_in_round"
            )
            assert rejected == 0
            assert value(registry, "coco_shuffler_log_full_total") >= 1
        async with running(cfg, CollectorRegistry()) as again:
            assert again.buffered == 450  # all of it in the log

    try:
        run(scenario(), 120)
    finally:
        server.shutdown()
        server.server_close()
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert any("acknowledgements paused" in line for line in errors)
    assert any("writable again" in line for line in errors)


def test_a_shuffler_started_on_a_full_disk_names_the_file_in_one_line(
    mosquitto: Broker, small_fs: Path, tmp_path: Path
) -> None:
    """Exit 1 and one ``error:`` line naming the file; no short key file left behind
    (the next start, with space, would refuse it)."""
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps(SPEC.to_dict()))
    state = small_fs / "state"
    args = [*COCO, "shuffler", "--deployment", "test", "--broker", mosquitto.url]
    args += ["--spec", str(spec), "--min-batch", "10", "--round-seconds", "60"]
    args += ["--state-dir", str(state), "--signing-key", str(tmp_path / "signing.key")]
    args += ["--create-signing-key"]
    filler = fill(small_fs)
    done = subprocess.run(
        args, check=False, cwd=ROOT, env=env(), capture_output=True, text=True, timeout=60
    )
    filler.unlink()
    assert done.returncode == 1
    assert error_lines(done.stderr) == [
        f"error: cannot write {state / 'token.key'}: No space left on device"
    ]
    assert "Traceback" not in done.stderr
    assert not (state / "token.key").exists()


def test_a_signing_key_is_never_created_by_a_typo_and_must_be_the_announced_one(
    mosquitto: Broker, tmp_path: Path
) -> None:
    key = tmp_path / "keys" / "signing.key"
    announced = public_key_hex(load_or_create_signing_key(key))
    typo = tmp_path / "keys" / "signing.kye"
    cfg = config(mosquitto, state_dir=tmp_path / "state", create_signing_key=False)

    async def open_with(**overrides: object) -> None:
        settings = {**cfg.__dict__, **overrides}
        async with Shuffler(type(cfg)(**settings), registry=CollectorRegistry()):
            pass

    with pytest.raises(SigningKeyError, match=rf"{typo} does not exist.*coco credentials"):
        run(open_with(signing_key=typo))
    assert not typo.exists()
    assert not (tmp_path / "state").exists()  # refused before anything was created
    other = BatchSigner.generate("testdep").public_key_hex
    with pytest.raises(SigningKeyError, match=rf"{key} has public key {announced}.*{other}"):
        run(open_with(signing_key=key, announced_public_key=other))
    run(open_with(signing_key=key, announced_public_key=announced))  # the right one: runs
    run(open_with(signing_key=typo, create_signing_key=True))  # explicitly: created
    assert typo.exists()


@pytest.mark.skipif(not Path(NATS_SERVER).exists(), reason="nats-server is not installed")
def test_auto_speaks_mqtt_311_to_a_broker_without_5_and_keeps_its_session(
    tmp_path: Path,
) -> None:
    """NATS's MQTT listener speaks only 3.1.1: ``auto`` finds that, the ingest keeps a
    persistent session (``clean_session=0``: reports published while the shuffler is away
    wait for it), and a replay after a restart is a duplicate."""
    proc, port = _nats_mqtt(tmp_path)
    nats = Broker(tmp_path, port)  # only its url and port are used: the process is NATS's
    registry = CollectorRegistry()
    cfg = config(nats, state_dir=tmp_path / "state", round_seconds=60, min_batch=5)
    assert cfg.mqtt_version == "auto"

    async def scenario() -> None:
        async with running(cfg, CollectorRegistry()) as first:
            assert first._version == "3.1.1"
        round_ = current_round(60)
        reports = [(f"n{i}", report(round_, i)) for i in range(6)]
        await publish(nats, reports)  # the shuffler is away: its session keeps them
        async with running(cfg, registry) as again:
            await wait_until(lambda: again.buffered == 6, 30, progress=lambda: again.buffered)
            await publish(nats, reports[:2])  # replays
            await wait_until(
                lambda: (
                    value(
                        registry,
                        "coco_shuffler_reports_rejected_total",
                        reason="duplicate_in_round",
                    )
                    == 2
                ),
                30,
            )
            assert again.buffered == 6

    try:
        run(scenario(), 90)
    finally:
        proc.terminate()
        proc.wait(10)


def test_a_new_round_seconds_between_runs_keeps_accepting(
    mosquitto: Broker, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Issue 19: round_seconds 2 -> 5 between runs used to reject every report as
    round_too_old (the closed round was kept in the old units). Now the closed rounds are
    a time: the new run accepts the current 5-s round's reports and releases them."""
    caplog.set_level(logging.WARNING)
    registry = CollectorRegistry()
    state = tmp_path / "state"

    async def scenario() -> None:
        async with running(config(mosquitto, state_dir=state, round_seconds=2), registry) as s:
            round_ = current_round(2)
            await publish(mosquitto, [(f"o{i}", report(round_, i)) for i in range(5)])
            await wait_until(
                lambda: value(registry, "coco_shuffler_reports_released_total") == 5,
                progress=lambda: value(registry, "coco_shuffler_reports_released_total"),
            )
            assert s.core.closed >= (round_ + 1) * 2
        again = CollectorRegistry()
        async with running(config(mosquitto, state_dir=state, round_seconds=5), again) as s:
            round_ = current_round(5)
            await publish(mosquitto, [(f"p{i}", report(round_, 10 + i)) for i in range(5)])
            await wait_until(
                lambda: value(again, "coco_shuffler_reports_accepted_total") == 5,
                progress=lambda: value(again, "coco_shuffler_reports_accepted_total"),
            )
            assert value(again, "coco_shuffler_reports_rejected_total", reason="round_too_old") == 0
            await wait_until(
                lambda: value(again, "coco_shuffler_reports_released_total") == 5,
                30,
                progress=lambda: value(again, "coco_shuffler_reports_released_total"),
            )

    run(scenario(), 90)
    assert any("renumbered" in r.getMessage() for r in caplog.records)


def test_a_signed_manifest_follows_each_release(mosquitto: Broker) -> None:
    """One manifest per release on ``coco/v1/<dep>/manifests``, signed like a batch, after
    the release's batches, listing each batch id with its count."""
    signer = BatchSigner.generate("testdep")
    verifier = BatchVerifier(signer.public_key_hex, "testdep")
    arrivals: list[tuple[str, bytes]] = []

    async def scenario() -> None:
        async with aiomqtt.Client("127.0.0.1", mosquitto.port) as client:
            await client.subscribe(batches_topic("testdep"), qos=1)
            await client.subscribe(manifests_topic("testdep"), qos=1)

            async def collect() -> None:
                async for message in client.messages:
                    payload = message.payload
                    assert isinstance(payload, bytes)
                    arrivals.append((str(message.topic), payload))

            task = asyncio.create_task(collect())
            cfg = config(mosquitto, signer=signer, min_batch=5, max_batch=10, round_seconds=2)
            async with running(cfg, CollectorRegistry()):
                round_ = current_round(2)
                await publish(mosquitto, [(f"m{i}", report(round_, i)) for i in range(23)])
                await wait_until(lambda: len(arrivals) == 4, 30, progress=lambda: len(arrivals))
            task.cancel()

    run(scenario(), 60)
    topics = [topic for topic, _ in arrivals]
    assert topics == [batches_topic("testdep")] * 3 + [manifests_topic("testdep")]
    batches = [decode_batch(bytes(verifier.open(payload))) for _, payload in arrivals[:3]]
    fingerprint, round_, _release, entries, sources = decode_manifest(
        bytes(verifier.open_manifest(arrivals[3][1]))
    )
    assert fingerprint == batches[0][0]
    assert round_ == batches[0][1]
    assert entries == [(b[2], len(b[3])) for b in batches]
    assert sum(count for _, count in entries) == 23
    assert sum(count for _, _, count in sources) == 23


def test_the_hold_ends_once_per_subscription(mosquitto: Broker) -> None:
    """Rounds are held while not subscribed and until the backlog drained after a
    subscription; after that, a late report (a lagging device clock) holds nothing back."""
    import time as clock  # noqa: PLC0415

    shuffler = Shuffler(config(mosquitto, backlog_quiet=0.2), registry=CollectorRegistry())
    assert shuffler._holding()  # not subscribed
    shuffler._connected.set()
    shuffler._subscribed_at = clock.monotonic()
    assert shuffler._holding()  # the backlog may still be arriving
    shuffler._last_late = clock.monotonic()
    assert shuffler._holding()
    clock.sleep(0.25)
    assert not shuffler._holding()  # quiet: drained
    shuffler._last_late = clock.monotonic()  # a late report now holds nothing
    assert not shuffler._holding()
    shuffler._connected.clear()  # lost: held again until the next backlog drained
    assert shuffler._holding()
    shuffler._connected.set()
    shuffler._subscribed_at = clock.monotonic()
    assert shuffler._holding()


def test_the_shuffler_exports_mosquitto_s_loss_counters(tmp_path: Path) -> None:
    """With ``broker_stats`` (the CLI's default) the shuffler's /metrics carries Mosquitto's
    ``$SYS`` counters, the dropped-message one included (broker/service/broker_stats.py)."""
    broker = Broker(tmp_path, free_port(), extra_config="sys_interval 1\n")
    broker.start()
    registry = CollectorRegistry()

    async def scenario() -> None:
        async with running(config(broker, broker_stats=True), registry):
            await wait_until(
                lambda: (
                    registry.get_sample_value("coco_mosquitto_publish_messages_dropped_total")
                    is not None
                ),
                30,
            )

    try:
        run(scenario(), 60)
    finally:
        broker.stop()
    assert registry.get_sample_value("coco_mosquitto_publish_messages_dropped_total") == 0
    assert registry.get_sample_value("coco_mosquitto_uptime_seconds") is not None


def test_a_busy_metrics_port_names_the_port_and_the_option(tmp_path: Path) -> None:
    """Issue 25: "[Errno 98] Address already in use", without the port or the option (the
    aggregator's wording now)."""
    spec_file = tmp_path / "spec.json"
    spec_file.write_text(json.dumps(SPEC.to_dict()))
    with busy_port() as port:  # on 127.0.0.1, where the shuffler listens by default
        result = CliRunner().invoke(
            app,
            [
                *("shuffler", "--deployment", "busy", "--spec", str(spec_file)),
                *("--round-seconds", "60", "--min-batch", "2"),
                *("--state-dir", str(tmp_path / "state"), "--metrics-port", str(port)),
                *("--broker", f"mqtt://127.0.0.1:{free_port()}"),  # never reached
            ],
        )
    assert result.exit_code == 1, result.output
    assert result.stderr.strip().splitlines() == [
        f"error: port {port} on 127.0.0.1 is in use: choose another with --metrics-port "
        "(COCO_METRICS_PORT)"
    ]


def test_a_binary_signing_key_is_not_a_key_file(tmp_path: Path) -> None:
    """Issue 25: a binary --signing-key said "'ascii' codec can't decode byte 0x8a"."""
    key = tmp_path / "signing.key"
    key.write_bytes(bytes([0x8A, 0x00, 0xFF]) * 20)
    with pytest.raises(CocoError, match=rf"^{key} is not a signing key file: .*binary"):
        load_signer(key, "testdep")
