"""One hostile device (or batch publisher) against the whole pipeline, while 1,000 honest
devices report: every row of issue 9's table, over a real Mosquitto and the real services.

Each test runs a broker, the shuffler (durable state directory, signed batches; in this
process, or as ``coco shuffler``), the aggregator (verifying, ``min_batch`` enforced, from a
checkpoint), a recorder of the batch topic and a
:class:`~sim.fleet.run.Fleet` of :data:`HONEST` devices (one MQTT connection each, 2 s wall-clock
rounds), makes its attack alongside and then checks, exactly:

* every honest report the broker acknowledged (``Fleet(on_acked=...)``: its ``(round, seed,
  z)``) is in a batch the shuffler released (the recorder) and in the aggregator's sums
  (its ``n``), no more and no fewer: the attacker's reports count only where one is
  legitimate (one report of its own per round);
* the attack is refused and counted by its reason: the shuffler's
  ``coco_shuffler_reports_rejected_total{reason}``, the aggregator's
  ``coco_aggregator_batches_rejected_total{reason}``, or the broker's CONNACK / PUBACK /
  DISCONNECT reason codes; every other reason stays at zero;
* no log record of the shuffler, the aggregator or the MQTT libraries names a device or
  holds a report's ``seed`` (every test captures at DEBUG).

Where identity or size limits matter the broker runs the shipped
deploy/mosquitto/mosquitto.conf with the dynamic-security accounts that ``coco
credentials`` writes (as :mod:`tests.deploy.test_acl` does), every device with its own account;
the rows about the services' own checks (a 65-character device id has no account there)
use an open broker, as a deployment whose ACL failed would be.

The issue's rows: (1) hostile round numbers ``test_round_numbers_at_the_end_of_time...``;
(2) replays after a restart ``test_a_report_replayed_after_a_shuffler_restart...`` and
after a crash ``..._the_shuffler_is_killed...``; (3) client ids of other devices and of
the services ``test_no_device_takes_another_devices_or_a_services_client_id`` (and,
pinned as a known gap, a service account taking another service's id); (4) huge messages
``test_huge_messages...``; (5) forged and replayed batches ``test_forged_and_replayed...``;
(6) logs at DEBUG: every test, plus ``test_debug_logs...`` and ``test_coco_shuffler_at_debug...``;
(7) ``test_a_65_character_device_id_and_a_retained_report_are_rejected``; and a flood of
small messages within the size limit ``test_a_flood_on_the_devices_own_topic...``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import os
import random
import re
import socket
import struct
import subprocess
import sys
from collections import Counter
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import aiomqtt
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from prometheus_client import CollectorRegistry
from typer.testing import CliRunner

from aggregator.accountant import amplify_spec
from aggregator.ledger import accountant_process
from aggregator.service.config import AggregatorConfig
from aggregator.service.metric_labels import REJECT_REASONS as BATCH_REJECT_REASONS
from aggregator.service.service import Aggregator
from broker.service.metrics import DROP_REASONS, REJECT_REASONS
from broker.service.shuffler import Shuffler, ShufflerConfig
from edge.batch_auth import (
    SIGNATURE_SIZE,
    BatchAuthError,
    BatchSigner,
    BatchVerifier,
    load_or_create_signing_key,
    public_key_hex,
)
from edge.codec import decode_batch, encode_batch, encode_report
from edge.rounds import current_round
from edge.spec import MechanismSpec
from edge.topics import batches_topic, ingress_topic
from sim.cli import app
from sim.credentials.accounts import SERVICE_ACCOUNTS, device_id, device_password, service_password
from sim.fleet.run import Fleet, FleetConfig
from tests import pipeline as scaffolding
from tests import service_http, waiting
from tests.asyncutil import run, value, wait_until
from tests.conftest import MOSQUITTO, PLUGIN, Broker, free_port
from tests.conftest import shipped_broker as start_shipped_broker

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

DEP = "fleet"
SPEC = MechanismSpec(mechanism="coco", d=6, s=2, epsilon=1.0)
FP = SPEC.fingerprint_int
HONEST = 1000
ROUNDS = 3
ROUND_SECONDS = 2
MAX_SKEW = 5.0
"""The shuffler's ``max_skew`` (its default): a round stays open that long after its end. It
also covers the time a report waits in the broker and the shuffler's ingest on a loaded
machine; at 0.5 s, under load 9 on 2 cores, 580 of a round's 1,000 honest reports arrived
after their round had closed (``round_too_old``)."""
MIN_BATCH = 100
DELTA = 1e-6
SECRET = b"hostile devices suite secret"
ATTACKER = device_id(HONEST)  # an account of its own, beside the fleet's dev-000000..999
SIGNING_SEED = bytes(range(32))
SIGNER = BatchSigner(Ed25519PrivateKey.from_private_bytes(SIGNING_SEED), DEP)
FORGER = BatchSigner(Ed25519PrivateKey.from_private_bytes(bytes(range(32, 64))), DEP)
TIMEOUT = 30.0
"""Seconds a wait gives a pipeline whose progress (:meth:`Pipeline.progress`) stands still
(tests/waiting.py; scaled by COCO_TEST_TIMEOUT_SCALE)."""
PRIVACY_WAIT = 120.0
"""The same for the accountant's process (nice +10), whose CPU time is its progress."""
SUCCESS = 0x00
NOT_AUTHORIZED = 0x87
PACKET_TOO_LARGE = 0x95
HUGE = 100 * 1024 * 1024  # the 3 x 100 MB: streamed, never held in memory


# -- the stack -------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def dynsec_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The dynamic-security configuration ``coco credentials`` writes: HONEST + 1 devices
    (the attacker has its own account) and the service accounts (written once: 1,001
    password hashes take a while)."""
    workdir = tmp_path_factory.mktemp("credentials")
    secret_file = workdir / "secret"
    secret_file.write_bytes(SECRET)
    dynsec = workdir / "dynamic-security.json"
    services = [arg for name in SERVICE_ACCOUNTS for arg in ("--service", name)]
    args = ["credentials", "--secret-file", str(secret_file), "--devices", str(HONEST + 1)]
    result = CliRunner().invoke(
        app, [*args, *services, "--deployment", DEP, "--dynsec-out", str(dynsec)]
    )
    assert result.exit_code == 0, result.output
    return dynsec


@pytest.fixture
def shipped_broker(tmp_path: Path, dynsec_file: Path) -> Iterator[Broker]:
    """deploy/mosquitto/mosquitto.conf (accounts, client ids bound to devices, packet size
    cap), adapted only in its paths and listener."""
    if not Path(MOSQUITTO).exists():
        pytest.skip("mosquitto is not installed (apt-get install mosquitto)")
    if PLUGIN is None:
        pytest.skip("mosquitto's dynamic-security plugin is not installed")
    broker = start_shipped_broker(tmp_path, PLUGIN, dynsec_file)
    broker.start()
    try:
        yield broker
    finally:
        broker.stop()


def password(user: str) -> str:
    if user in SERVICE_ACCOUNTS:
        return service_password(SECRET, user)
    return device_password(SECRET, user)


@dataclass
class ShufflerProcess:
    """``coco shuffler`` in its own process, ``COCO_LOG_LEVEL=debug``, stderr to a file."""

    proc: subprocess.Popen[bytes]
    metrics_port: int
    log: Path

    def samples(self) -> dict[tuple[str, service_http.Labels], float]:
        """Every sample of its ``/metrics``, by name and labels (:class:`OSError` while it
        does not answer)."""
        found = service_http.samples(self.metrics_port, timeout=5)
        if found is None:
            raise OSError(f"coco shuffler's /metrics on port {self.metrics_port} does not answer")
        return found

    def metric(self, name: str, **labels: str) -> float:
        return self.samples().get((name, tuple(sorted(labels.items()))), 0.0)

    def connected(self) -> bool:
        if self.proc.poll() is not None:
            raise AssertionError(f"coco shuffler exited: {self.log.read_text()}")
        try:
            return self.metric("coco_shuffler_connected") == 1
        except OSError:
            return False  # not serving /metrics yet

    def stop(self) -> list[str]:
        """SIGTERM (a graceful stop); the lines it logged."""
        self.proc.terminate()
        try:
            self.proc.wait(timeout=waiting.scaled(TIMEOUT))
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        return self.log.read_text().splitlines()


@dataclass
class Pipeline:
    """Broker, shuffler, aggregator, batch recorder and fleet of one test."""

    broker: Broker
    workdir: Path
    accounts: bool
    acked: list[tuple[int, int, int]] = field(default_factory=list)
    batches: dict[bytes, bytes] = field(default_factory=dict)
    """Every genuine batch seen on the batch topic, by id (its sealed payload)."""
    foreign: list[bytes] = field(default_factory=list)
    """Every message on the batch topic that the shuffler's key does not verify."""
    planted: set[bytes] = field(default_factory=set)
    """Ids of batches the test sealed with the shuffler's key itself (not released by it)."""
    shuffler_registries: list[CollectorRegistry] = field(default_factory=list)
    aggregator_registries: list[CollectorRegistry] = field(default_factory=list)
    shuffler: Shuffler | None = None
    shuffler_task: asyncio.Task[None] | None = None
    aggregator: Aggregator | None = None
    aggregator_task: asyncio.Task[None] | None = None
    process: ShufflerProcess | None = None
    killed_totals: Counter[tuple[str, tuple[tuple[str, str], ...]]] = field(default_factory=Counter)
    """The counters of ``coco shuffler`` processes killed so far (read just before)."""
    fleet: Fleet | None = None
    lost: list[str] = field(default_factory=list)
    """Client ids of fleet connections the broker closed."""

    def credentials(self, user: str) -> dict[str, str | None]:
        if not self.accounts:
            return {"username": None, "password": None}
        return {"username": user, "password": password(user)}

    def shuffler_config(self) -> ShufflerConfig:
        return ShufflerConfig(
            broker=self.broker.url,
            deployment=DEP,
            spec=SPEC,
            min_batch=MIN_BATCH,
            round_seconds=ROUND_SECONDS,
            max_skew=MAX_SKEW,
            late_seconds=30.0,
            flush_interval=0.1,
            state_dir=self.workdir / "shuffler-state",
            signer=SIGNER,
            drain_timeout=5.0,
            session_expiry=300,
            **self.credentials("shuffler"),  # type: ignore[arg-type]
        )

    def aggregator_config(self) -> AggregatorConfig:
        return AggregatorConfig(
            broker=self.broker.url,
            deployment=DEP,
            spec=SPEC,
            delta=DELTA,
            batch_public_key=SIGNER.public_key_hex,
            min_batch=MIN_BATCH,
            round_seconds=ROUND_SECONDS,
            http_port=None,
            checkpoint=self.workdir / "aggregator" / "checkpoint.json",
            checkpoint_interval=0.5,
            session_expiry=300,
            lease_timeout=5.0,
            **self.credentials("aggregator"),  # type: ignore[arg-type]
        )

    def fleet_config(self, seed: int) -> FleetConfig:
        return FleetConfig(
            broker=self.broker.url,
            deployment=DEP,
            spec=SPEC,
            devices=HONEST,
            round_seconds=ROUND_SECONDS,
            rounds=ROUNDS,
            round_offset=0.1,
            round_spread=0.6,
            seed=seed,
            credentials_secret=SECRET if self.accounts else None,
        )

    # -- services --

    async def start_shuffler(self) -> Shuffler:
        self.shuffler_registries.append(CollectorRegistry())
        shuffler = Shuffler(self.shuffler_config(), registry=self.shuffler_registries[-1])
        self.shuffler = shuffler
        self.shuffler_task = await scaffolding.start(shuffler)
        return shuffler

    async def stop_shuffler(self) -> None:
        assert self.shuffler is not None
        assert self.shuffler_task is not None
        await scaffolding.stop_shuffler(self.shuffler, self.shuffler_task)
        self.shuffler = self.shuffler_task = None

    @property
    def aggregator_registry(self) -> CollectorRegistry:
        """The running (or last) aggregator's metrics: its counters continue from its
        checkpoint, so the last incarnation's are the totals."""
        return self.aggregator_registries[-1]

    async def start_aggregator(self) -> Aggregator:
        self.aggregator_registries.append(CollectorRegistry())
        aggregator = Aggregator(self.aggregator_config(), registry=self.aggregator_registry)
        self.aggregator = aggregator
        self.aggregator_task = await scaffolding.start(aggregator)
        return aggregator

    async def stop_aggregator(self) -> None:
        """Stop gracefully: the final checkpoint, then the PUBACKs it covers."""
        assert self.aggregator is not None
        assert self.aggregator_task is not None
        await scaffolding.stop_aggregator(self.aggregator, self.aggregator_task)
        self.aggregator_task = None

    async def start_shuffler_process(self) -> ShufflerProcess:
        """The same shuffler as :meth:`shuffler_config`, as ``coco shuffler``."""
        key_path = self.workdir / "signing.key"  # the format `coco shuffler` reads
        key_path.write_text(SIGNING_SEED.hex() + "\n")
        key_path.chmod(0o600)
        assert public_key_hex(load_or_create_signing_key(key_path)) == SIGNER.public_key_hex
        spec_file = self.workdir / "spec.json"
        spec_file.write_text(json.dumps(SPEC.to_dict()))
        password_file = self.workdir / "shuffler-password"
        password_file.write_text(password("shuffler") + "\n")
        metrics_port = free_port()
        log = self.workdir / f"shuffler-{metrics_port}.log"
        args = [
            *("--broker", self.broker.url, "--deployment", DEP, "--spec", str(spec_file)),
            *("--min-batch", str(MIN_BATCH), "--round-seconds", str(ROUND_SECONDS)),
            *("--max-skew", str(MAX_SKEW), "--late-seconds", "30", "--flush-interval", "0.1"),
            *("--state-dir", str(self.workdir / "shuffler-state")),
            *("--signing-key", str(key_path), "--metrics-port", str(metrics_port)),
            *("--username", "shuffler", "--password-file", str(password_file)),
        ]
        with log.open("wb") as stderr:
            proc = subprocess.Popen(
                [str(Path(sys.executable).with_name("coco")), "shuffler", *args],
                stdout=subprocess.DEVNULL,
                stderr=stderr,
                env={**os.environ, "COCO_LOG_LEVEL": "debug"},
            )
        self.process = ShufflerProcess(proc, metrics_port, log)
        await wait_until(self.process.connected, TIMEOUT, progress=self.progress)
        return self.process

    def kill_shuffler_process(self) -> None:
        """SIGKILL, as a crash: no drain, no final write. Its counters are kept first."""
        assert self.process is not None
        for key, count in self.process.samples().items():
            if key[0].endswith("_total"):
                self.killed_totals[key] += int(count)
        self.process.proc.kill()
        self.process.proc.wait()
        self.process = None

    def progress(self) -> tuple[object, ...]:
        """What moves while the pipeline works (tests/waiting.py): reports acknowledged,
        batches seen, the shuffler's and the aggregator's counters, the fleet's rounds and
        connections, the accountant's CPU time (a `coco shuffler` process's work shows in its
        counters)."""
        try:
            counters: tuple[object, ...] = (
                *(
                    self.shuffled(f"coco_shuffler_reports_{name}_total")
                    for name in ("received", "accepted", "released")
                ),
                self.rejected(),
            )
        except OSError:  # a `coco shuffler` not serving /metrics (yet, or any more)
            counters = ()
        fleet = self.fleet
        return (
            len(self.acked),
            len(self.batches),
            len(self.foreign),
            counters,
            None if self.aggregator is None else self.aggregator.state.n,
            None if fleet is None else (fleet.stats.rounds_completed, fleet.connected),
            waiting.cpu_seconds(accountant_process.worker_pid()),
        )

    def backlog(self) -> float:
        """Reports the running shuffler holds in pools or unacknowledged batches."""
        if self.process is not None:
            names = ("coco_shuffler_buffer_reports", "coco_shuffler_outbox_reports")
            return sum(self.process.metric(name) for name in names)
        assert self.shuffler is not None
        return self.shuffler.core.buffered + self.shuffler.core.outbox_reports

    def shuffled(self, name: str, **labels: str) -> float:
        """A shuffler metric: of the ``coco shuffler`` process, or summed over the
        in-process incarnations (one registry each)."""
        if self.process is not None:
            before = self.killed_totals[(name, tuple(sorted(labels.items())))]
            return before + self.process.metric(name, **labels)
        return sum(value(r, name, **labels) for r in self.shuffler_registries)

    def rejected(self) -> dict[str, int]:
        counts = {
            r: int(self.shuffled("coco_shuffler_reports_rejected_total", reason=r))
            for r in REJECT_REASONS
        }
        return {r: n for r, n in counts.items() if n}

    def batches_rejected(self) -> dict[str, int]:
        registry = self.aggregator_registry
        counts = {
            r: int(value(registry, "coco_aggregator_batches_rejected_total", reason=r))
            for r in BATCH_REJECT_REASONS
        }
        return {r: n for r, n in counts.items() if n}

    def recording(self) -> contextlib.AbstractAsyncContextManager[scaffolding.BatchRecorder]:
        """Every message on the batch topic (the aggregator's account where accounts
        exist: it is the one that may read batches), sorted into genuine and foreign."""
        verifier = BatchVerifier(SIGNER.public_key_hex, DEP)

        def sort(payload: bytes) -> None:
            try:
                inner = bytes(verifier.open(payload))
            except BatchAuthError:
                self.foreign.append(payload)
                return
            batch_id = decode_batch(inner)[2]
            if batch_id not in self.planted:
                self.batches[batch_id] = payload

        return scaffolding.recording(
            self.broker.port,
            DEP,
            sort,
            identifier="hostile-suite-recorder",
            protocol=aiomqtt.ProtocolVersion.V5,
            **self.credentials("aggregator"),
        )

    def released(self) -> Counter[tuple[int, int]]:
        """``(seed, z)`` of every record of every genuine batch."""
        out: Counter[tuple[int, int]] = Counter()
        for payload in self.batches.values():
            _, _, _, seeds, zs = decode_batch(payload[:-SIGNATURE_SIZE])
            out.update(zip(seeds, zs, strict=True))
        return out

    def batch_sizes(self) -> list[int]:
        return [len(decode_batch(p[:-SIGNATURE_SIZE])[3]) for p in self.batches.values()]


@contextlib.asynccontextmanager
async def pipeline(
    broker: Broker, workdir: Path, *, accounts: bool, shuffler_process: bool = False
) -> AsyncIterator[Pipeline]:
    """The services running: recorder subscribed, shuffler and aggregator connected."""
    p = Pipeline(broker, workdir, accounts=accounts)
    async with p.recording():
        (workdir / "aggregator").mkdir()
        if shuffler_process:
            await p.start_shuffler_process()
        else:
            await p.start_shuffler()
        await p.start_aggregator()
        try:
            yield p
        finally:
            if p.aggregator_task is not None:
                await p.stop_aggregator()
            if p.shuffler is not None:
                await p.stop_shuffler()
            if p.process is not None and p.process.proc.poll() is None:
                p.process.stop()


async def run_fleet(p: Pipeline, attack: Callable[[], object], *, seed: int) -> None:
    """Run the fleet's ROUNDS rounds with ``attack()`` (a coroutine) alongside, then wait
    until everything accepted is released and aggregated."""
    fleet = Fleet(p.fleet_config(seed), on_acked=lambda *report: p.acked.append(report))
    lose = fleet._lost

    def lost(conn: object) -> None:
        if fleet.stats.rounds_completed < ROUNDS:  # not the closing at the end of the run
            p.lost.append(str(getattr(getattr(conn, "client", None), "_client_id", "?")))
        lose(conn)  # type: ignore[arg-type]

    fleet._lost = lost  # type: ignore[method-assign]
    p.fleet = fleet
    coro = attack()
    assert asyncio.iscoroutine(coro)
    summary, _ = await asyncio.gather(fleet.run(), coro)
    assert summary["rounds_completed"] == ROUNDS

    def settled() -> bool:
        accepted = p.shuffled("coco_shuffler_reports_accepted_total")
        released = p.shuffled("coco_shuffler_reports_released_total")
        assert p.aggregator is not None
        return (
            accepted >= len(p.acked)
            and released == accepted
            and p.backlog() == 0
            and p.aggregator.state.n == released
            and sum(p.released().values()) == released
        )

    await wait_until(settled, TIMEOUT, progress=p.progress)
    # the privacy level is computed off the loop, in the accountant's low-priority process:
    # on a loaded machine it waits for a CPU longest
    aggregator = p.aggregator
    assert aggregator is not None
    await wait_until(lambda: aggregator.privacy_settled, PRIVACY_WAIT, progress=p.progress)

    def accounted() -> bool:  # the accountant's process has caught up with the batches
        assert p.aggregator is not None
        level = p.aggregator_registry.get_sample_value(
            "coco_aggregator_epsilon_central", {"batch": "smallest"}
        )
        return level is not None and not math.isnan(level)

    await wait_until(accounted, TIMEOUT, progress=p.progress)


def check_honest_reports_all_aggregated(
    p: Pipeline, extra: Counter[tuple[int, int]] | None = None, *, charged: int | None = None
) -> None:
    """Every acknowledged honest report (and ``extra``, the attacker's legitimate ones) is
    released once and aggregated once; nothing else is. ``charged``: the size of a smaller
    release signed by the trusted key and refused (never applied, yet charged)."""
    extra = extra or Counter()
    # Every honest device's every report was acknowledged: none was lost to the attack.
    assert len(p.acked) == HONEST * ROUNDS
    assert p.fleet is not None
    assert p.fleet.published == HONEST * ROUNDS
    assert p.lost == []
    expected = Counter((seed, z) for _round, seed, z in p.acked) + extra
    assert p.released() == expected
    assert p.aggregator is not None
    assert p.aggregator.state.n == expected.total()
    assert value(p.aggregator_registry, "coco_aggregator_reports_total") == expected.total()
    assert p.shuffled("coco_shuffler_reports_released_total") == expected.total()
    assert all(size >= MIN_BATCH for size in p.batch_sizes())
    assert not any(p.shuffled("coco_shuffler_dropped_total", reason=r) for r in DROP_REASONS)
    # epsilon_central certifies the smallest genuine release, nothing smaller.
    smallest = min(p.batch_sizes())
    assert p.aggregator.smallest_batch == smallest
    level = smallest if charged is None else min(smallest, charged)
    assert value(
        p.aggregator_registry, "coco_aggregator_epsilon_central", batch="smallest"
    ) == pytest.approx(amplify_spec(SPEC, n=level, delta=DELTA).epsilon_central)


_NUMBER = re.compile(r"(?<![0-9A-Za-z])[0-9]+(?![0-9A-Za-z])")
_HEX8 = re.compile(r"(?<![0-9A-Fa-f])[0-9A-Fa-f]{8}(?![0-9A-Fa-f])")


def check_logs_link_nothing(records: list[logging.LogRecord], p: Pipeline) -> None:
    """No record of the services or the MQTT libraries (the simulated devices' own
    ``sim.*`` logs aside) names a device or holds an honest report's seed."""
    formatter = logging.Formatter("%(name)s %(levelname)s %(message)s")
    check_lines_link_nothing(
        [formatter.format(r) for r in records if not r.name.startswith("sim.")], p
    )


def check_lines_link_nothing(lines: list[str], p: Pipeline) -> None:
    assert lines, "nothing was logged: the capture is not working"
    seeds = {seed for _round, seed, _z in p.acked}
    hex_seeds = {f"{seed:08x}" for seed in seeds}
    for line in lines:
        assert "dev-" not in line, line  # a device id (the fleet's and the attacker's)
        assert not seeds & {int(n) for n in _NUMBER.findall(line)}, line
        assert not hex_seeds & {h.lower() for h in _HEX8.findall(line)}, line


@pytest.fixture
def debug_logs(caplog: pytest.LogCaptureFixture) -> pytest.LogCaptureFixture:
    caplog.set_level(logging.DEBUG)
    # and the MQTT library's logger itself, which `coco fleet` (run in-process by other
    # tests) raises to WARNING: this test must see what it would print at DEBUG
    caplog.set_level(logging.DEBUG, logger="gmqtt")
    return caplog


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte, n = n % 128, n // 128
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _string(text: str) -> bytes:
    data = text.encode()
    return struct.pack("!H", len(data)) + data


def _packet_header(kind: int, length: int) -> bytes:
    return bytes([kind]) + _varint(length)


def connect_packet(client_id: str, username: str | None, password_: str | None) -> bytes:
    """An MQTT 5 CONNECT with clean start, no properties."""
    flags = 0x02 | (0xC0 if username is not None else 0)
    body = _string("MQTT") + bytes([5, flags]) + struct.pack("!H", 60) + b"\x00"
    body += _string(client_id)
    if username is not None and password_ is not None:
        body += _string(username) + _string(password_)
    return _packet_header(0x10, len(body)) + body


class RawClient:
    """A minimal MQTT 5 client on asyncio streams that reports the broker's reason codes
    (paho's threaded loop uses ``select``, which fails beside the fleet's 1,000 sockets)."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer
        self.packet_id = 0

    @classmethod
    async def connect(
        cls, port: int, client_id: str, username: str | None, password_: str | None
    ) -> tuple[RawClient, int]:
        """The client and the CONNACK's reason code."""
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        client = cls(reader, writer)
        writer.write(connect_packet(client_id, username, password_))
        kind, body = await client.read()
        assert kind == 0x20, hex(kind)
        return client, body[1]

    async def read(self) -> tuple[int, bytes]:
        """The next packet's type byte and body (``(0, b"")`` at the end of the stream)."""
        async with asyncio.timeout(waiting.scaled(TIMEOUT)):
            try:
                first = await self.reader.readexactly(1)
            except asyncio.IncompleteReadError:
                return 0, b""
            length, shift = 0, 0
            while True:
                byte = (await self.reader.readexactly(1))[0]
                length |= (byte & 0x7F) << shift
                shift += 7
                if not byte & 0x80:
                    break
            return first[0], await self.reader.readexactly(length)

    async def publish(self, topic: str, payload: bytes, *, retain: bool = False) -> int:
        """Publish at QoS 1; the PUBACK's reason code."""
        self.packet_id += 1
        body = _string(topic) + struct.pack("!H", self.packet_id) + b"\x00" + payload
        self.writer.write(_packet_header(0x32 | int(retain), len(body)) + body)
        kind, ack = await self.read()
        assert kind == 0x40, (kind, ack)
        assert struct.unpack("!H", ack[:2])[0] == self.packet_id
        return ack[2] if len(ack) > 2 else SUCCESS

    async def close(self) -> None:
        with contextlib.suppress(OSError):
            self.writer.write(b"\xe0\x00")  # DISCONNECT, normal
            await self.writer.drain()
        self.writer.close()
        with contextlib.suppress(OSError):
            await self.writer.wait_closed()


@contextlib.asynccontextmanager
async def attacker(p: Pipeline, client_id: str = ATTACKER) -> AsyncIterator[RawClient]:
    """The attacker's own account (anonymous on the open broker), connected."""
    creds = p.credentials(ATTACKER)
    client, code = await RawClient.connect(
        p.broker.port, client_id, creds["username"], creds["password"]
    )
    try:
        assert code == SUCCESS, hex(code)
        yield client
    finally:
        await client.close()


async def fleet_connected(p: Pipeline) -> None:
    await wait_until(
        lambda: p.fleet is not None and p.fleet.connected == HONEST, TIMEOUT, progress=p.progress
    )


async def rounds_completed(p: Pipeline, count: int) -> None:
    await wait_until(
        lambda: p.fleet is not None and p.fleet.stats.rounds_completed >= count,
        TIMEOUT,
        progress=p.progress,
    )


def report_now(seed: int, z: int = 0, *, round_: int | None = None, fp: int = FP) -> bytes:
    return encode_report(fp, current_round(ROUND_SECONDS) if round_ is None else round_, seed, z)


ACCEPTED = (SUCCESS, 0x10)  # PUBACK: Success, No matching subscribers


# -- row 1: hostile round numbers ------------------------------------------------------------


def test_round_numbers_at_the_end_of_time_and_zero_change_nothing(
    shipped_broker: Broker, tmp_path: Path, debug_logs: pytest.LogCaptureFixture
) -> None:
    """Reports of rounds 0xfffffff8..0xffffffff and 0 on the device's own topic (the
    broker accepts them: its own topic) are rejected by the round window before, between
    and after the fleet's rounds; every honest round is still accepted whole."""
    hostile = [*range(0xFFFFFFF8, 0x1_0000_0000), 0]

    async def scenario() -> Pipeline:
        async with pipeline(shipped_broker, tmp_path, accounts=True) as p:

            async def attack() -> None:
                async with attacker(p) as device:
                    for wave in range(ROUNDS):
                        await fleet_connected(p) if wave == 0 else await rounds_completed(p, wave)
                        for i, round_ in enumerate(hostile):
                            topic = ingress_topic(DEP, ATTACKER)
                            code = await device.publish(topic, report_now(i, round_=round_))
                            assert code in ACCEPTED

            await run_fleet(p, attack, seed=1)
            return p

    p = run(scenario(), 240)
    waves = ROUNDS
    assert p.rejected() == {"round_in_future": 8 * waves, "round_too_old": 1 * waves}
    assert p.shuffled("coco_shuffler_reports_received_total") == HONEST * ROUNDS + 9 * waves
    check_honest_reports_all_aggregated(p)
    check_logs_link_nothing(debug_logs.records, p)


# -- row 2: a replay after a shuffler restart -------------------------------------------------


def test_a_report_replayed_after_its_round_was_released_is_refused_across_a_restart(
    shipped_broker: Broker, tmp_path: Path, debug_logs: pytest.LogCaptureFixture
) -> None:
    """The shuffler stops and restarts twice (same state directory): once while the fleet
    publishes (what it had not handled stays with the session and goes to the next run;
    nothing it handled comes back, so no honest report is a duplicate), and once after the
    attacker's report of a round was released. The attacker then sends the same bytes
    again, and another report of that round: the round is closed (released), across the
    restart too, so both are ``round_too_old``, exactly, and its report counts once."""
    genuine = (4242, 3)

    def duplicates(registry: CollectorRegistry) -> float:
        return value(registry, "coco_shuffler_reports_rejected_total", reason="duplicate_in_round")

    def too_old(registry: CollectorRegistry) -> float:
        return value(registry, "coco_shuffler_reports_rejected_total", reason="round_too_old")

    async def scenario() -> Pipeline:
        async with pipeline(shipped_broker, tmp_path, accounts=True) as p:

            async def attack() -> None:
                topic = ingress_topic(DEP, ATTACKER)
                async with attacker(p) as device:
                    await wait_until(
                        lambda: len(p.acked) >= HONEST // 3, TIMEOUT, progress=p.progress
                    )
                    await p.stop_shuffler()  # while the fleet publishes its first round
                    await p.start_shuffler()
                    await rounds_completed(p, 1)
                    round_ = current_round(ROUND_SECONDS)
                    message = report_now(*genuine, round_=round_)
                    assert await device.publish(topic, message) in ACCEPTED
                    await wait_until(
                        lambda: p.released()[genuine] == 1, TIMEOUT, progress=p.progress
                    )
                    # The second round published and every report of it handled (the third
                    # may have begun: on a loaded machine the polls can miss the gap)
                    await rounds_completed(p, 2)
                    await wait_until(
                        lambda: (
                            p.shuffled("coco_shuffler_reports_accepted_total") >= 2 * HONEST + 1
                        ),
                        TIMEOUT,
                        progress=p.progress,
                    )
                    await p.stop_shuffler()
                    shuffler = await p.start_shuffler()
                    assert await device.publish(topic, message) in ACCEPTED
                    other = report_now(4343, 1, round_=round_)
                    assert await device.publish(topic, other) in ACCEPTED
                    registry = p.shuffler_registries[-1]
                    await wait_until(lambda: too_old(registry) == 2, TIMEOUT, progress=p.progress)
                    assert shuffler.failure is None

            await run_fleet(p, attack, seed=2)
            return p

    p = run(scenario(), 240)
    first, second, third = p.shuffler_registries
    assert duplicates(first) == duplicates(second) == duplicates(third) == 0
    assert too_old(third) == 2  # the attacker's replay and its second report
    assert p.rejected() == {"round_too_old": 2}
    assert p.shuffled("coco_shuffler_reports_accepted_total") == HONEST * ROUNDS + 1
    check_honest_reports_all_aggregated(p, extra=Counter([genuine]))
    check_logs_link_nothing(debug_logs.records, p)


def test_a_report_replayed_after_the_shuffler_is_killed_is_a_duplicate(
    shipped_broker: Broker, tmp_path: Path, debug_logs: pytest.LogCaptureFixture
) -> None:
    """``coco shuffler`` is killed (SIGKILL) right after it logged the attacker's report,
    before the report's round is released, and started again on the same state directory:
    the pooled report and its duplicate token survive, the report is released once, and
    the attacker's replay and second report of that round are duplicates, exactly."""
    genuine = (5151, 2)

    async def scenario() -> Pipeline:
        async with pipeline(shipped_broker, tmp_path, accounts=True, shuffler_process=True) as p:

            async def attack() -> None:
                topic = ingress_topic(DEP, ATTACKER)
                accepted = "coco_shuffler_reports_accepted_total"
                async with attacker(p) as device:
                    await rounds_completed(p, 1)
                    round_ = current_round(ROUND_SECONDS)
                    message = report_now(*genuine, round_=round_)
                    assert await device.publish(topic, message) in ACCEPTED
                    # The first round and the attacker's report handled (the next round may
                    # have begun: on a loaded machine the polls can miss the gap), the
                    # round not yet released (it stays open MAX_SKEW after its end): crash.
                    await wait_until(
                        lambda: p.shuffled(accepted) >= HONEST + 1, TIMEOUT, progress=p.progress
                    )
                    assert p.released()[genuine] == 0
                    p.kill_shuffler_process()
                    process = await p.start_shuffler_process()
                    recovered = process.metric("coco_shuffler_recovered_reports")
                    # the pools, from the state directory: the first round's and the
                    # attacker's report (less the first round if it was released: the
                    # attacker's round may be the next one), and what of the next had come in
                    released = p.killed_totals[("coco_shuffler_reports_released_total", ())]
                    assert released in (0, HONEST)
                    assert recovered >= HONEST + 1 - released
                    assert await device.publish(topic, message) in ACCEPTED
                    other = report_now(5252, 0, round_=round_)
                    assert await device.publish(topic, other) in ACCEPTED
                    reason = {"reason": "duplicate_in_round"}
                    await wait_until(
                        lambda: (
                            process.metric("coco_shuffler_reports_rejected_total", **reason) == 2
                        ),
                        TIMEOUT,
                        progress=p.progress,
                    )

            await run_fleet(p, attack, seed=9)
            assert p.rejected() == {"duplicate_in_round": 2}
            assert p.shuffled("coco_shuffler_reports_accepted_total") == HONEST * ROUNDS + 1
            check_honest_reports_all_aggregated(p, extra=Counter([genuine]))
            return p

    p = run(scenario(), 240)
    lines = [
        line for log in tmp_path.glob("shuffler-*.log") for line in log.read_text().splitlines()
    ]
    check_lines_link_nothing(lines, p)
    check_logs_link_nothing(debug_logs.records, p)


# -- row 3: another device's client id, a service's ------------------------------------------


def test_no_device_takes_another_devices_or_a_services_client_id(
    shipped_broker: Broker, tmp_path: Path, debug_logs: pytest.LogCaptureFixture
) -> None:
    """With its own valid credentials, the attacker connects as an honest device of the
    running fleet and as each service's connection: every CONNECT is refused, nobody is
    disconnected (no fleet connection lost, no shuffler reconnect, the aggregator's session
    never taken over) and the victims' reports all arrive."""
    codes: dict[str, int] = {}

    async def scenario() -> Pipeline:
        async with pipeline(shipped_broker, tmp_path, accounts=True) as p:

            async def attack() -> None:
                await rounds_completed(p, 1)
                assert p.fleet is not None
                victims = [p.fleet.ids[0], p.fleet.ids[-1], "shuffler", "shuffler-out"]
                creds = p.credentials(ATTACKER)
                for client_id in [*victims, "aggregator"]:
                    client, codes[client_id] = await RawClient.connect(
                        p.broker.port, client_id, creds["username"], creds["password"]
                    )
                    kind, _ = await client.read()  # the broker closes a refused connection
                    assert kind in (0, 0xE0)
                    await client.close()
                assert p.fleet.connected == HONEST
                assert p.aggregator is not None
                assert p.aggregator.subscribed.is_set()

            await run_fleet(p, attack, seed=3)
            assert p.shuffler is not None
            assert p.shuffler.failure is None
            assert value(p.shuffler_registries[-1], "coco_shuffler_connected") == 1
            return p

    p = run(scenario(), 240)
    assert codes == dict.fromkeys(codes, NOT_AUTHORIZED)
    assert len(codes) == 5
    assert p.shuffled("coco_shuffler_reconnects_total") == 0
    registry = p.aggregator_registry
    assert value(registry, "coco_aggregator_batches_unacknowledged_total", reason="taken_over") == 0
    assert p.rejected() == {}
    check_honest_reports_all_aggregated(p)
    check_logs_link_nothing(debug_logs.records, p)


def test_the_announcer_account_cannot_take_a_services_session(shipped_broker: Broker) -> None:
    """The announcer's account (credentials an operator's laptop holds) connecting with the
    shuffler's client id is refused, as a device's is: it is bound to its own client id
    (the shuffler and aggregator accounts are not, docs/deployment.md "Client ids")."""

    async def scenario() -> int:
        victim, code = await RawClient.connect(
            shipped_broker.port, "shuffler", "shuffler", password("shuffler")
        )
        assert code == SUCCESS
        thief, stolen = await RawClient.connect(
            shipped_broker.port, "shuffler", "announcer", password("announcer")
        )
        if stolen == SUCCESS:  # the takeover: the broker closes the shuffler's connection
            kind, _ = await victim.read()
            assert kind in (0, 0xE0)  # closed, or DISCONNECT (0x8E, session taken over)
        await thief.close()
        await victim.close()
        return stolen

    assert run(scenario(), 2 * TIMEOUT) == NOT_AUTHORIZED


# -- row 4: huge messages ----------------------------------------------------------------------


def flood(port: int, username: str, password_: str, topic: str, size: int) -> tuple[int, bytes]:
    """Connect (MQTT 5) and publish ``size`` bytes at QoS 1 on ``topic``, streamed from a
    64 KiB buffer until done or until the broker closes the connection. Returns the bytes
    of payload the socket took and everything the broker sent after its CONNACK."""
    chunk = b"\x01" * 65536
    with socket.create_connection(("127.0.0.1", port), timeout=waiting.scaled(TIMEOUT)) as sock:
        sock.sendall(connect_packet(username, username, password_))
        connack = sock.recv(2)  # a CONNACK is shorter than 128 bytes: one length byte
        while len(connack) < 2 + connack[1]:
            connack += sock.recv(2 + connack[1] - len(connack))
        assert connack[0] == 0x20, connack
        assert connack[3] == SUCCESS, connack
        variable = _string(topic) + struct.pack("!H", 1) + b"\x00"
        sent = 0
        try:
            sock.sendall(_packet_header(0x32, len(variable) + size) + variable)
            while sent < size:
                sent += sock.send(chunk[: size - sent])
        except (BrokenPipeError, ConnectionResetError):
            pass
        answer = b""
        with contextlib.suppress(ConnectionResetError):
            while data := sock.recv(65536):
                answer += data
        return sent, answer


def test_huge_messages_disconnect_their_sender_and_cost_no_honest_report(
    shipped_broker: Broker, tmp_path: Path, debug_logs: pytest.LogCaptureFixture
) -> None:
    """3 x 100 MB on the device's own topic (the shipped ``max_packet_size``: the broker
    closes the connection when the PUBLISH header announces the size, long before 100 MB
    are sent), then 3 x 200 kB (below the broker's cap: acknowledged, but never delivered
    to the shuffler, which announces a 512-byte Maximum Packet Size). The shuffler receives
    nothing of the attacker and every honest report is aggregated."""
    floods: list[tuple[int, bytes]] = []
    pubacks: list[int] = []

    async def scenario() -> Pipeline:
        async with pipeline(shipped_broker, tmp_path, accounts=True) as p:

            async def attack() -> None:
                topic = ingress_topic(DEP, ATTACKER)
                await fleet_connected(p)
                for _ in range(3):
                    floods.append(
                        await asyncio.to_thread(
                            flood, p.broker.port, ATTACKER, password(ATTACKER), topic, HUGE
                        )
                    )
                await rounds_completed(p, 1)
                async with attacker(p) as device:
                    for i in range(3):
                        pubacks.append(await device.publish(topic, bytes([i]) * 200_000))

            await run_fleet(p, attack, seed=4)
            return p

    p = run(scenario(), 240)
    for sent, answer in floods:
        assert sent < HUGE // 10  # refused at the header, not after buffering
        # DISCONNECT with reason Packet too large, or the connection simply closed.
        assert answer in (b"", bytes([0xE0, 0x01, PACKET_TOO_LARGE])), answer
    assert pubacks == [SUCCESS] * 3
    assert p.shuffled("coco_shuffler_reports_received_total") == HONEST * ROUNDS
    assert p.rejected() == {}
    check_honest_reports_all_aggregated(p)
    check_logs_link_nothing(debug_logs.records, p)


# -- row 5: forged and replayed batches ---------------------------------------------------------


def test_forged_and_replayed_batches_are_rejected_and_move_no_epsilon(  # noqa: PLR0915
    shipped_broker: Broker, tmp_path: Path, debug_logs: pytest.LogCaptureFixture
) -> None:
    """Someone with the shuffler's broker account (not its signing key) publishes, after
    the first genuine batch: a 1-record batch (signed by another key, unsigned, and signed
    with the shuffler's own key, as a buggy shuffler would release it), a full
    batch under another key, a genuine batch with one record changed, and a byte-exact
    replay of a genuine batch, and the replay again after the aggregator restarted from its
    checkpoint. All are rejected by reason or ignored as duplicates; nothing forged moves
    ``epsilon_central``. The 1-record batch under the shuffler's own key was released to
    whoever listens, so it is charged at its real size: ``epsilon_central`` (the smallest
    release's) becomes that of one report, before and after the restart."""
    before: list[float] = []
    after: list[float] = []

    async def epsilon(p: Pipeline) -> float:
        """``epsilon_central`` of the smallest batch, once the privacy ledger (computed off
        the event loop) covers every batch applied."""
        agg = p.aggregator
        assert agg is not None
        await wait_until(lambda: agg.privacy_settled, TIMEOUT, progress=p.progress)
        return value(p.aggregator_registry, "coco_aggregator_epsilon_central", batch="smallest")

    def duplicates(p: Pipeline) -> float:
        return value(p.aggregator_registry, "coco_aggregator_batches_duplicate_total")

    async def forge(p: Pipeline, messages: list[bytes]) -> None:
        forger, code = await RawClient.connect(
            p.broker.port, "forger", "shuffler", password("shuffler")
        )
        try:
            assert code == SUCCESS
            for message in messages:
                assert await forger.publish(batches_topic(DEP), message) in ACCEPTED
        finally:
            await forger.close()

    async def scenario() -> Pipeline:
        async with pipeline(shipped_broker, tmp_path, accounts=True) as p:

            async def attack() -> None:
                assert p.aggregator is not None
                await wait_until(
                    lambda: p.aggregator is not None and p.aggregator.state.n > 0,
                    TIMEOUT,
                    progress=p.progress,
                )
                genuine = next(iter(p.batches.values()))
                _, round_, *_ = decode_batch(genuine[:-SIGNATURE_SIZE])
                rng = random.Random(5)

                def forged(count: int) -> bytes:
                    fresh = [rng.getrandbits(32) for _ in range(count)]
                    return encode_batch(FP, round_, rng.randbytes(16), fresh, [0] * count)

                planted = SIGNER.seal(forged(1))
                p.planted.add(decode_batch(planted[:-SIGNATURE_SIZE])[2])
                tampered = bytearray(genuine)
                tampered[-SIGNATURE_SIZE - 1] ^= 1  # the last record's z
                messages = [
                    FORGER.seal(forged(1)),
                    forged(1),  # no signature at all
                    FORGER.seal(forged(2 * MIN_BATCH)),
                    bytes(tampered),
                    planted,  # as a buggy shuffler would: the floor still holds
                    genuine,  # replay
                ]
                before.append(await epsilon(p))
                await forge(p, messages)
                await wait_until(
                    lambda: duplicates(p) == 1 and sum(p.batches_rejected().values()) == 5,
                    TIMEOUT,
                    progress=p.progress,
                )
                after.append(await epsilon(p))
                # The applied ids are in the checkpoint: after a restart (batches queue in
                # the session meanwhile) the replay is still a duplicate.
                await p.stop_aggregator()
                await p.start_aggregator()
                await forge(p, [genuine])
                await wait_until(lambda: duplicates(p) == 2, TIMEOUT, progress=p.progress)
                after.append(await epsilon(p))

            await run_fleet(p, attack, seed=5)
            return p

    p = run(scenario(), 240)
    assert p.batches_rejected() == {"bad_signature": 3, "bad_length": 1, "below_min_batch": 1}
    registry = p.aggregator_registry
    assert value(registry, "coco_aggregator_reports_rejected_total", reason="below_min_batch") == 1
    assert duplicates(p) == 2
    assert len(p.aggregator_registries) == 2
    assert len(p.foreign) == 4
    assert after == [amplify_spec(SPEC, n=1, delta=DELTA).epsilon_central] * 2
    assert before[0] == pytest.approx(amplify_spec(SPEC, n=HONEST, delta=DELTA).epsilon_central)
    assert p.rejected() == {}
    check_honest_reports_all_aggregated(p, charged=1)  # the planted 1-record batch
    check_logs_link_nothing(debug_logs.records, p)


# -- row 6: logs at DEBUG ---------------------------------------------------------------------


def test_debug_logs_never_link_a_device_to_its_report(
    shipped_broker: Broker, tmp_path: Path, debug_logs: pytest.LogCaptureFixture
) -> None:
    """Everything at DEBUG (the shuffler, the aggregator and the MQTT libraries), while the
    attacker takes every rejection path of a well-formed MQTT message on its own topic: no
    record names a device, the attacker included, or holds a report's seed; each rejection
    is counted by its reason."""
    accepted = (777_777, 2)
    malformed = {
        "bad_length": report_now(1)[:15],
        "bad_version": b"\x02" + report_now(2)[1:],
        "bad_kind": report_now(3)[:1] + b"\x07" + report_now(3)[2:],
        "unknown_fingerprint": report_now(4, fp=FP ^ 1),
        "z_out_of_range": report_now(5, SPEC.t),
    }

    async def scenario() -> Pipeline:
        async with pipeline(shipped_broker, tmp_path, accounts=True) as p:

            async def attack() -> None:
                topic = ingress_topic(DEP, ATTACKER)
                async with attacker(p) as device:
                    await rounds_completed(p, 1)
                    for message in malformed.values():
                        assert await device.publish(topic, message) in ACCEPTED
                    round_ = current_round(ROUND_SECONDS)
                    assert (
                        await device.publish(topic, report_now(*accepted, round_=round_))
                        in ACCEPTED
                    )
                    assert await device.publish(topic, report_now(8, 1, round_=round_)) in ACCEPTED

            await run_fleet(p, attack, seed=6)
            return p

    p = run(scenario(), 240)
    assert p.rejected() == {**dict.fromkeys(malformed, 1), "duplicate_in_round": 1}
    check_honest_reports_all_aggregated(p, extra=Counter([accepted]))
    # The capture saw both services, with DEBUG enabled for them and the ingest client.
    assert {"broker.shuffler", "aggregator.service"} <= {r.name for r in debug_logs.records}
    for name in ("broker.shuffler", "broker.shuffler.mqtt", "aggregator.service", "gmqtt"):
        assert logging.getLogger(name).isEnabledFor(logging.DEBUG)
    check_logs_link_nothing(debug_logs.records, p)
    # The seed of the attacker's accepted report is nowhere either.
    assert not any(str(accepted[0]) in r.getMessage() for r in debug_logs.records)


# -- row 7: protocol rules (id length, retain) --------------------------------------------------


def test_a_65_character_device_id_and_a_retained_report_are_rejected(
    mosquitto: Broker, tmp_path: Path, debug_logs: pytest.LogCaptureFixture
) -> None:
    """On a broker with no ACL (the services' own checks are the first line): a report on
    the ingress topic of a 65-character device id (``bad_device_id``), and a report the
    device publishes with the retain flag (``retained``); both change nothing else."""
    long_id = "d" * 65

    async def scenario() -> Pipeline:
        async with pipeline(mosquitto, tmp_path, accounts=False) as p:

            async def attack() -> None:
                async with attacker(p) as device:
                    await rounds_completed(p, 1)
                    long_topic = ingress_topic(DEP, "x")[:-1] + long_id
                    assert await device.publish(long_topic, report_now(9)) in ACCEPTED
                    own = ingress_topic(DEP, ATTACKER)
                    assert await device.publish(own, report_now(10), retain=True) in ACCEPTED
                    await wait_until(
                        lambda: sum(p.rejected().values()) == 2, TIMEOUT, progress=p.progress
                    )

            await run_fleet(p, attack, seed=7)
            return p

    p = run(scenario(), 240)
    assert p.rejected() == {"bad_device_id": 1, "retained": 1}
    check_honest_reports_all_aggregated(p)
    check_logs_link_nothing(debug_logs.records, p)


def test_coco_shuffler_at_debug_logs_no_device_and_no_report(
    shipped_broker: Broker, tmp_path: Path, debug_logs: pytest.LogCaptureFixture
) -> None:
    """The deployed command: ``coco shuffler`` with ``COCO_LOG_LEVEL=debug`` (its own
    process, the root logger at DEBUG as the CLI sets it), the same attacker as above:
    nothing it writes names a device or holds a report's seed, and the reconciliation is
    exact."""
    accepted = (888_888, 4)

    async def scenario() -> tuple[Pipeline, list[str]]:
        async with pipeline(shipped_broker, tmp_path, accounts=True, shuffler_process=True) as p:

            async def attack() -> None:
                topic = ingress_topic(DEP, ATTACKER)
                async with attacker(p) as device:
                    await rounds_completed(p, 1)
                    assert await device.publish(topic, report_now(1)[:15]) in ACCEPTED
                    round_ = current_round(ROUND_SECONDS)
                    message = report_now(*accepted, round_=round_)
                    assert await device.publish(topic, message) in ACCEPTED
                    assert await device.publish(topic, message) in ACCEPTED

            await run_fleet(p, attack, seed=8)
            rejected = {
                r: p.shuffled("coco_shuffler_reports_rejected_total", reason=r)
                for r in ("bad_length", "duplicate_in_round")
            }
            assert rejected == {"bad_length": 1, "duplicate_in_round": 1}
            assert p.process is not None
            return p, p.process.stop()

    p, lines = run(scenario(), 240)
    assert any(" DEBUG " in line for line in lines)  # the level was in force
    assert any("broker.shuffler" in line for line in lines)
    check_lines_link_nothing(lines, p)
    assert not any(str(accepted[0]) in line for line in lines)
    # The reconciliation (the process's counters are gone; the batches and sums remain).
    assert len(p.acked) == HONEST * ROUNDS
    expected = Counter((seed, z) for _round, seed, z in p.acked) + Counter([accepted])
    assert p.released() == expected
    assert p.aggregator is not None
    assert p.aggregator.state.n == expected.total()
    check_logs_link_nothing(debug_logs.records, p)


def test_a_flood_on_the_devices_own_topic_is_refused_and_costs_no_honest_report(
    shipped_broker: Broker, tmp_path: Path, debug_logs: pytest.LogCaptureFixture
) -> None:
    """Volume within the size limit: the attacker publishes its one report of a round and
    then FLOOD copies of another (QoS 0, as fast as the socket takes them) while the fleet
    publishes. The copies are counted ``duplicate_in_round``, one by one, and every honest
    report is still aggregated."""
    flood_size = 20_000
    accepted = (31337, 5)

    async def scenario() -> Pipeline:
        async with pipeline(shipped_broker, tmp_path, accounts=True) as p:

            async def attack() -> None:
                topic = ingress_topic(DEP, ATTACKER)
                async with attacker(p) as device:
                    await rounds_completed(p, 1)
                    round_ = current_round(ROUND_SECONDS)
                    assert (
                        await device.publish(topic, report_now(*accepted, round_=round_))
                        in ACCEPTED
                    )
                    copy = report_now(1, 1, round_=round_)
                    body = _string(topic) + b"\x00" + copy  # QoS 0: no packet id
                    packet = _packet_header(0x30, len(body)) + body
                    for _ in range(flood_size // 1000):
                        device.writer.write(packet * 1000)
                        await device.writer.drain()
                    assert await device.publish(topic, copy) in ACCEPTED  # after the flood
                    await wait_until(
                        lambda: p.rejected().get("duplicate_in_round", 0) == flood_size + 1,
                        TIMEOUT,
                        progress=p.progress,
                    )

            await run_fleet(p, attack, seed=10)
            return p

    p = run(scenario(), 240)
    assert p.rejected() == {"duplicate_in_round": flood_size + 1}
    check_honest_reports_all_aggregated(p, extra=Counter([accepted]))
    check_logs_link_nothing(debug_logs.records, p)
