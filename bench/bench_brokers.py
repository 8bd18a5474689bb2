"""Clustered MQTT brokers side by side: NATS 2.9 (JetStream, MQTT) against RabbitMQ 3.10
(rabbitmq_mqtt, mirrored session queues), each as a 3-node cluster on this machine.

Run: ``.venv/bin/python bench/bench_brokers.py [--messages 20000] [--publishers 4]
[--repeats 3] [--kill-messages 20000] [--candidates nats rabbitmq] [--json PATH]``.

For each candidate, in one run:

(a) throughput: ``--messages`` 16-byte QoS 1 reports from ``--publishers`` paho-mqtt
    (MQTT 3.1.1) connections spread over the nodes, one topic each
    (``coco/v1/bench/ingress/p<i>``), to one subscriber with a persistent session
    (``clean_session=False``, QoS 1 on ``coco/v1/bench/ingress/+``) on node 1; per repeat,
    messages per CPU-second of the broker processes (user + system of every node's process
    tree) and per wall second (publishers' start to the subscriber's last message);
(b) kill -9, mid-run (once a third of the messages are acknowledged), of a node the subscriber
    is not on, and separately of the subscriber's node: every client reconnects to the next
    node's URL (same client id; the subscriber's session is persistent), and once the
    publishers are done the subscriber's copy is compared with every payload whose PUBACK a
    publisher received: lost = acknowledged but never delivered, duplicates = delivered more
    than once;
(c) a retained QoS 1 message published on node 1, node 1 killed, then a fresh subscriber on
    each surviving node: was it delivered;
(d) time from spawning the nodes to a ready cluster, and resident memory per node (idle
    after start, and after the throughput runs).

Publishers and the subscriber run in their own processes (paho's network loop in a thread
each), so the Python clients share the 2 cores with the brokers: the per-CPU-second rate of
the brokers is the comparable number, the wall rate is what this machine gives.
"""

from __future__ import annotations

import argparse
import collections
import importlib.metadata
import json
import multiprocessing
import multiprocessing.synchronize
import os
import platform
import statistics
import struct
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol

import paho.mqtt.client as mqtt
from paho.mqtt.enums import CallbackAPIVersion

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout

from rabbit_cluster import RABBIT_BIN, RabbitCluster

from edge.mqtt_url import parse_broker_url
from tests.clusters import NATS_SERVER, NatsCluster, release_of
from tests.cputime import process_tree, tree_cpu_seconds
from tests.mqtt_adapters import FailoverClient

TOPIC = "coco/v1/bench/ingress"
RETAINED_TOPIC = "coco/v1/bench/spec"
IDLE_SECONDS = 60.0  # no new delivery for this long ends a run
SETTLE_SECONDS = 35.0  # after a kill: NATS redelivers an unacknowledged message after 30 s


class Cluster(Protocol):
    @property
    def urls(self) -> list[str]: ...
    def kill(self, ref: int) -> None: ...
    def wait_ready(self, timeout: float | None = None) -> None: ...
    def close(self) -> None: ...


# --- MQTT clients that fail over between nodes ------------------------------------------


def payload(publisher: int, seq: int) -> bytes:
    return struct.pack("!IQI", publisher, seq, 0)  # 16 bytes, unique per message


def publisher_main(
    *,
    urls: list[str],
    ids: list[int],
    count: int,
    go: multiprocessing.synchronize.Event,
    ready: Any,
    acked: Any,
    out: Any,
) -> None:
    """Publish ``count`` QoS 1 messages on each of ``ids``' connections; send back the
    payloads whose PUBACK arrived."""
    acked_mids: dict[int, set[int]] = {i: set() for i in ids}
    clients: dict[int, FailoverClient] = {}
    lock = threading.Lock()
    for i in ids:
        fc = FailoverClient(urls, i, f"bench-pub-{os.getpid()}-{i}", clean_session=True)

        def on_publish(_c: Any, _u: Any, mid: int, _rc: Any, _p: Any, i: int = i) -> None:
            acked_mids[i].add(mid)
            with lock:
                acked.value += 1

        fc.client.on_publish = on_publish
        clients[i] = fc
    for fc in clients.values():
        fc.connected.wait(120)
    with ready.get_lock():
        ready.value += 1
    go.wait()
    mids: dict[int, dict[int, int]] = {i: {} for i in ids}
    for seq in range(count):
        for i, fc in clients.items():
            info = fc.client.publish(f"{TOPIC}/p{i}", payload(i, seq), qos=1)
            mids[i][info.mid] = seq
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline and any(len(acked_mids[i]) < count for i in ids):
        time.sleep(0.05)
    result = [payload(i, mids[i][mid]) for i in ids for mid in acked_mids[i]]
    for fc in clients.values():
        fc.close()
    out.put(result)


def subscriber_main(
    *,
    urls: list[str],
    first: int,
    client_id: str,
    ready: multiprocessing.synchronize.Event,
    stop: multiprocessing.synchronize.Event,
    received: Any,
    out: Any,
) -> None:
    """A persistent-session QoS 1 subscriber; sends back the multiset of payloads received
    and when the last one came (time.time)."""
    seen: collections.Counter[bytes] = collections.Counter()  # payload -> deliveries
    last = [0.0]

    def on_message(_c: Any, _u: Any, message: mqtt.MQTTMessage) -> None:
        data = bytes(message.payload)
        seen[data] += 1
        last[0] = time.time()
        if seen[data] == 1:
            with received.get_lock():
                received.value += 1  # distinct payloads

    def subscribe(client: mqtt.Client) -> None:
        client.subscribe(f"{TOPIC}/+", qos=1)

    subscribed = threading.Event()
    fc = FailoverClient(urls, first, client_id, clean_session=False, on_connected=subscribe)
    fc.client.on_message = on_message
    fc.client.on_subscribe = lambda *_a: subscribed.set()
    subscribed.wait(120)
    ready.set()
    stop.wait()
    fc.close()
    out.put((dict(seen), last[0], fc.connects))


# --- one run ---------------------------------------------------------------------------


def tree_rss(pid: int) -> int:
    """Resident bytes of ``pid`` and its descendants."""
    total = 0
    for member in process_tree(pid):
        try:
            status = Path(f"/proc/{member}/status").read_text()
        except OSError:
            continue
        for line in status.splitlines():
            if line.startswith("VmRSS:"):
                total += int(line.split()[1]) * 1024
    return total


@dataclass
class RunResult:
    messages: int
    acked: int
    delivered_distinct: int
    lost: int
    duplicates: int
    wall_seconds: float
    broker_cpu_seconds: float
    subscriber_connects: int
    killed: str | None = None

    @property
    def per_cpu_second(self) -> float:
        return self.acked / self.broker_cpu_seconds if self.broker_cpu_seconds else 0.0

    @property
    def per_wall_second(self) -> float:
        return self.acked / self.wall_seconds if self.wall_seconds else 0.0


def run_once(
    cluster: Cluster,
    pids: Callable[[], list[int]],
    *,
    messages: int,
    publishers: int,
    tag: str,
    kill: int | None = None,
) -> RunResult:
    """One publish/subscribe run; ``kill`` = index of a node to SIGKILL once a third of the
    messages are acknowledged (the subscriber is on node 0)."""
    ctx = multiprocessing.get_context("fork")
    per = messages // publishers
    urls = cluster.urls
    go, sub_ready, stop = ctx.Event(), ctx.Event(), ctx.Event()
    pub_ready, acked, received = ctx.Value("i", 0), ctx.Value("i", 0), ctx.Value("i", 0)
    sub_out: Any = ctx.Queue()
    pub_out: Any = ctx.Queue()
    sub = ctx.Process(
        target=subscriber_main,
        kwargs={
            "urls": urls,
            "first": 0,
            "client_id": f"bench-sub-{tag}",
            "ready": sub_ready,
            "stop": stop,
            "received": received,
            "out": sub_out,
        },
    )
    sub.start()
    if not sub_ready.wait(180):
        raise RuntimeError("subscriber did not subscribe")
    groups = [list(range(publishers))[k::2] for k in range(2)]
    procs = [
        ctx.Process(
            target=publisher_main,
            kwargs={
                "urls": urls,
                "ids": g,
                "count": per,
                "go": go,
                "ready": pub_ready,
                "acked": acked,
                "out": pub_out,
            },
        )
        for g in groups
        if g
    ]
    for p in procs:
        p.start()
    while pub_ready.value < len(procs):
        time.sleep(0.02)
    cpu0 = tree_cpu_seconds(*pids())
    t0 = time.time()
    go.set()
    killed = None
    if kill is not None:
        while acked.value < messages // 3 and any(p.is_alive() for p in procs):
            time.sleep(0.005)
        cpu0 -= tree_cpu_seconds(*pids())  # the killed node's CPU so far is not counted after
        cluster.kill(kill)
        cpu0 += tree_cpu_seconds(*pids())
        killed = f"node {kill + 1}"
    acked_payloads: list[bytes] = []
    for _ in procs:
        acked_payloads.extend(pub_out.get(timeout=900))
    for p in procs:
        p.join(timeout=60)
    target = len(acked_payloads)
    last_count, last_change = -1, time.monotonic()
    while True:
        now = received.value
        if now != last_count:
            last_count, last_change = now, time.monotonic()
        if now >= target and kill is None:
            break
        if time.monotonic() - last_change > (IDLE_SECONDS if kill is None else SETTLE_SECONDS):
            break
        time.sleep(0.05)
    cpu1 = tree_cpu_seconds(*pids())
    stop.set()
    seen, last_time, connects = sub_out.get(timeout=120)
    sub.join(timeout=60)
    lost = sum(1 for p in set(acked_payloads) if p not in seen)
    return RunResult(
        messages=per * publishers,
        acked=target,
        delivered_distinct=len(seen),
        lost=lost,
        duplicates=sum(c - 1 for c in seen.values()),
        wall_seconds=max(0.0, last_time - t0),
        broker_cpu_seconds=cpu1 - cpu0,
        subscriber_connects=connects,
        killed=killed,
    )


def retained_subscription(url: str, client_id: str, qos: int) -> tuple[bool, bool]:
    """One clean-session subscription to the retained topic: (SUBACK granted, the retained
    message delivered within 10 s of the SUBACK)."""
    host, port = parse_broker_url(url)[:2]
    granted, delivered, done = threading.Event(), threading.Event(), threading.Event()
    client = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=client_id, protocol=mqtt.MQTTv311)

    def on_subscribe(_c: Any, _u: Any, _mid: int, codes: list[Any], _p: Any) -> None:
        if not any(code.is_failure for code in codes):
            granted.set()
        done.set()

    client.on_connect = lambda c, *_a: c.subscribe(RETAINED_TOPIC, qos=qos)
    client.on_subscribe = on_subscribe
    client.on_message = lambda *_a: delivered.set()
    client.connect(host, port, keepalive=15)
    client.loop_start()
    try:
        done.wait(30)
        if granted.is_set():
            delivered.wait(10)
    finally:
        client.disconnect()
        client.loop_stop()
    return granted.is_set(), delivered.is_set()


def retained_after_kill(cluster: Cluster, tag: str, attempts: int = 5) -> dict[str, str]:
    """Publish a retained message on node 1, kill node 1, then on each survivor subscribe
    with a fresh clean session ``attempts`` times at QoS 0 and at QoS 1."""
    urls = cluster.urls
    fc = FailoverClient(urls, 0, f"bench-ret-{tag}", clean_session=True)
    fc.connected.wait(60)
    info = fc.client.publish(RETAINED_TOPIC, b'{"spec": "bench"}', qos=1, retain=True)
    info.wait_for_publish(60)
    fc.close()
    cluster.kill(0)
    cluster.wait_ready()
    result = {}
    for index in range(1, len(urls)):
        for qos in (0, 1):
            outcomes = [
                retained_subscription(urls[index], f"bench-ret-{tag}-{index}-{qos}-{k}", qos)
                for k in range(attempts)
            ]
            refused = sum(1 for ok, _ in outcomes if not ok)
            delivered = sum(1 for ok, got in outcomes if ok and got)
            result[f"node {index + 1} QoS {qos}"] = (
                f"{delivered}/{attempts} delivered, {refused} SUBACK 0x80"
            )
    return result


# --- the candidates ---------------------------------------------------------------------


@dataclass
class CandidateResult:
    name: str
    version: str
    startup_seconds: float
    rss_idle_mib: list[float]
    rss_after_mib: list[float] = field(default_factory=list)
    throughput: list[RunResult] = field(default_factory=list)
    kill_other: RunResult | None = None
    kill_subscriber: RunResult | None = None
    retained: dict[str, str] = field(default_factory=dict)


def with_cluster(name: str, work: Path) -> tuple[Any, Callable[[], list[int]], str]:
    if name == "nats":
        nats = NatsCluster(work / "nats")
        return (
            nats,
            lambda: [n.proc.pid for n in nats.nodes if n.proc is not None],
            release_of(NATS_SERVER),
        )
    rabbit = RabbitCluster(work / "rabbit")
    return rabbit, lambda: [p for i in range(3) for p in rabbit.pids(i)], "3.10.8"


def measure(name: str, args: argparse.Namespace, work: Path) -> CandidateResult:
    results: CandidateResult | None = None
    for phase in ("throughput", "kill_other", "kill_subscriber", "retained"):
        cluster, pids, version = with_cluster(name, work / phase)
        t0 = time.monotonic()
        cluster.start_all()
        startup = time.monotonic() - t0
        try:
            rss = [tree_rss(pid) / 2**20 for pid in pids()]
            if results is None:
                results = CandidateResult(name, version, startup, rss)
            print(f"{name}: {phase} (cluster ready in {startup:.1f} s)", flush=True)
            if phase == "throughput":
                for r in range(args.repeats):
                    run = run_once(
                        cluster,
                        pids,
                        messages=args.messages,
                        publishers=args.publishers,
                        tag=f"t{r}",
                    )
                    print(f"  repeat {r + 1}: {run}", flush=True)
                    results.throughput.append(run)
                results.rss_after_mib = [tree_rss(pid) / 2**20 for pid in pids()]
            elif phase == "kill_other":
                results.kill_other = run_once(
                    cluster,
                    pids,
                    messages=args.kill_messages,
                    publishers=args.publishers,
                    tag="ko",
                    kill=1,
                )
                print(f"  {results.kill_other}", flush=True)
            elif phase == "kill_subscriber":
                results.kill_subscriber = run_once(
                    cluster,
                    pids,
                    messages=args.kill_messages,
                    publishers=args.publishers,
                    tag="ks",
                    kill=0,
                )
                print(f"  {results.kill_subscriber}", flush=True)
            else:
                results.retained = retained_after_kill(cluster, "r")
                print(f"  {results.retained}", flush=True)
        finally:
            cluster.close()
    assert results is not None
    return results


def spread(values: Sequence[float]) -> str:
    if not values:
        return "-"
    return " / ".join(f"{v:,.0f}" for v in (min(values), statistics.median(values), max(values)))


def kill_cell(run: RunResult | None) -> str:
    if run is None:
        return "-"
    return f"{run.acked:,} acked, {run.lost:,} lost, {run.duplicates:,} dup"


def table(results: Sequence[CandidateResult]) -> str:
    rows: list[tuple[str, Callable[[CandidateResult], str]]] = [
        ("broker", lambda r: f"{r.name} {r.version}"),
        ("cluster start to ready (s)", lambda r: f"{r.startup_seconds:.1f}"),
        ("RSS per node idle (MiB)", lambda r: " / ".join(f"{m:.0f}" for m in r.rss_idle_mib)),
        ("RSS per node after (a) (MiB)", lambda r: " / ".join(f"{m:.0f}" for m in r.rss_after_mib)),
        ("(a) msgs per broker CPU-s", lambda r: spread([t.per_cpu_second for t in r.throughput])),
        ("(a) msgs per wall s", lambda r: spread([t.per_wall_second for t in r.throughput])),
        (
            "(a) lost / dup",
            lambda r: (
                f"{sum(t.lost for t in r.throughput)} / {sum(t.duplicates for t in r.throughput)}"
            ),
        ),
        ("(b) kill -9 other node", lambda r: kill_cell(r.kill_other)),
        ("(b) kill -9 subscriber's node", lambda r: kill_cell(r.kill_subscriber)),
        (
            "(c) retained after kill of node 1",
            lambda r: "; ".join(f"{k}: {v}" for k, v in r.retained.items()),
        ),
    ]
    lines = ["| | " + " | ".join(r.name for r in results) + " |", "|---|" + "---|" * len(results)]
    for label, cell in rows:
        lines.append(f"| {label} | " + " | ".join(cell(r) for r in results) + " |")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else "")
    parser.add_argument("--messages", type=int, default=20_000)
    parser.add_argument("--kill-messages", type=int, default=20_000)
    parser.add_argument("--publishers", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--candidates", nargs="+", default=["nats", "rabbitmq"], choices=["nats", "rabbitmq"]
    )
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    if args.messages // args.publishers >= 60_000:
        parser.error("at most 60,000 messages per publisher (paho's message ids)")
    print(
        f"{platform.node()}: {os.cpu_count()} cores, load {os.getloadavg()}, "
        f"Python {platform.python_version()}, paho-mqtt {importlib.metadata.version('paho-mqtt')}",
        flush=True,
    )
    results = []
    with tempfile.TemporaryDirectory(prefix="bench-brokers-") as tmp:
        for name in args.candidates:
            binary = NATS_SERVER if name == "nats" else str(RABBIT_BIN / "rabbitmq-server")
            if not Path(binary).exists():
                print(f"{name}: {binary} is not installed (apt-get install), skipped")
                continue
            results.append(measure(name, args, Path(tmp) / name))
    print(table(results))
    print(f"load after: {os.getloadavg()}")
    if args.json:
        args.json.write_text(json.dumps([asdict(r) for r in results], indent=2))


if __name__ == "__main__":
    main()
