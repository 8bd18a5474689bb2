"""The roles of bench/bench_pipeline.py, each run in a process of its own (``bench_pipeline.py
--role ...``): it prints ``READY`` once it can receive (or, the publisher, send), then one
JSON line with its result and the CPU seconds of its whole process."""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import json
import os
import resource
import socket
import sys
import threading
import time
from collections.abc import Callable, Sequence
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
ROUND_SECONDS = 3600
KEY_ENV = "COCO_BENCH_SIGNING_KEY"  # the shufflers' batch key, made by orchestrate()


def _ready() -> None:
    print("READY", flush=True)


def _emit(result: dict[str, Any]) -> None:
    usage = resource.getrusage(resource.RUSAGE_SELF)  # the whole process: every thread
    print(json.dumps({**result, "cpu_s": usage.ru_utime + usage.ru_stime}), flush=True)


def rate_of(count: int, first: float | None, last: float | None) -> float | None:
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
            "rate": rate_of(self.count, self.first, self.last),
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


def run(role: str, rest: Sequence[str]) -> None:
    """Play ``role`` with its command-line arguments ``rest``."""
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
