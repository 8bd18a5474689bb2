"""Shared fixtures: a real Mosquitto broker per test, on a free port, that tests can stop and
restart (integration tests never use a broker they did not start): open, persistent, or the
shipped deploy/mosquitto/mosquitto.conf with its dynamic-security plugin
(:func:`shipped_broker`); ``nats_cluster``, a 3-node NATS cluster with JetStream and MQTT
listeners (tests/clusters.py)."""

from __future__ import annotations

import getpass
import shutil
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests import waiting
from tests.clusters import nats_cluster
from tests.ports import free_port

__all__ = [
    "IMAGE_PLUGIN",
    "MOSQUITTO",
    "PLUGIN",
    "SHIPPED_CONFIG",
    "Broker",
    "adapted_config",
    "free_port",
    "nats_cluster",
    "persistent_broker",
    "shipped_broker",
]

MOSQUITTO = shutil.which("mosquitto") or "/usr/sbin/mosquitto"

BROKER_FIXTURES = frozenset(
    {
        "mosquitto",
        "mosquitto_persistent",
        "mosquitto_client_id_acl",
        "shipped_broker",
        "small_queue_broker",
        "broker_nodelay",
        "nats",
        "nats_cluster",
        "quick_redelivery_cluster",
        "cluster",
    }
)
"""Fixtures that start a real broker: a test using one is an integration test."""


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """A test that starts a real broker is marked ``integration`` (pyproject's marker) whether
    or not its module says so, before ``-m`` selects: scripts/test runs the integration tests
    at normal priority and the rest beside them at a lower one."""
    for item in items:
        if BROKER_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.integration)


class Broker:
    """A Mosquitto process listening on 127.0.0.1:``port`` with anonymous access."""

    def __init__(self, workdir: Path, port: int, extra_config: str = "") -> None:
        self.port = port
        self.url = f"mqtt://127.0.0.1:{port}"
        self.config = workdir / "mosquitto.conf"
        self.log = workdir / "mosquitto.log"
        self.config.write_text(
            # `user`: started as root, Mosquitto would drop to the `mosquitto` user, which
            # cannot write the log (or a persistence store) into pytest's private tmp_path.
            f"user {getpass.getuser()}\n"
            f"listener {port} 127.0.0.1\nallow_anonymous true\npersistence false\n"
            f"max_queued_messages 100000\nlog_dest file {self.log}\n{extra_config}"
        )
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.proc = subprocess.Popen(
            [MOSQUITTO, "-c", str(self.config)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        proc = self.proc

        def listening() -> bool:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2):
                    return True
            except OSError:
                if proc.poll() is not None:
                    raise RuntimeError(f"mosquitto exited: {self.log.read_text()}") from None
                return False

        # its progress: the CPU time it spends starting (tests/waiting.py)
        waiting.wait_until(
            listening,
            progress=lambda: waiting.cpu_seconds(proc.pid),
            stall=10,
            what=f"mosquitto listening on {self.port}",
            interval=0.05,
        )

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None

    def kill(self) -> None:
        """``kill -9``: no final save of a persistence store, no DISCONNECT to anyone."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self.proc = None

    def restart(self) -> None:
        self.stop()
        self.start()


SHIPPED_CONFIG = Path(__file__).resolve().parents[1] / "deploy" / "mosquitto" / "mosquitto.conf"
"""The Mosquitto configuration deployed (compose.yaml), which :func:`adapted_config` adapts."""
IMAGE_PLUGIN = "/usr/lib/mosquitto_dynamic_security.so"  # in eclipse-mosquitto:2
PLUGIN = next(
    (
        path
        for path in (
            Path(IMAGE_PLUGIN),
            *sorted(Path("/usr/lib").glob("*/mosquitto_dynamic_security.so")),  # Debian
        )
        if path.exists()
    ),
    None,
)


def adapted_config(port: int, plugin: Path, dynsec: Path, store: Path, log: Path) -> str:
    """deploy/mosquitto/mosquitto.conf with this test's listener, plugin, paths and log."""
    replaced = {"listener", "plugin", "plugin_opt_config_file", "persistence_location", "log_dest"}
    kept = [
        line
        for line in SHIPPED_CONFIG.read_text().splitlines()
        if line.split(" ", 1)[0] not in replaced
    ]
    return "\n".join(
        [
            f"user {getpass.getuser()}",  # as in Broker: no privilege drop
            *kept,
            f"listener {port} 127.0.0.1",
            f"plugin {plugin}",
            f"plugin_opt_config_file {dynsec}",
            f"persistence_location {store}/",
            f"log_dest file {log}",
            "",
        ]
    )


def shipped_broker(workdir: Path, plugin: Path, dynsec: Path, extra_config: str = "") -> Broker:
    """A (not yet started) Mosquitto running :func:`adapted_config` on a free port, then
    ``extra_config`` (later lines win)."""
    store = workdir / "store"
    store.mkdir()
    broker = Broker(workdir, free_port())
    config = adapted_config(broker.port, plugin, dynsec, store, broker.log)
    broker.config.write_text(config + extra_config)
    return broker


def persistent_broker(workdir: Path) -> Broker:
    """A (not yet started) Mosquitto that keeps sessions, subscriptions and queued QoS 1
    messages across :meth:`Broker.restart` (``persistence true``, saved on shutdown and
    every second)."""
    store = workdir / "mosquitto-store"
    store.mkdir()
    # Later lines win in Mosquitto's config, so this overrides the base `persistence false`.
    return Broker(
        workdir,
        free_port(),
        extra_config=(f"persistence true\npersistence_location {store}/\nautosave_interval 1\n"),
    )


@pytest.fixture
def mosquitto(tmp_path: Path) -> Iterator[Broker]:
    """A fresh Mosquitto on a free port; stopped at the end of the test."""
    if not Path(MOSQUITTO).exists():
        pytest.skip("mosquitto is not installed (apt-get install mosquitto)")
    broker = Broker(tmp_path, free_port())
    broker.start()
    try:
        yield broker
    finally:
        broker.stop()


@pytest.fixture
def mosquitto_persistent(tmp_path: Path) -> Iterator[Broker]:
    """:func:`persistent_broker`, started."""
    if not Path(MOSQUITTO).exists():
        pytest.skip("mosquitto is not installed (apt-get install mosquitto)")
    broker = persistent_broker(tmp_path)
    broker.start()
    try:
        yield broker
    finally:
        broker.stop()


@pytest.fixture
def mosquitto_client_id_acl(tmp_path: Path) -> Iterator[Broker]:
    """A Mosquitto whose ACL lets a client write only ``coco/v1/+/ingress/<its client id>``
    (``%c``) and read the spec topics: a publish succeeds only if the client id is the
    device id of the topic."""
    if not Path(MOSQUITTO).exists():
        pytest.skip("mosquitto is not installed (apt-get install mosquitto)")
    acl = tmp_path / "acl"
    acl.write_text("pattern write coco/v1/+/ingress/%c\npattern read coco/v1/+/spec\n")
    broker = Broker(tmp_path, free_port(), extra_config=f"acl_file {acl}\n")
    broker.start()
    try:
        yield broker
    finally:
        broker.stop()
