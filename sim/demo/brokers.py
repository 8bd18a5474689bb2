"""Which broker a demo run uses: ``config.broker`` > a local Mosquitto > the embedded amqtt
broker (:func:`a_broker`).

With no broker URL, a local Mosquitto (``/usr/sbin/mosquitto`` or ``mosquitto`` on ``PATH``)
is started on a free port from a temporary config (listener on 127.0.0.1, anonymous, no
persistence, a large queue). Without that binary (or with ``embedded_broker=True``) the
pure-Python :class:`~sim.demo.embedded_broker.EmbeddedBroker` (amqtt) runs instead: MQTT
3.1.1 only and about 1.5k messages/s, so the services speak MQTT 3.1.1 there and, unless the
fleet size was given, the fleet shrinks to :data:`EMBEDDED_DEFAULT_DEVICES`.
"""

from __future__ import annotations

import contextlib
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, replace
from pathlib import Path

from sim.demo.config import DemoConfig, DemoError, expected_low, progress
from sim.demo.embedded_broker import EmbeddedBroker, EmbeddedBrokerError

__all__ = [
    "EMBEDDED_BROKER_KIND",
    "EMBEDDED_DEFAULT_DEVICES",
    "Broker",
    "a_broker",
    "find_mosquitto",
    "local_mosquitto",
]

EMBEDDED_DEFAULT_DEVICES = 1000
"""Fleet size on the embedded broker when none was given: 3 rounds take a few seconds."""
EMBEDDED_BROKER_KIND = "embedded amqtt (MQTT 3.1.1, fallback for small fleets)"


@dataclass(frozen=True, kw_only=True)
class Broker:
    """The broker of a run, while :func:`a_broker` keeps it up."""

    url: str
    kind: str
    """What it is, for the progress line and the result document."""
    mqtt5: bool
    """Whether the services may speak MQTT 5 to it (the embedded broker does not)."""
    config: DemoConfig
    """The run's config, with the fleet reduced for the embedded broker when it was not given."""
    note: str | None = None
    """Why the fleet was reduced, if it was."""


def find_mosquitto() -> str | None:
    """Path of a Mosquitto binary, or ``None``."""
    if Path("/usr/sbin/mosquitto").exists():
        return "/usr/sbin/mosquitto"
    return shutil.which("mosquitto")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@contextlib.contextmanager
def local_mosquitto(binary: str) -> Iterator[str]:
    """A throw-away Mosquitto on 127.0.0.1 at a free port; yields its ``mqtt://`` URL."""
    with tempfile.TemporaryDirectory(prefix="coco-demo-") as tmp:
        port = _free_port()
        conf = Path(tmp) / "mosquitto.conf"
        log = Path(tmp) / "mosquitto.log"
        conf.write_text(
            f"listener {port} 127.0.0.1\nallow_anonymous true\npersistence false\n"
            f"max_queued_messages 1000000\nlog_dest file {log}\n"
        )
        proc = subprocess.Popen(
            [binary, "-c", str(conf)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        try:
            deadline = time.monotonic() + 10
            while True:
                try:
                    with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                        break
                except OSError:
                    if proc.poll() is not None or time.monotonic() > deadline:
                        text = log.read_text() if log.exists() else ""
                        raise DemoError(f"mosquitto did not start: {text.strip()}") from None
                    time.sleep(0.05)
            yield f"mqtt://127.0.0.1:{port}"
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def embedded_config(config: DemoConfig) -> tuple[DemoConfig, str | None]:
    """The config for the embedded broker, and a note when the fleet was reduced."""
    if not config.auto_devices or config.devices <= EMBEDDED_DEFAULT_DEVICES:
        return config, None
    devices = EMBEDDED_DEFAULT_DEVICES
    reduced = replace(
        config,
        devices=devices,
        min_batch=min(config.min_batch, expected_low(devices, config.participation)),
        release_size=None if config.release_size is None else min(config.release_size, devices),
    )
    note = (
        f"fleet reduced from {config.devices} to {devices} devices for the embedded broker "
        f"(about 1.5k messages/s); pass --devices to choose, or install mosquitto"
    )
    return reduced, note


@contextlib.asynccontextmanager
async def a_broker(config: DemoConfig) -> AsyncIterator[Broker]:
    """The run's broker, up while the block runs: ``config.broker`` > a local Mosquitto > the
    embedded amqtt broker. A failure of the embedded broker, also one raised in the block, is
    a :class:`~sim.demo.config.DemoError` that says how to get a broker."""
    if config.broker is not None:
        yield Broker(url=config.broker, kind="external", mqtt5=True, config=config)
        return
    binary = None if config.embedded_broker else find_mosquitto()
    if binary is not None:
        with local_mosquitto(binary) as url:
            yield Broker(url=url, kind=f"local mosquitto ({binary})", mqtt5=True, config=config)
        return
    config, note = embedded_config(config)
    if note is not None:
        progress(config.progress, note)
    try:
        broker = EmbeddedBroker()
        async with broker:
            yield Broker(
                url=broker.url, kind=EMBEDDED_BROKER_KIND, mqtt5=False, config=config, note=note
            )
    except EmbeddedBrokerError as exc:
        raise DemoError(
            f"no broker: mosquitto is not installed (apt-get install mosquitto), no --broker "
            f"mqtt://host:port was given and the embedded broker failed: {exc}"
        ) from exc
