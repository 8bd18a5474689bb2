"""Negotiating the MQTT protocol version (edge/mqtt_version.py)."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import subprocess
from pathlib import Path

import pytest

from edge.mqtt_version import (
    VersionChoice,
    check_mqtt_version,
    is_version_refusal,
    negotiate,
    probe,
)
from tests import waiting
from tests.clusters import NATS_SERVER
from tests.conftest import Broker, free_port


class _ReasonCode:
    def __init__(self, value: int) -> None:
        self.value = value


def test_refusal_codes() -> None:
    assert is_version_refusal(0x84)
    assert is_version_refusal(1)
    assert is_version_refusal(_ReasonCode(0x84))
    for other in (0, 0x80, 0x86, 0x87, 5, None, "0x84"):
        assert not is_version_refusal(other)


def test_auto_falls_back_once_and_stays() -> None:
    choice = VersionChoice("auto")
    assert choice.current == "5"
    assert choice.mqtt5
    assert choice.refused() is True
    assert str(choice.current) == "3.1.1"
    assert not choice.mqtt5
    assert choice.refused() is False  # 3.1.1 refused too: final
    assert choice.current == "3.1.1"


@pytest.mark.parametrize("requested", ["5", "3.1.1"])
def test_an_explicit_version_is_never_changed(requested: str) -> None:
    choice = VersionChoice(check_mqtt_version(requested), broker="mqtt://x:1")
    assert choice.current == requested
    assert choice.refused() is False
    assert choice.current == requested
    assert "mqtt://x:1" in choice.describe_refusal()


def test_unknown_versions_are_refused() -> None:
    for bad in ("4", "3", "v5", "", "AUTO"):
        with pytest.raises(ValueError, match="--mqtt-version"):
            check_mqtt_version(bad)


# --- against real brokers -------------------------------------------------------------------


def _nats_mqtt(tmp_path: Path) -> tuple[subprocess.Popen[bytes], int]:
    """A single NATS server with JetStream and its MQTT listener (MQTT 3.1.1 only)."""
    port, client_port = free_port(), free_port()
    config = tmp_path / "nats.conf"
    config.write_text(
        f"listen: 127.0.0.1:{client_port}\nserver_name: probe\n"
        f"jetstream {{ store_dir: {tmp_path / 'js'} }}\n"
        f"mqtt {{ listen: 127.0.0.1:{port} }}\n"
    )
    proc = subprocess.Popen(
        [NATS_SERVER, "-c", str(config)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )

    def listening() -> bool:
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.2):
            return True
        return False

    try:  # its progress: the CPU time it spends starting (tests/waiting.py)
        waiting.wait_until(
            listening, progress=lambda: waiting.cpu_seconds(proc.pid), stall=30, interval=0.05
        )
    except waiting.StalledError:
        proc.kill()
        pytest.fail("nats-server did not open its MQTT listener")
    return proc, port


@pytest.mark.integration
@pytest.mark.skipif(not Path(NATS_SERVER).exists(), reason="nats-server is not installed")
def test_probe_tells_a_311_only_broker_from_an_mqtt5_one(tmp_path: Path, mosquitto: Broker) -> None:
    proc, port = _nats_mqtt(tmp_path)
    try:
        assert asyncio.run(probe("127.0.0.1", port)) == "3.1.1"
        assert asyncio.run(negotiate("auto", "127.0.0.1", port)) == "3.1.1"
        assert asyncio.run(negotiate("5", "127.0.0.1", port)) == "5"  # as asked, unprobed
    finally:
        proc.kill()
        proc.wait()
    assert asyncio.run(probe("127.0.0.1", mosquitto.port)) == "5"
    assert asyncio.run(negotiate("auto", "127.0.0.1", mosquitto.port)) == "5"


def test_probe_of_a_closed_port_raises() -> None:
    with pytest.raises(ConnectionRefusedError):
        asyncio.run(probe("127.0.0.1", free_port(), timeout=5))
