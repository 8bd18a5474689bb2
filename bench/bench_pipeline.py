"""Ingest throughput: raw Mosquitto vs the shuffler vs MQTT client libraries, in one run.

Run: ``.venv/bin/python bench/bench_pipeline.py [--messages 100000] [--repeats 3]
[--qos 0 1] [--json PATH]``. It starts its own Mosquitto on a free 127.0.0.1 port (never
the system broker) and, for each QoS and repeat, runs every case below in separate
processes, one at a time:

* ``mosquitto_pub -l`` -> ``mosquitto_sub``: raw broker rate, one topic, 16-byte lines;
* ``fleet`` publisher -> ``mosquitto_sub``: raw broker rate under the shuffler's load (the
  denominator of the ratios);
* ``fleet`` publisher -> aiomqtt / paho-mqtt (loop thread) / gmqtt sinks that count and
  ``decode_report`` every message;
* ``fleet`` publisher -> the real :class:`broker.service.shuffler.Shuffler` alone (its ingest rate,
  the number the goal "ingest >= 0.6 of the raw Mosquitto rate in every repeat" is about);
* ``fleet`` publisher -> the shuffler -> the real :class:`aggregator.service.service.Aggregator`
  (end to end; the shuffler's ingest is reported again, now sharing the 2 cores with the
  aggregator).

The ``fleet`` publisher is a raw-socket MQTT 3.1.1 client that pre-encodes ``--messages``
valid reports (``encode_report``) of as many distinct device ids, all in the current
wall-clock round of an hour (the shuffler accepts one report per device per round, and only
rounds around its clock), and writes them as fast as the socket takes them. The shuffler
runs twice: with its durable state directory (every accepted report written to its log
before its PUBACK, the default of ``coco shuffler``) and with its state in memory, so the
cost of durability is measured side by side. Every subscriber subscribes with QoS 1 (as
the shuffler does), so the delivery QoS is the publisher's QoS. Rates are messages per
second at the receiver, from its first to its last message (the shuffler's:
``coco_shuffler_reports_accepted_total`` read from its registry every 20 ms); end to end
is reports aggregated divided by the time from the publisher's first write to the
aggregator's last report.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib
import importlib.util
import json
import os
import resource
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout

from broker.service.shuffler import ShufflerConfig
from edge.codec import decode_report, encode_report
from edge.rounds import current_round
from edge.spec import MechanismSpec

DEPLOYMENT = "bench"
FILTER = f"coco/v1/{DEPLOYMENT}/ingress/+"
SINGLE_TOPIC = f"coco/v1/{DEPLOYMENT}/ingress/mosquitto-pub"
SPEC = MechanismSpec(mechanism="collision", d=512, s=16, epsilon=1.0)
POLL = 0.02
IDLE = 3.0
AGGREGATOR_IDLE = 30.0  # batches may wait behind the whole ingress backlog (see README)
MOSQUITTO = "/usr/sbin/mosquitto"
ROUND_SECONDS = 3600
KEY_ENV = "COCO_BENCH_SIGNING_KEY"  # the shufflers' batch key, made by orchestrate()
CLIENTS = ("aiomqtt", "aiomqtt-v5", "paho", "gmqtt")


# --- child roles (each runs in its own process, prints READY then one JSON line) -----------


def _ready() -> None:
    print("READY", flush=True)


def _emit(result: dict[str, Any]) -> None:
    usage = resource.getrusage(resource.RUSAGE_SELF)  # the whole process: every thread
    print(json.dumps({**result, "cpu_s": usage.ru_utime + usage.ru_stime}), flush=True)


def _rate(count: int, first: float | None, last: float | None) -> float | None:
    if first is None or last is None or count < 2 or last <= first:
        return None
    return (count - 1) / (last - first)


class _Counter:
    """Counts and decodes messages; records the first and last arrival (monotonic)."""

    def __init__(self, expected: int) -> None:
        self.expected = expected
        self.count = 0
        self.bad = 0
        self.first: float | None = None
        self.last: float | None = None
        self.done = threading.Event()

    def on(self, payload: bytes) -> None:
        now = time.monotonic()
        if self.first is None:
            self.first = now
        self.last = now
        try:
            decode_report(payload)
        except ValueError:
            self.bad += 1
        self.count += 1
        if self.count >= self.expected:
            self.done.set()

    def result(self, client: str) -> dict[str, Any]:
        return {
            "client": client,
            "count": self.count,
            "bad": self.bad,
            "first": self.first,
            "last": self.last,
            "rate": _rate(self.count, self.first, self.last),
        }


def _wait_counter(counter: _Counter, deadline: float) -> None:
    """Until ``expected`` messages, ``IDLE`` s without one after the first, or ``deadline``."""
    while not counter.done.wait(0.1):
        now = time.monotonic()
        if now > deadline or (counter.last is not None and now - counter.last > IDLE):
            return


def sink_paho(port: int, expected: int, timeout: float) -> None:
    import paho.mqtt.client as paho  # noqa: PLC0415
    from paho.mqtt.enums import CallbackAPIVersion  # noqa: PLC0415

    counter = _Counter(expected)
    subscribed = threading.Event()
    client = paho.Client(CallbackAPIVersion.VERSION2)

    def on_connect(c: paho.Client, _u: Any, _f: Any, _rc: Any, _p: Any) -> None:
        c.subscribe(FILTER, qos=1)

    def on_subscribe(_c: paho.Client, _u: Any, _m: Any, _rc: Any, _p: Any) -> None:
        subscribed.set()

    def on_message(_c: paho.Client, _u: Any, msg: paho.MQTTMessage) -> None:
        counter.on(bytes(msg.payload))

    client.on_connect = on_connect
    client.on_subscribe = on_subscribe
    client.on_message = on_message
    client.connect("127.0.0.1", port)
    client.loop_start()
    subscribed.wait(10)
    _ready()
    _wait_counter(counter, time.monotonic() + timeout)
    client.disconnect()
    client.loop_stop()
    _emit(counter.result("paho"))


async def _sink_aiomqtt(port: int, expected: int, timeout: float, *, v5: bool = False) -> None:
    import aiomqtt  # noqa: PLC0415

    counter = _Counter(expected)
    protocol = aiomqtt.ProtocolVersion.V5 if v5 else aiomqtt.ProtocolVersion.V311
    async with aiomqtt.Client(
        "127.0.0.1", port, protocol=protocol, max_queued_incoming_messages=2 * expected + 10
    ) as client:
        await client.subscribe(FILTER, qos=1)
        _ready()

        async def consume() -> None:
            async for message in client.messages:
                payload = message.payload
                counter.on(payload if isinstance(payload, bytes) else b"")
                if counter.done.is_set():
                    return

        task = asyncio.ensure_future(consume())
        deadline = time.monotonic() + timeout
        while not task.done():
            await asyncio.sleep(0.1)
            now = time.monotonic()
            if now > deadline or (counter.last is not None and now - counter.last > IDLE):
                task.cancel()
                break
        with contextlib.suppress(asyncio.CancelledError):
            await task
    _emit(counter.result("aiomqtt-v5" if v5 else "aiomqtt"))


async def _sink_gmqtt(port: int, expected: int, timeout: float) -> None:
    gmqtt: Any = importlib.import_module("gmqtt")
    counter = _Counter(expected)
    subscribed = asyncio.Event()

    def on_message(_c: Any, _topic: str, payload: bytes, _qos: int, _p: Any) -> int:
        counter.on(payload)
        return 0

    def on_subscribe(*_args: Any) -> None:
        subscribed.set()

    client = gmqtt.Client(f"bench-gmqtt-{os.getpid()}")
    client.on_message = on_message
    client.on_subscribe = on_subscribe
    await client.connect("127.0.0.1", port)
    client.subscribe(FILTER, qos=1)
    await asyncio.wait_for(subscribed.wait(), 10)
    _ready()
    deadline = time.monotonic() + timeout
    while not counter.done.is_set():
        await asyncio.sleep(0.05)
        now = time.monotonic()
        if now > deadline or (counter.last is not None and now - counter.last > IDLE):
            break
    await client.disconnect()
    _emit(counter.result("gmqtt"))


class _Poller:
    """(monotonic time, value) samples of a counter, every ``POLL`` seconds."""

    def __init__(self, read: Callable[[], float]) -> None:
        self.read = read
        self.samples: list[tuple[float, float]] = []

    def sample(self) -> float:
        value = self.read()
        self.samples.append((time.monotonic(), value))
        return value

    def idle_for(self) -> float:
        """Seconds since the value last changed (0 if it never became > 0)."""
        if not self.samples or self.samples[-1][1] == 0:
            return 0.0
        final = self.samples[-1][1]
        changed = next(t for t, v in self.samples if v == final)
        return time.monotonic() - changed

    def summary(self) -> dict[str, Any]:
        final = self.samples[-1][1] if self.samples else 0.0
        started = [(t, v) for t, v in self.samples if v > 0]
        if not started:
            return {"count": 0, "first": None, "last": None, "rate": None}
        t0, v0 = started[0]
        t1 = next(t for t, v in self.samples if v == final)
        rate = (final - v0) / (t1 - t0) if t1 > t0 else None
        return {"count": int(final), "first": t0, "last": t1, "rate": rate}


async def _run_shuffler(
    port: int, expected: int, timeout: float, mqtt: str = "default", state: str = "memory"
) -> None:
    from prometheus_client import CollectorRegistry  # noqa: PLC0415

    from broker.service.shuffler import Shuffler  # noqa: PLC0415

    registry = CollectorRegistry()
    extra: dict[str, Any] = {} if mqtt == "default" else {"mqtt_version": mqtt}
    if state != "memory":
        extra["state_dir"] = Path(state)
    extra["signing_key"] = Path(os.environ[KEY_ENV])
    config = ShufflerConfig(
        broker=f"mqtt://127.0.0.1:{port}",
        deployment=DEPLOYMENT,
        spec=SPEC,
        min_batch=1_000,
        max_batch=10_000,
        release_size=10_000,  # batches leave during the run, not when the hour ends
        round_seconds=ROUND_SECONDS,
        max_reports_per_round=max(1_000_000, expected),
        flush_interval=0.5,
        client_id=f"bench-shuffler-{os.getpid()}",
        session_expiry=0,
        **extra,
    )

    def accepted() -> float:
        return registry.get_sample_value("coco_shuffler_reports_accepted_total") or 0.0

    def received() -> float:
        return registry.get_sample_value("coco_shuffler_reports_received_total") or 0.0

    poller = _Poller(accepted)
    async with Shuffler(config, registry=registry) as shuffler:
        runner = asyncio.ensure_future(shuffler.run())
        await asyncio.wait_for(shuffler.connected.wait(), 10)
        _ready()
        deadline = time.monotonic() + timeout
        while True:
            await asyncio.sleep(POLL)
            value = poller.sample()
            if value >= expected or time.monotonic() > deadline or poller.idle_for() > IDLE:
                break
        await asyncio.sleep(1.0)  # let the flush tick release what is left
        shuffler.stop()
        await runner
    rejected = {
        s.labels["reason"]: s.value
        for metric in registry.collect()
        if metric.name == "coco_shuffler_reports_rejected"
        for s in metric.samples
        if s.name.endswith("_total") and s.value
    }
    released = registry.get_sample_value("coco_shuffler_reports_released_total") or 0.0
    _emit(
        {
            "client": "shuffler",
            "mqtt_version": config.mqtt_version,
            "state": "durable" if config.state_dir else "memory",
            **poller.summary(),
            "received": received(),
            "released": released,
            "rejected": rejected,
        }
    )


async def _run_aggregator(port: int, expected: int, timeout: float) -> None:
    from aggregator.service.config import AggregatorConfig  # noqa: PLC0415
    from aggregator.service.service import Aggregator  # noqa: PLC0415
    from edge.batch_auth import load_or_create_signing_key, public_key_hex  # noqa: PLC0415

    config = AggregatorConfig(
        broker=f"mqtt://127.0.0.1:{port}",
        deployment=DEPLOYMENT,
        spec=SPEC,
        delta=1e-8,
        batch_public_key=public_key_hex(load_or_create_signing_key(Path(os.environ[KEY_ENV]))),
        min_batch=1_000,
        http_port=None,
        client_id=f"bench-aggregator-{os.getpid()}",
        session_expiry=0,
    )
    async with Aggregator(config) as aggregator:
        poller = _Poller(lambda: float(aggregator.counters.reports))
        runner = asyncio.ensure_future(aggregator.run())
        await asyncio.wait_for(aggregator.subscribed.wait(), 10)
        _ready()
        deadline = time.monotonic() + timeout
        while True:
            await asyncio.sleep(POLL)
            value = poller.sample()
            if (
                value >= expected
                or time.monotonic() > deadline
                or poller.idle_for() > AGGREGATOR_IDLE
            ):
                break
        runner.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await runner
    _emit({"client": "aggregator", **poller.summary(), "batches": aggregator.counters.batches})


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte, n = n % 128, n // 128
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _utf8(text: str) -> bytes:
    data = text.encode()
    return len(data).to_bytes(2, "big") + data


def _packet(first: int, body: bytes) -> bytes:
    return bytes([first]) + _varint(len(body)) + body


def fleet_packets(n: int, qos: int) -> bytes:
    """``n`` PUBLISH packets: device ``i`` reports once, in the current round."""
    fingerprint = SPEC.fingerprint_int
    round_ = current_round(ROUND_SECONDS)
    parts: list[bytes] = []
    for i in range(n):
        topic = _utf8(f"coco/v1/{DEPLOYMENT}/ingress/dev-{i:07d}")
        pid = (i % 65535 + 1).to_bytes(2, "big") if qos else b""
        payload = encode_report(fingerprint, round_, i * 2654435761 % 2**32, i % SPEC.t)
        parts.append(_packet(0x30 | (qos << 1), topic + pid + payload))
    return b"".join(parts)


def fleet_publish(port: int, n: int, qos: int) -> None:
    """Raw-socket MQTT 3.1.1 publisher (no client library in the way)."""
    stream = fleet_packets(n, qos)
    sizes = len(stream) // n  # only for chunking; packets are near-equal in size
    sock = socket.create_connection(("127.0.0.1", port))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    connect = b"\x00\x04MQTT\x04\x02\x00\x3c" + _utf8(f"bench-pub-{os.getpid()}")
    sock.sendall(_packet(0x10, connect))
    connack = sock.recv(4)
    if len(connack) < 4 or connack[3] != 0:
        raise RuntimeError(f"CONNACK refused: {connack!r}")
    acked = 0
    acked_lock = threading.Condition()

    def reader() -> None:
        nonlocal acked
        pending = 0
        while True:
            data = sock.recv(65536)
            if not data:
                return
            pending += len(data)
            with acked_lock:
                acked += pending // 4  # PUBACK is 4 bytes: 0x40 0x02 id id
                pending %= 4
                acked_lock.notify_all()
                if acked >= n:
                    return

    thread = threading.Thread(target=reader, daemon=True)
    if qos:
        thread.start()
    _ready()
    start = time.monotonic()
    chunk = 500 * sizes
    sent = 0
    view = memoryview(stream)
    for offset in range(0, len(stream), chunk):
        sock.sendall(view[offset : offset + chunk])
        sent += 500
        if qos:
            with acked_lock:
                while sent - acked > 20_000 and acked_lock.wait(timeout=30):
                    pass
    sent_at = time.monotonic()
    if qos:
        with acked_lock:
            acked_lock.wait_for(lambda: acked >= n, timeout=60)
    end = time.monotonic()
    sock.sendall(b"\xe0\x00")
    sock.close()
    _emit({"start": start, "sent": sent_at, "end": end, "acked": acked if qos else None})


# --- orchestration -------------------------------------------------------------------------


class Child:
    """A role of this script (or any command) in its own process."""

    def __init__(
        self,
        argv: Sequence[str],
        *,
        stdin: Any = None,
        stdout: Any = subprocess.PIPE,
    ) -> None:
        self.proc = subprocess.Popen(
            list(argv), stdin=stdin, stdout=stdout, stderr=subprocess.PIPE, text=True
        )

    @classmethod
    def role(cls, *args: object) -> Child:
        return cls([sys.executable, __file__, "--role", *map(str, args)])

    def wait_ready(self, timeout: float = 20.0) -> None:
        assert self.proc.stdout is not None
        line = _readline(self.proc.stdout.fileno(), timeout)
        if line.strip() != "READY":
            self.kill()
            err = self.proc.stderr.read() if self.proc.stderr else ""
            raise RuntimeError(f"child not ready: {line!r} {err[-2000:]}")

    def result(self, timeout: float) -> dict[str, Any]:
        try:
            out, err = self.proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            out, err = self.proc.communicate()
        lines = [ln for ln in out.splitlines() if ln.startswith("{")]
        if not lines:
            raise RuntimeError(f"child gave no result (rc={self.proc.returncode}): {err[-2000:]}")
        result: dict[str, Any] = json.loads(lines[-1])
        return result

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def _readline(fd: int, timeout: float) -> str:
    data = b""
    deadline = time.monotonic() + timeout
    os.set_blocking(fd, False)
    try:
        while not data.endswith(b"\n"):
            if time.monotonic() > deadline:
                break
            try:
                byte = os.read(fd, 1)
            except BlockingIOError:
                time.sleep(0.01)
                continue
            if not byte:
                break
            data += byte
    finally:
        os.set_blocking(fd, True)
    return data.decode()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@contextlib.contextmanager
def own_mosquitto(workdir: Path) -> Iterator[int]:
    port = free_port()
    conf = workdir / "mosquitto.conf"
    conf.write_text(
        f"listener {port} 127.0.0.1\nallow_anonymous true\npersistence false\n"
        "max_queued_messages 1000000\nmax_queued_bytes 0\nmax_inflight_messages 0\n"
        "log_dest none\n"
    )
    proc = subprocess.Popen([MOSQUITTO, "-c", str(conf)], stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 10
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise RuntimeError("own mosquitto did not start") from None
                time.sleep(0.05)
        yield port
    finally:
        proc.terminate()
        proc.wait(10)


def mosquitto_sub(port: int, n: int, timeout: float, out: Path) -> Child:
    """``mosquitto_sub -C n -F %U`` writing one timestamp per message to the file ``out``
    (a file, not a pipe: reading a pipe from Python would slow mosquitto_sub down)."""
    with out.open("w") as stdout:
        return Child(
            [
                "mosquitto_sub",
                *("-h", "127.0.0.1", "-p", str(port), "-t", FILTER, "-q", "1"),
                *("-C", str(n), "-W", str(int(timeout)), "-F", "%U"),
            ],
            stdout=stdout,
        )


def sub_result(child: Child, timeout: float, out: Path) -> dict[str, Any]:
    """Count and first/last timestamps (wall clock, ns resolution) of mosquitto_sub -F %U."""
    try:
        child.proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        child.kill()
    stamps = [float(ln) for ln in out.read_text().split() if ln]
    first, last = (stamps[0], stamps[-1]) if stamps else (None, None)
    count = len(stamps)
    return {"count": count, "first": first, "last": last, "rate": _rate(count, first, last)}


def case_mosquitto_pub(port: int, n: int, qos: int, lines: Path, timeout: float) -> dict[str, Any]:
    out = lines.with_name("sub.txt")
    sub = mosquitto_sub(port, n, timeout, out)
    time.sleep(1.0)  # mosquitto_sub has no ready signal
    with lines.open("rb") as stdin:
        pub = Child(
            [
                "mosquitto_pub",
                *("-h", "127.0.0.1", "-p", str(port), "-t", SINGLE_TOPIC),
                *("-q", str(qos), "-M", "65535", "-l"),
            ],
            stdin=stdin,
        )
        pub.proc.communicate(timeout=timeout)
    return sub_result(sub, timeout, out)


def case_fleet(
    port: int, n: int, *, qos: int, receivers: list[Child], timeout: float
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Start the fleet publisher once every receiver is ready; (publisher, receivers)."""
    try:
        pub = Child.role("publish", port, n, qos)
        pub.wait_ready(60)
        published = pub.result(timeout)
        results = [r.result(timeout) for r in receivers]
    finally:
        for r in receivers:
            r.kill()
    return published, results


CASES = ("mosquitto_pub", "clients", "shuffler", "durable", "v311", "e2e")
"""Groups of cases ``--cases`` selects; the raw case (the denominator) always runs."""


def run_once(
    port: int,
    n: int,
    *,
    qos: int,
    lines: Path,
    clients: Sequence[str],
    timeout: float,
    cases: Sequence[str] = CASES,
) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    if "mosquitto_pub" in cases:
        out["mosquitto_pub -l"] = case_mosquitto_pub(port, n, qos, lines, timeout)
    sub_out = lines.with_name("sub.txt")
    sub = mosquitto_sub(port, n, timeout, sub_out)
    time.sleep(1.0)
    pub, _ = case_fleet(port, n, qos=qos, receivers=[], timeout=timeout)
    out["fleet -> mosquitto_sub"] = sub_result(sub, timeout, sub_out)
    for client in clients if "clients" in cases else ():
        sink = Child.role(f"sink-{client}", port, n, timeout)
        sink.wait_ready()
        _, (res,) = case_fleet(port, n, qos=qos, receivers=[sink], timeout=timeout)
        out[f"fleet -> {client}"] = res
    if "shuffler" in cases:
        shuf = Child.role("shuffler", port, n, timeout, "default", "memory")
        shuf.wait_ready()
        _, (alone,) = case_fleet(port, n, qos=qos, receivers=[shuf], timeout=timeout)
        out["fleet -> shuffler (ingest)"] = alone
    if "durable" in cases:
        with tempfile.TemporaryDirectory() as state:
            shuf = Child.role("shuffler", port, n, timeout, "default", Path(state) / "shuffler")
            shuf.wait_ready()
            _, (durable,) = case_fleet(port, n, qos=qos, receivers=[shuf], timeout=timeout)
        out["fleet -> shuffler, durable state (ingest)"] = durable
    if "v311" in cases:
        shuf = Child.role("shuffler", port, n, timeout, "3.1.1")
        shuf.wait_ready()
        _, (v311,) = case_fleet(port, n, qos=qos, receivers=[shuf], timeout=timeout)
        out["fleet -> shuffler, MQTT 3.1.1"] = v311
    if "e2e" in cases:
        agg = Child.role("aggregator", port, n, timeout)
        agg.wait_ready()
        shuf = Child.role("shuffler", port, n, timeout)
        shuf.wait_ready()
        pub, (shuf_res, agg_res) = case_fleet(
            port, n, qos=qos, receivers=[shuf, agg], timeout=timeout
        )
        out["shuffler ingest, aggregator running"] = shuf_res
        e2e = dict(agg_res)
        if agg_res["last"] is not None and agg_res["count"]:
            e2e["rate"] = agg_res["count"] / (agg_res["last"] - pub["start"])
        out["fleet -> shuffler -> aggregator (e2e)"] = e2e
    return out


def _median(values: list[float | None]) -> float | None:
    real = [v for v in values if v is not None]
    return statistics.median(real) if real else None


def _fmt(rate: float | None) -> str:
    return "-" if rate is None else f"{rate:,.0f}"


GOALS = {  # issue: shuffler ingest >= 0.6 of raw in every repeat, end to end >= 0.4
    "fleet -> shuffler (ingest)": 0.6,
    "fleet -> shuffler, durable state (ingest)": 0.6,
    "fleet -> shuffler -> aggregator (e2e)": 0.4,
}


def report(runs: dict[int, list[dict[str, dict[str, Any]]]], n: int) -> dict[str, Any]:
    """Print each case's rates and its ratio to raw, repeat by repeat (each repeat's cases
    run one after the other, so a ratio compares measurements minutes apart at most)."""
    summary: dict[str, Any] = {}
    for qos, reps in runs.items():
        print(f"\nQoS {qos} ({n:,} messages of 16 bytes, {len(reps)} repeat(s), msgs/s)")
        print(f"{'case':42} {'median':>9} {'runs':>26} {'received':>9} {'cpu s':>6}")
        cases: dict[str, Any] = {}
        for case in reps[0]:
            rates = [rep[case]["rate"] for rep in reps]
            counts = [rep[case]["count"] for rep in reps]
            cpus = [rep[case].get("cpu_s") for rep in reps]
            med = _median(rates)
            cpu = _median(cpus)
            cases[case] = {"median": med, "rates": rates, "counts": counts, "cpu_s": cpus}
            runs_txt = " ".join(_fmt(r) for r in rates)
            cpu_txt = "" if cpu is None else f"{cpu:6.1f}"
            print(f"{case:42} {_fmt(med):>9} {runs_txt:>26} {min(counts):>9,} {cpu_txt:>6}")
        print("ratios to raw (fleet -> mosquitto_sub of the same repeat): min / median / max")
        ratios: dict[str, dict[str, float]] = {}
        for case in cases:
            if case == "fleet -> mosquitto_sub":
                continue
            per_repeat = [
                rep[case]["rate"] / rep["fleet -> mosquitto_sub"]["rate"]
                for rep in reps
                if rep[case]["rate"] and rep["fleet -> mosquitto_sub"]["rate"]
            ]
            if not per_repeat:
                continue
            ratios[case] = {
                "min": min(per_repeat),
                "median": statistics.median(per_repeat),
                "max": max(per_repeat),
            }
            r = ratios[case]
            goal = GOALS.get(case)
            verdict = ""
            if goal is not None:
                met = len(per_repeat) == len(reps) and r["min"] >= goal
                verdict = f"  goal >= {goal} in every repeat: {'met' if met else 'NOT met'}"
            print(f"  {case:42} {r['min']:.3f} / {r['median']:.3f} / {r['max']:.3f}{verdict}")
        summary[f"qos{qos}"] = {"cases": cases, "ratios": ratios}
    return summary


def orchestrate(args: argparse.Namespace) -> None:
    gmqtt_ok = importlib.util.find_spec("gmqtt") is not None
    clients = [c for c in CLIENTS if c != "gmqtt" or gmqtt_ok]
    if not gmqtt_ok:
        print("gmqtt not installed (.venv/bin/pip install gmqtt): skipped")
    for tool in ("mosquitto_pub", "mosquitto_sub", MOSQUITTO):
        if shutil.which(tool) is None:
            raise SystemExit(f"{tool} not found")
    n = args.messages
    runs: dict[int, list[dict[str, dict[str, Any]]]] = {}
    with tempfile.TemporaryDirectory() as tmp, own_mosquitto(Path(tmp)) as port:
        os.environ[KEY_ENV] = str(Path(tmp) / "signing.key")  # children inherit it
        from edge.batch_auth import load_or_create_signing_key  # noqa: PLC0415

        load_or_create_signing_key(Path(os.environ[KEY_ENV]))  # the shufflers never create it
        print(f"own mosquitto on 127.0.0.1:{port}; {n:,} messages of as many devices")
        lines = Path(tmp) / "lines.txt"
        lines.write_bytes(b"".join(b"%016d\n" % i for i in range(n)))
        for rep in range(args.repeats):
            for qos in args.qos:
                print(f"repeat {rep + 1}/{args.repeats}, QoS {qos} ...", flush=True)
                once = run_once(
                    port,
                    n,
                    qos=qos,
                    lines=lines,
                    clients=clients,
                    timeout=args.timeout,
                    cases=args.cases,
                )
                runs.setdefault(qos, []).append(once)
                for case, res in once.items():
                    print(f"  {case:40} {_fmt(res['rate']):>10} ({res['count']:,} received)")
    summary = report(runs, n)
    if args.json:
        doc = {
            "messages": n,
            "repeats": args.repeats,
            "cpus": os.cpu_count(),
            "runs": {str(q): r for q, r in runs.items()},
            "summary": summary,
        }
        Path(args.json).write_text(json.dumps(doc, indent=2))


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--messages", type=int, default=100_000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--qos", type=int, nargs="+", default=[0, 1], choices=[0, 1])
    parser.add_argument("--timeout", type=float, default=120.0)
    parser.add_argument("--json", default=None)
    parser.add_argument(
        "--cases",
        nargs="+",
        default=list(CASES),
        choices=CASES,
        help="groups of cases to run (default: all); the raw case always runs",
    )
    parser.add_argument("--role", nargs="+", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.role is None:
        orchestrate(args)
        return
    role, *rest = args.role
    if role == "publish":
        port, n, qos = map(int, rest)
        fleet_publish(port, n, qos)
        return
    port, n = int(rest[0]), int(rest[1])
    timeout = float(rest[2])
    if role == "sink-paho":
        sink_paho(port, n, timeout)
    elif role == "sink-aiomqtt":
        asyncio.run(_sink_aiomqtt(port, n, timeout))
    elif role == "sink-aiomqtt-v5":
        asyncio.run(_sink_aiomqtt(port, n, timeout, v5=True))
    elif role == "sink-gmqtt":
        asyncio.run(_sink_gmqtt(port, n, timeout))
    elif role == "shuffler":
        asyncio.run(_run_shuffler(port, n, timeout, *rest[3:5]))
    elif role == "aggregator":
        asyncio.run(_run_aggregator(port, n, timeout))
    else:
        raise SystemExit(f"unknown role {role}")


if __name__ == "__main__":
    main()
