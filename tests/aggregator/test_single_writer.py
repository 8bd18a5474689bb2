"""One writer per deployment, with real ``coco aggregator run`` processes and a real
Mosquitto: a second service on the same checkpoint refuses to start; a service whose MQTT
session is taken over stops instead of fighting for it; the trusted batch key comes from
``--batch-public-key`` (hex or file) or the announcement, and a disagreement is refused."""

from __future__ import annotations

import ast
import asyncio
import json
import re
import signal
import subprocess
import time
from pathlib import Path

import aiomqtt
import pytest
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.reasoncodes import ReasonCode

from aggregator.service.checkpoint_files import load_checkpoint
from aggregator.service.session import SESSION_TAKEN_OVER, session_taken_over
from edge.announce import encode_announcement
from edge.batch_auth import BatchSigner
from edge.topics import spec_topic
from tests.aggregator.test_service import (
    DELTA,
    DEPLOYMENT,
    MIN_BATCH,
    SIGNER,
    SPEC,
    batch,
    publish,
    reports,
)
from tests.conftest import Broker, free_port
from tests.processes import (
    COCO,
    ROOT,
    env,
    error_lines,
    estimates,
    service,
    started,
    stop,
    wait_running,
)

pytestmark = [pytest.mark.integration, pytest.mark.timeout(90)]


def coco_run(broker: Broker, tmp_path: Path, *args: str, spec: bool = True) -> list[str]:
    """``coco aggregator run`` against ``broker`` with ``args`` appended."""
    options = ["--broker", broker.url, "--deployment", DEPLOYMENT]
    if spec:
        spec_file = tmp_path / "spec.json"
        spec_file.write_text(json.dumps(SPEC.to_dict()))
        options += ["--spec", str(spec_file), "--delta", str(DELTA)]
        options += ["--min-batch", str(MIN_BATCH)]
    return [*COCO, "aggregator", "run", *options, *args]


def test_a_second_aggregator_on_the_same_checkpoint_refuses_to_start(
    mosquitto: Broker, tmp_path: Path
) -> None:
    checkpoint = tmp_path / "state" / "ckpt.json"
    key_file = tmp_path / "shuffler.pub"
    key_file.write_text(SIGNER.public_key_hex + "\n")
    key = ["--batch-public-key", str(key_file)]

    def aggregator(port: int, client_id: str) -> list[str]:
        return coco_run(
            mosquitto, tmp_path, *key, "--checkpoint", str(checkpoint),
            "--metrics-port", str(port), "--client-id", client_id,
        )  # fmt: skip

    first_port = free_port()
    with service(aggregator(first_port, "agg-one")) as first:
        started(first, first_port)
        second = subprocess.run(
            aggregator(free_port(), "agg-two"),
            check=False, cwd=ROOT, env=env(), capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert second.returncode == 1
        errors = error_lines(second.stderr)
        assert len(errors) == 1
        assert f"checkpoint {checkpoint} is in use by another aggregator" in errors[0]
        assert f"(pid {first.pid})" in errors[0]
        # the first one is unaffected and applies batches
        asyncio.run(publish(mosquitto, batch(reports(MIN_BATCH, 1), 1)))
        wait_running(lambda: (estimates(first_port) or {}).get("n") == MIN_BATCH, first)
        first.send_signal(signal.SIGKILL)  # a crashed holder leaves no stale lock
        first.communicate(timeout=20)

    third_port = free_port()
    with service(aggregator(third_port, "agg-one")) as third:
        # the crash came before any checkpoint: the broker redelivers the unacknowledged
        # batch to the session of the first one's account, and it is applied once
        started(third, third_port)
        wait_running(lambda: (estimates(third_port) or {}).get("n") == MIN_BATCH, third)
        rc, err = stop(third)
    assert rc == 0, err
    assert f"stopping: this run applied 1 batches ({MIN_BATCH} reports)" in err


def test_a_session_taken_over_stops_the_service_and_no_batch_counts_twice(
    mosquitto: Broker, tmp_path: Path
) -> None:
    """Two aggregators of one account, each with its own checkpoint: the second takes the
    session over, the first stops without checkpointing the batch it had not yet
    acknowledged, the broker redelivers that batch to the second, and every batch is in
    exactly one of the two states."""
    key = ["--batch-public-key", SIGNER.public_key_hex, "--client-id", "agg-shared"]
    first_port, second_port = free_port(), free_port()
    first_ckpt, second_ckpt = tmp_path / "first.json", tmp_path / "second.json"

    def aggregator(port: int, checkpoint: Path) -> list[str]:
        return coco_run(
            mosquitto, tmp_path, *key, "--metrics-port", str(port),
            "--checkpoint", str(checkpoint), "--checkpoint-interval", "3600",
        )  # fmt: skip

    rep1, rep2 = reports(MIN_BATCH, 2), reports(MIN_BATCH + 10, 3)
    with service(aggregator(first_port, first_ckpt)) as first:
        started(first, first_port)
        asyncio.run(publish(mosquitto, batch(rep1, 1)))
        wait_running(lambda: (estimates(first_port) or {}).get("n") == MIN_BATCH, first)
        with service(aggregator(second_port, second_ckpt)) as second:
            _, err = first.communicate(timeout=30)
            assert first.returncode == 1
            errors = error_lines(err)
            assert len(errors) == 1
            assert "took over this aggregator's MQTT session (agg-shared;" in errors[0]
            # the takeover closed the connection before the PUBACK; the lease told why, before
            # the connection ended (taken_over) or after it (connection_lost): on a loaded
            # machine either comes first, and the first one's reconnection may have taken the
            # session back once, the batch redelivered to it and left again
            left = re.search(r"left (\d+) batches unacknowledged (\{[^}]*\})", err)
            assert left is not None, err
            by_reason = ast.literal_eval(left[2])
            assert set(by_reason) <= {"connection_lost", "taken_over"}, err
            assert sum(by_reason.values()) == int(left[1]) in (1, 2), err
            assert "no final checkpoint" in err
            started(second, second_port)
            # the newcomer holds the session alone: the batch the first one left, then a
            # new one and a replay of it, each once. (The first one's last reconnection may
            # have cut the newcomer off once after it applied the first batch: then that
            # batch came back too, a second duplicate, also ignored.)
            asyncio.run(publish(mosquitto, batch(rep2, 2), batch(rep2, 2)))

            def both_seen() -> bool:
                document = estimates(second_port) or {}
                duplicates = document.get("counters", {}).get("duplicates", 0)
                return document.get("n") == 2 * MIN_BATCH + 10 and duplicates in (1, 2)

            wait_running(both_seen, second)
            time.sleep(1.0)  # a reconnecting first service would take the session back here
            assert second.poll() is None
            document = estimates(second_port)
            assert document is not None
            assert document["n"] == 2 * MIN_BATCH + 10
            rc, err = stop(second)
    assert rc == 0, err
    assert "stopping: this run applied 2 batches" in err
    assert not first_ckpt.exists()  # the first one never checkpointed: nothing counted twice
    assert load_checkpoint(second_ckpt).state.n == 2 * MIN_BATCH + 10


async def announce(broker: Broker, key: str | None) -> None:
    payload = encode_announcement(
        SPEC.to_dict(), min_batch=MIN_BATCH, delta=DELTA, batch_public_key=key
    )
    async with asyncio.timeout(10), aiomqtt.Client("127.0.0.1", broker.port) as client:
        await client.publish(spec_topic(DEPLOYMENT), payload, qos=1, retain=True)


def test_the_batch_key_comes_from_the_option_or_the_announcement(
    mosquitto: Broker, tmp_path: Path
) -> None:
    def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            coco_run(mosquitto, tmp_path, "--metrics-port", str(port), *args, spec=False),
            check=False, cwd=ROOT, env=env(), capture_output=True, text=True, timeout=60,
        )  # fmt: skip

    port = free_port()
    asyncio.run(announce(mosquitto, None))
    neither = run_cli()
    assert neither.returncode == 1
    assert error_lines(neither.stderr) == [
        "error: no batch public key: give --batch-public-key (the shuffler's Ed25519 public "
        "key, 64 hex digits or a file holding them) or announce batch_public_key"
    ]

    asyncio.run(announce(mosquitto, SIGNER.public_key_hex))
    other = BatchSigner.generate(DEPLOYMENT).public_key_hex
    differ = run_cli("--batch-public-key", other)
    assert differ.returncode == 1
    errors = error_lines(differ.stderr)
    assert len(errors) == 1
    assert "differs from the announced batch_public_key" in errors[0]

    bad = run_cli("--batch-public-key", str(tmp_path / "missing.pub"))
    assert bad.returncode == 1
    assert "--batch-public-key is neither 64 hex digits nor a readable file" in bad.stderr

    with service(
        coco_run(mosquitto, tmp_path, "--metrics-port", str(port), spec=False)
    ) as announced:
        started(announced, port)
        asyncio.run(publish(mosquitto, batch(reports(MIN_BATCH, 3), 1)))
        wait_running(lambda: (estimates(port) or {}).get("n") == MIN_BATCH, announced)
        rc, err = stop(announced)
    assert rc == 0, err


def test_a_disconnect_with_reason_0x8e_is_told_from_a_lost_connection() -> None:
    """Brokers that send DISCONNECT 0x8E (Mosquitto's own tests expect it; the 2.0.11 here
    only closes the socket, hence the lease) stop the service at once."""
    taken = ReasonCode(PacketTypes.DISCONNECT, identifier=SESSION_TAKEN_OVER)
    lost = ReasonCode(PacketTypes.DISCONNECT, identifier=0x80)
    for cause, expected in ((taken, True), (lost, False)):
        outer = aiomqtt.MqttError("Disconnected during message iteration")
        outer.__cause__ = aiomqtt.MqttCodeError(cause, "Unexpected disconnection")
        assert session_taken_over(outer) is expected
