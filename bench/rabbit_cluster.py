"""A 3-node RabbitMQ 3.10 cluster with the MQTT plugin on loopback ports, for
bench_brokers.py (the same interface as tests.clusters.NatsCluster: ``urls``, ``kill``,
``start``, ``wait_ready``, ``close``, ``pids``, ``logs``).

Each node has its own name (``coco<pid>r<i>@localhost``, so it never meets the machine's own
``rabbit@`` node in the shared epmd), AMQP, distribution, CLI and MQTT ports, Mnesia and log
directories and a cookie of its own. The nodes form one cluster at boot (classic peer
discovery). A policy mirrors the MQTT plugin's session queues (``mqtt-subscription-*``) on
every node (``ha-mode: all``, automatic sync): RabbitMQ 3.10's MQTT plugin declares classic
queues and has no setting for quorum queues, and a queue's type cannot be set by a policy.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from tests.clusters import ClusterError, mqtt_probe
from tests.ports import free_port

RABBIT_BIN = Path("/usr/lib/rabbitmq/bin")
MIRROR_POLICY = '{"ha-mode":"all","ha-sync-mode":"automatic"}'


@dataclass
class RabbitNode:
    name: str  # the Erlang node name, e.g. coco1234r1@localhost
    directory: Path
    amqp_port: int = 0
    dist_port: int = 0
    mqtt_port: int = 0
    ctl_port: int = 0
    proc: subprocess.Popen[bytes] | None = field(default=None, repr=False)

    @property
    def url(self) -> str:
        return f"mqtt://127.0.0.1:{self.mqtt_port}"

    @property
    def pid_file(self) -> Path:
        return self.directory / "beam.pid"

    def beam_pid(self) -> int | None:
        with contextlib.suppress(OSError, ValueError):
            return int(self.pid_file.read_text().strip())
        return None


class RabbitCluster:
    def __init__(self, directory: Path, size: int = 3, *, ready_timeout: float = 240.0) -> None:
        self.directory = directory
        self.ready_timeout = ready_timeout
        self.cookie = secrets.token_hex(16).upper()
        tag = f"coco{os.getpid()}r"
        self.nodes = [
            RabbitNode(f"{tag}{i + 1}@localhost", directory / f"r{i + 1}") for i in range(size)
        ]
        self.home = directory / "home"

    @property
    def urls(self) -> list[str]:
        return [node.url for node in self.nodes]

    def node(self, ref: int | str) -> RabbitNode:
        if isinstance(ref, int):
            return self.nodes[ref]
        return next(node for node in self.nodes if node.name == ref)

    def __enter__(self) -> RabbitCluster:
        self.start_all()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _env(self, node: RabbitNode) -> dict[str, str]:
        d = node.directory
        return {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "HOME": str(self.home),
            "LANG": "C.UTF-8",
            "RABBITMQ_NODENAME": node.name,
            "RABBITMQ_NODE_IP_ADDRESS": "127.0.0.1",
            "RABBITMQ_NODE_PORT": str(node.amqp_port),
            "RABBITMQ_DIST_PORT": str(node.dist_port),
            "RABBITMQ_CTL_DIST_PORT_MIN": str(node.ctl_port),
            "RABBITMQ_CTL_DIST_PORT_MAX": str(node.ctl_port),
            "RABBITMQ_CONFIG_FILE": str(d / "rabbitmq.conf"),
            "RABBITMQ_ADVANCED_CONFIG_FILE": str(d / "advanced.config"),
            "RABBITMQ_ENABLED_PLUGINS_FILE": str(d / "enabled_plugins"),
            "RABBITMQ_MNESIA_BASE": str(d / "mnesia"),
            "RABBITMQ_LOG_BASE": str(d / "log"),
            "RABBITMQ_PLUGINS_EXPAND_DIR": str(d / "plugins-expand"),
            "RABBITMQ_PID_FILE": str(node.pid_file),
        }

    def start_all(self) -> None:
        self.home.mkdir(parents=True, exist_ok=True)
        cookie = self.home / ".erlang.cookie"
        cookie.write_text(self.cookie)
        cookie.chmod(0o600)
        taken: set[int] = set()
        for node in self.nodes:
            ports: list[int] = []
            while len(ports) < 4:
                port = free_port()
                if port not in taken:
                    taken.add(port)
                    ports.append(port)
            node.amqp_port, node.dist_port, node.mqtt_port, node.ctl_port = ports
        peers = "\n".join(
            f"cluster_formation.classic_config.nodes.{i + 1} = {n.name}"
            for i, n in enumerate(self.nodes)
        )
        for node in self.nodes:
            node.directory.mkdir(parents=True, exist_ok=True)
            (node.directory / "rabbitmq.conf").write_text(
                f"listeners.tcp.default = 127.0.0.1:{node.amqp_port}\n"
                f"mqtt.listeners.tcp.default = 127.0.0.1:{node.mqtt_port}\n"
                "mqtt.allow_anonymous = true\nloopback_users = none\n"
                "cluster_formation.peer_discovery_backend = classic_config\n"
                f"{peers}\n"
            )
            (node.directory / "enabled_plugins").write_text("[rabbitmq_mqtt].\n")
        for node in self.nodes:
            self._spawn(node)
        try:
            self.wait_ready()
            self.ctl(
                0,
                "set_policy",
                "coco-mqtt-mirror",
                "^mqtt-subscription-",
                MIRROR_POLICY,
                "--apply-to",
                "queues",
            )
        except BaseException:
            self.close()
            raise

    def _spawn(self, node: RabbitNode) -> None:
        with contextlib.suppress(FileNotFoundError):
            node.pid_file.unlink()
        out = (node.directory / "stdout.log").open("ab")
        with out:
            node.proc = subprocess.Popen(
                [str(RABBIT_BIN / "rabbitmq-server")],
                env=self._env(node),
                cwd=node.directory,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=out,
                start_new_session=True,
            )

    def ctl(self, ref: int | str, *args: str, timeout: float = 120) -> str:
        node = self.node(ref)
        result = subprocess.run(
            [str(RABBIT_BIN / "rabbitmqctl"), "-n", node.name, *args],
            env=self._env(node),
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        if result.returncode != 0:
            raise ClusterError(f"rabbitmqctl {args}: {result.stderr or result.stdout}")
        return result.stdout

    def running(self) -> list[RabbitNode]:
        return [n for n in self.nodes if n.proc is not None and n.proc.poll() is None]

    def wait_ready(self, timeout: float | None = None) -> None:
        """Every running node answers MQTT CONNECT with CONNACK 0 and reports all running
        nodes in its cluster."""
        deadline = time.monotonic() + (self.ready_timeout if timeout is None else timeout)
        while True:
            running = self.running()
            for node in self.nodes:
                if node.proc is not None and node.proc.poll() is not None:
                    raise ClusterError(f"{node.name} exited\n{self.logs()}")
            if running and all(mqtt_probe(n.mqtt_port) == 0 for n in running):
                status = json.loads(
                    self.ctl(running[0].name, "cluster_status", "--formatter", "json")
                )
                if set(status.get("running_nodes", [])) >= {n.name for n in running}:
                    return
            if time.monotonic() > deadline:
                raise ClusterError(f"RabbitMQ cluster not ready\n{self.logs()}")
            time.sleep(0.5)

    def pids(self, ref: int | str) -> list[int]:
        """The node's processes: the start script and, below it, beam.smp and its helpers."""
        node = self.node(ref)
        return [node.proc.pid] if node.proc is not None and node.proc.poll() is None else []

    def kill(self, ref: int | str) -> None:
        """SIGKILL the node's Erlang VM (a crash), then reap its start script."""
        node = self.node(ref)
        if node.proc is None:
            return
        beam = node.beam_pid()
        if beam is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(beam, signal.SIGKILL)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(node.proc.pid, signal.SIGKILL)
        node.proc.wait(timeout=60)
        node.proc = None

    def start(self, ref: int | str) -> None:
        self._spawn(self.node(ref))
        self.wait_ready()

    def close(self) -> None:
        for node in self.nodes:
            if node.proc is not None and node.proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(node.proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + 30
        for node in self.nodes:
            if node.proc is None:
                continue
            try:
                node.proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(node.proc.pid, signal.SIGKILL)
                node.proc.wait(timeout=30)
            node.proc = None

    def logs(self, tail: int = 40) -> str:
        out = []
        for node in self.nodes:
            texts = []
            logs = sorted((node.directory / "log").glob("*.log"))
            for path in [*logs, node.directory / "stdout.log"]:
                with contextlib.suppress(OSError):
                    texts.append(path.read_text(errors="replace"))
            lines = "".join(texts).splitlines()[-tail:]
            out.append(f"--- {node.name} ---\n" + "\n".join(lines))
        return "\n".join(out)
