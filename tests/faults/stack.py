"""The fault suite's stack (tests/faults/test_*.py): a Mosquitto, ``coco announce``, ``coco
shuffler --state-dir``, ``coco aggregator run --checkpoint``, an independent recorder of the
batches topic and ``coco fleet --acked-log``, all real processes (tests/processes.py); one
case of a fleet's rounds with a fault at a random moment, and the reconciliation of what the
devices were told with what was released and aggregated (tests/faults/test_exactly_once.py
says what is checked).
"""

from __future__ import annotations

import contextlib
import json
import random
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import paho.mqtt.client as mqtt
import pytest
from paho.mqtt.enums import CallbackAPIVersion
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from aggregator.estimation.estimators import AggregateState
from aggregator.service.checkpoint_files import load_checkpoint
from aggregator.service.series_file import load_series
from edge.batch_auth import BatchAuthError, BatchVerifier, load_or_create_signing_key
from edge.batch_auth import public_key_hex as key_hex
from edge.codec import decode_batch, round_seconds_of
from edge.spec import MechanismSpec
from edge.topics import batches_topic
from sim.credentials.accounts import SERVICE_ACCOUNTS, service_password
from sim.fleet.cli import EXIT_NOT_SENT
from tests import processes
from tests.conftest import MOSQUITTO, PLUGIN, Broker, free_port, persistent_broker, shipped_broker
from tests.processes import Process, estimates, rng_for, wait_until
from tests.service_http import metrics

DEP = "faults"
SPEC = MechanismSpec(mechanism="coco", d=6, s=2, epsilon=1.0)
DEVICES = 2000
ROUNDS = 5
ROUND_SECONDS = 2
MIN_BATCH = 100
MAX_BATCH = 250
SPREAD_SECONDS = 1.5
SECRET = b"fault suite deployment secret"


# -- the recorder ---------------------------------------------------------------------------


class Recorder:
    """Every distinct batch on the batches topic, through a persistent MQTT 5 session
    (clean start off, session expiry 600 s) that survives broker restarts (paho reconnects).
    Each message is verified with the shuffler's public key (or a rotated one:
    :meth:`also_verify`) before it is decoded; a ``batch_id`` seen again must come with the
    same bytes."""

    def __init__(self, port: int, public_key: str, auth: tuple[str, str] | None) -> None:
        self.verifiers = [BatchVerifier(public_key, DEP)]
        self.lock = threading.Lock()
        self.batches: dict[bytes, bytes] = {}
        self.records: dict[bytes, tuple[list[int], list[int]]] = {}
        self.rounds: dict[bytes, int] = {}
        """The release round each batch carries (signed)."""
        self.lengths: dict[bytes, int] = {}
        """The round length each batch carries (signed; 0: wire version 1)."""
        self.deliveries = 0
        self.problems: list[str] = []
        self.subscribed = threading.Event()
        client = mqtt.Client(
            CallbackAPIVersion.VERSION2, client_id="fault-recorder", protocol=mqtt.MQTTv5
        )
        if auth is not None:
            client.username_pw_set(*auth)
        client.on_connect = self._on_connect
        client.on_subscribe = self._on_subscribe
        client.on_message = self._on_message
        client.reconnect_delay_set(1, 1)
        properties = Properties(PacketTypes.CONNECT)  # type: ignore[no-untyped-call]
        properties.SessionExpiryInterval = 600
        client.connect("127.0.0.1", port, clean_start=False, properties=properties)
        client.loop_start()
        self.client = client

    def _on_connect(self, client: mqtt.Client, *_: object) -> None:
        client.subscribe(batches_topic(DEP), qos=1)

    def _on_subscribe(self, *_: object) -> None:
        self.subscribed.set()

    def _on_message(self, _c: object, _u: object, message: mqtt.MQTTMessage) -> None:
        payload = bytes(message.payload)
        with self.lock:
            self.deliveries += 1
            try:
                batch = bytes(self._open(payload))
                fingerprint, round_, batch_id, seeds, zs = decode_batch(batch)
            except (BatchAuthError, ValueError) as exc:
                self.problems.append(f"unverified batch: {exc}")
                return
            if fingerprint != SPEC.fingerprint_int or len(seeds) < MIN_BATCH:
                self.problems.append(f"bad batch: fingerprint {fingerprint}, {len(seeds)}")
            known = self.batches.setdefault(batch_id, payload)
            if known != payload:
                self.problems.append(f"batch {batch_id.hex()} re-sent with other bytes")
            self.records[batch_id] = (list(seeds), list(zs))
            self.rounds[batch_id] = round_
            self.lengths[batch_id] = round_seconds_of(batch)

    def also_verify(self, public_key: str) -> None:
        """Verify under ``public_key`` too (a rotated batch key: what either signed)."""
        with self.lock:
            self.verifiers.append(BatchVerifier(public_key, DEP))

    def _open(self, payload: bytes) -> memoryview:
        for verifier in self.verifiers[:-1]:
            with contextlib.suppress(BatchAuthError):
                return verifier.open(payload)
        return self.verifiers[-1].open(payload)

    @property
    def released(self) -> Counter[tuple[int, int]]:
        with self.lock:
            return processes.released(self.records.values())

    @property
    def count(self) -> int:
        with self.lock:
            return sum(len(seeds) for seeds, _ in self.records.values())

    def offline(self, only: set[bytes] | None = None) -> AggregateState:
        """An :class:`AggregateState` of the batches recorded (``only`` those ids)."""
        with self.lock:
            batches = [b for i, b in self.records.items() if only is None or i in only]
        return processes.offline(SPEC, batches)

    def per_round(self, only: set[bytes]) -> dict[int, tuple[AggregateState, int, int]]:
        """Each release round's sums, batches and smallest batch, of the batches ``only``:
        what the aggregator's per-round series must hold."""
        with self.lock:
            by_round: dict[int, list[tuple[list[int], list[int]]]] = {}
            for batch_id in only:
                by_round.setdefault(self.rounds[batch_id], []).append(self.records[batch_id])
        return {
            round_: (
                processes.offline(SPEC, batches),
                len(batches),
                min(len(seeds) for seeds, _ in batches),
            )
            for round_, batches in sorted(by_round.items())
        }

    def close(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()


# -- the stack ------------------------------------------------------------------------------


@dataclass
class Stack:
    """Broker, announced deployment, shuffler, aggregator and recorder of one case."""

    workdir: Path
    broker: Broker
    shipped: bool
    public_key: str = ""
    state_dir: Path = field(init=False)
    checkpoint: Path = field(init=False)
    shuffler_port: int = field(default_factory=free_port)
    aggregator_port: int = field(default_factory=free_port)
    shuffler: Process = field(init=False)
    aggregator: Process = field(init=False)
    recorder: Recorder | None = None

    def __post_init__(self) -> None:
        self.state_dir = self.workdir / "shuffler-state"
        self.checkpoint = self.workdir / "aggregator.json"
        self.state_dir.mkdir(mode=0o700)
        # The batch key first, so the announcement and the aggregator can pin it.
        key = load_or_create_signing_key(self.state_dir / "signing.key")
        self.public_key = key_hex(key)
        self.shuffler = self.shuffler_process("shuffler", self.state_dir)
        self.aggregator = self.aggregator_process("aggregator", self.checkpoint)

    def auth(self, account: str) -> list[str]:
        """``--username``/``--password-file`` of a service account (shipped config only)."""
        if not self.shipped:
            return []
        path = self.workdir / f"{account}.password"
        path.write_text(service_password(SECRET, account))
        return ["--username", account, "--password-file", str(path)]

    def shuffler_process(
        self,
        name: str,
        state_dir: Path,
        *extra: str,
        port: int | None = None,
        signing_key: Path | None = None,
    ) -> Process:
        args = processes.shuffler_args(
            DEP,
            self.broker.url,
            state_dir=state_dir,
            signing_key=signing_key or self.state_dir / "signing.key",
            metrics_port=port or self.shuffler_port,
        )
        args += ["--flush-interval", "0.2"]
        args += ["--max-batch", str(MAX_BATCH)]  # several batches a round, several in flight
        args += ["--max-skew", "0.5", "--late-seconds", "60", *self.auth("shuffler"), *extra]
        return Process(name, args, self.workdir)

    def aggregator_process(
        self, name: str, checkpoint: Path, *, port: int | None = None
    ) -> Process:
        args = processes.aggregator_args(
            DEP, self.broker.url, checkpoint=checkpoint, metrics_port=port or self.aggregator_port
        )
        args += ["--checkpoint-interval", "0.5", "--batch-public-key", self.public_key]
        args += self.auth("aggregator")
        return Process(name, args, self.workdir)

    def announce(
        self, public_key: str | None = None, *, round_seconds: int = ROUND_SECONDS
    ) -> None:
        """``coco announce`` of the deployment with the batch key (``public_key``: another)
        and round length."""
        args = processes.announce_args(
            DEP, SPEC, self.broker.url, min_batch=MIN_BATCH, round_seconds=round_seconds
        )
        args += ["--batch-public-key", public_key or self.public_key, *self.auth("announcer")]
        done = processes.coco(*args, timeout=60)
        assert done.returncode == 0, done.stderr

    def start_recorder(self) -> Recorder:
        auth = None
        if self.shipped:  # the aggregator's account reads the batches topic
            auth = ("aggregator", service_password(SECRET, "aggregator"))
        self.recorder = Recorder(self.broker.port, self.public_key, auth)
        wait_until(self.recorder.subscribed.is_set, what="the recorder's subscription")
        return self.recorder

    def shuffler_ready(self, port: int | None = None) -> bool:
        return processes.shuffler_ready(port or self.shuffler_port)

    def aggregator_ready(self) -> bool:
        return processes.aggregator_ready(self.aggregator_port)

    def start_shuffler(self) -> None:
        self.shuffler.start()
        wait_until(self.shuffler_ready, 60, what="the shuffler")

    def start_aggregator(self) -> None:
        self.aggregator.start()
        wait_until(self.aggregator_ready, 60, what="the aggregator")

    def fleet(self, acked_log: Path, seed: int, *, rounds: int = ROUNDS) -> Process:
        args = processes.fleet_args(
            DEP,
            self.broker.url,
            devices=DEVICES,
            rounds=rounds,
            seed=seed,
            # Reports spread over most of each round, so that a fault always meets some in
            # flight.
            round_spread=SPREAD_SECONDS,
            acked_log=acked_log,
        )
        if self.shipped:
            secret = self.workdir / "secret"
            args += ["--credentials-secret-file", str(secret), "--mode", "connections"]
        else:
            args += ["--mode", "multiplexed", "--connections", "4"]
        return Process("fleet", args, self.workdir, capture=True)

    def close(self) -> None:
        for process in (self.shuffler, self.aggregator):
            process.kill()
        if self.recorder is not None:
            self.recorder.close()


def shipped_broker_with_accounts(workdir: Path, extra_config: str = "") -> Broker:
    """deploy/mosquitto/mosquitto.conf, adapted as tests/deploy/test_acl.py does
    (tests/conftest.py's :func:`~tests.conftest.shipped_broker`), with the dynamic-security
    configuration ``coco credentials`` writes for the whole fleet, and ``extra_config`` at
    the end (later lines win)."""
    if PLUGIN is None:
        pytest.skip("mosquitto's dynamic-security plugin is not installed")
    secret = workdir / "secret"
    secret.write_bytes(SECRET)
    dynsec = workdir / "credentials" / "dynamic-security.json"
    args = ["credentials", "--secret-file", str(secret), "--devices", str(DEVICES)]
    args += [arg for name in SERVICE_ACCOUNTS for arg in ("--service", name)]
    args += ["--deployment", DEP, "--dynsec-out", str(dynsec)]
    done = processes.coco(*args, timeout=120)
    assert done.returncode == 0, done.stderr
    return shipped_broker(workdir, PLUGIN, dynsec, extra_config)


@contextlib.contextmanager
def running_stack(
    workdir: Path,
    *,
    shipped: bool = False,
    broker_config: str = "",
    round_seconds: int = ROUND_SECONDS,
) -> Iterator[Stack]:
    if not Path(MOSQUITTO).exists():
        pytest.skip("mosquitto is not installed (apt-get install mosquitto)")
    broker = (
        shipped_broker_with_accounts(workdir, broker_config)
        if shipped
        else persistent_broker(workdir)
    )
    broker.start()
    stack = Stack(workdir, broker, shipped)
    try:
        stack.announce(round_seconds=round_seconds)
        stack.start_recorder()
        stack.start_shuffler()
        stack.start_aggregator()
        yield stack
    finally:
        stack.close()
        broker.stop()


# -- one case -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Settled:
    """What the shufflers held in their pools, and dropped by their round policy, once the
    pipeline settled."""

    held: int
    dropped: int


@dataclass
class Outcome:
    """What the devices were told, and what the shuffler still held at the end."""

    acked: Counter[tuple[int, int]]
    summary: dict[str, Any]
    held: int
    """Reports in the last shuffler's pools when it stopped (its /metrics)."""
    dropped: int = 0
    """Reports the shuffler dropped by its round policy, counted (:data:`POLICY_DROPS`)."""

    @property
    def unacknowledged(self) -> int:
        """Reports the fleet published without getting a PUBACK (by reason in its summary)."""
        return sum(self.summary["publish_failures"].values())


Fault = Callable[[Stack, random.Random], None]


POLICY_DROPS = ("carry_superseded", "small_round")
"""What a shuffler drops by its round policy, counted (docs/operations.md): a small pool's
report superseded, when the pool is carried, by its device's report in the round it joins (a
device is never twice in one batch), or a small pool dropped. A fault that cuts the devices'
connections leaves small rounds behind, so acknowledged reports can leave this way."""


def held_by_shuffler(port: int) -> tuple[int, int, int] | None:
    """Reports in a shuffler's pools, in its outbox (released, not yet acknowledged by the
    broker: perhaps delivered already, so they are waited for, never counted as held), and
    dropped by its round policy (:data:`POLICY_DROPS`) since it started."""
    samples = metrics(port)
    if samples is None:
        return None
    dropped = sum(
        int(samples.get(f"coco_shuffler_dropped_total{{reason={reason}}}", 0))
        for reason in POLICY_DROPS
    )
    return (
        int(samples["coco_shuffler_buffer_reports"]),
        int(samples["coco_shuffler_outbox_reports"]),
        dropped,
    )


def settle(
    stack: Stack,
    shufflers: list[tuple[Process, int]],
    acked: Counter[tuple[int, int]] | None,
) -> Settled:
    """Wait until the running shufflers are connected with empty outboxes, the aggregator
    has applied every record the recorder saw, and every report in ``acked`` is released,
    pooled in a shuffler (a pool below min_batch waits for traffic) or dropped by its round
    policy; then stop the shufflers with SIGTERM and return what their pools held and what
    they dropped, summed. Reports queued at the broker for a shuffler that is still
    reconnecting are waited for, not missed.

    ``acked=None`` (after a broker crash, or with a second shuffler's state directory aside):
    until nothing has changed for 5 s instead. Past the timeout the checks that follow tell
    what is missing."""
    assert stack.recorder is not None
    recorder = stack.recorder
    history: list[tuple[int, int, int, int, int]] = []

    def done() -> bool:
        held = [held_by_shuffler(port) for process, port in shufflers if process.alive()]
        connected = all(
            stack.shuffler_ready(port) for process, port in shufflers if process.alive()
        )
        document = estimates(stack.aggregator_port)
        if document is None or not connected or any(h is None for h in held):
            return False
        pooled = sum(h[0] for h in held if h is not None)
        outbox = sum(h[1] for h in held if h is not None)
        dropped = sum(h[2] for h in held if h is not None)
        state = (pooled, outbox, recorder.count, int(document["n"]), dropped)
        history.append(state)
        if acked is None:
            return len(history) >= 50 and len(set(history[-50:])) == 1
        missing = sum((acked - recorder.released).values())
        stable = len(history) >= 20 and len(set(history[-20:])) == 1  # 2 s unchanged
        settled = missing == pooled + dropped
        return outbox == 0 and state[2] == state[3] and settled and stable

    with contextlib.suppress(AssertionError):
        wait_until(done, 60, what="the pipeline to settle")
    for process, _port in shufflers:
        if process.alive():
            assert process.stop() == 0, process.output()[-2000:]
    assert history, "no shuffler or aggregator answered"
    pooled, outbox, _, _, dropped = history[-1]  # the scrape that found the pipeline settled
    if acked is not None:
        assert outbox == 0
    return Settled(pooled, dropped)


def run_case(
    stack: Stack,
    case: str,
    fault: Fault,
    finish: Callable[[Stack, Counter[tuple[int, int]]], Settled] | None = None,
    *,
    exact: bool = True,
) -> Outcome:
    """The fleet's rounds with ``fault`` at a random moment once reports flow; then settle
    (``finish``: settle and stop the shufflers, return what they held and dropped), stop everything
    gracefully and read what the devices were told."""
    rng = rng_for(case)
    acked_log = stack.workdir / "acked.log"
    fleet = stack.fleet(acked_log, seed=rng.randrange(2**31))
    fleet.start()
    wait_until(
        lambda: acked_log.exists() and acked_log.stat().st_size > 0,
        60,
        what="the fleet's first PUBACK",
    )
    moment = rng.uniform(0.0, (ROUNDS - 1.5) * ROUND_SECONDS)
    print(f"{case}: fault {moment:.2f} s after the first PUBACK")
    time.sleep(moment)
    fault(stack, rng)
    assert fleet.proc is not None
    stdout, _ = fleet.proc.communicate(timeout=120)
    summary = dict(json.loads(stdout))
    # 0, or EXIT_NOT_SENT exactly when the fault left reports unsent (counted by reason)
    expected = EXIT_NOT_SENT if summary["reports_not_sent"] else 0
    assert fleet.proc.returncode == expected, fleet.output()[-2000:]
    acked = processes.read_acked(acked_log)  # complete: the fleet has exited
    if finish is None:
        settled = settle(stack, [(stack.shuffler, stack.shuffler_port)], acked if exact else None)
    else:
        settled = finish(stack, acked)
    assert stack.aggregator.stop() == 0, stack.aggregator.output()[-2000:]
    return Outcome(acked, summary, settled.held, settled.dropped)


def reconcile(
    stack: Stack,
    outcome: Outcome,
    *,
    cut_connections: bool = False,
    two_shufflers: bool = False,
    broker_crash: bool = False,
    repaired_loss: int = 0,
) -> int:
    """The three checks of the module docstring; ``cut_connections``: the fault broke the
    devices' connections, so reports without a PUBACK may have been released;
    ``two_shufflers``: an acknowledged report may have been released twice (logged by both);
    ``broker_crash``: acknowledged reports and released batches may be lost (returned: how
    many reports), never counted twice."""
    recorder = stack.recorder
    assert recorder is not None
    assert not recorder.problems, recorder.problems[:3]
    released = recorder.released
    acked = outcome.acked
    assert outcome.summary["reports_published"] == sum(acked.values())
    assert outcome.summary["rounds_completed"] == ROUNDS
    missing = acked - released  # acknowledged, not released
    extra = released - acked  # released, never acknowledged
    # Nothing acknowledged is lost: what was not released is still in the shuffler, or was
    # dropped by its round policy and counted so.
    lost = sum(missing.values()) - outcome.held - outcome.dropped
    if broker_crash:
        assert lost >= 0, (sum(missing.values()), outcome.held, outcome.dropped)
    else:  # a repaired log loses exactly the reports its repair reported
        assert lost == repaired_loss, (
            sum(missing.values()), outcome.held, outcome.dropped, repaired_loss
        )  # fmt: skip
    if cut_connections:
        assert sum(extra.values()) <= outcome.unacknowledged
    elif two_shufflers:  # released twice, not made up: each one was acknowledged once
        assert all(acked[record] > 0 for record in extra), extra
        print(f"released twice by two shufflers: {sum(extra.values())}")
    else:
        assert not extra, sum(extra.values())
    # Nothing aggregated twice: the checkpoint holds each distinct released record once.
    checkpoint = load_checkpoint(stack.checkpoint)
    applied = {batch_id for ids in checkpoint.batch_rounds.values() for batch_id in ids}
    unseen = applied - set(recorder.records)
    if broker_crash and unseen:
        # The recorder's session was lost too and came back after the aggregator's: the
        # sums cannot be compared with what it saw: say so rather than guess.
        print(f"{len(unseen)} batches applied that the recorder never saw")
        pytest.skip("the broker crash cost the recorder batches the aggregator applied")
    assert not unseen
    if broker_crash:  # a batch released before the aggregator's session was back is lost
        offline = recorder.offline(applied)
        lost += recorder.count - offline.n
    else:
        assert applied == set(recorder.records)
        offline = recorder.offline()
    assert checkpoint.state.n == offline.n
    assert np.array_equal(checkpoint.state.sum_u, offline.sum_u)
    assert np.array_equal(checkpoint.state.sum_v, offline.sum_v)
    assert checkpoint.counters.reports == checkpoint.state.n
    check_series(stack, recorder, applied)
    rejected = sum(checkpoint.counters.rejected_reports.values())
    assert rejected == 0, checkpoint.counters.rejected_reports
    # The identity, exactly: acknowledged == aggregated + rejected + held + dropped by the
    # round policy - never acked (+ lost, after a broker crash only).
    assert sum(acked.values()) == (
        checkpoint.state.n + rejected + outcome.held + outcome.dropped + lost
        - sum(extra.values())
    )  # fmt: skip
    print(
        f"acknowledged {sum(acked.values())}, released {recorder.count} in "
        f"{len(recorder.records)} batches ({recorder.deliveries} deliveries), "
        f"aggregated {checkpoint.state.n} (duplicates ignored: {checkpoint.counters.duplicates}, "
        f"left unacknowledged: {checkpoint.counters.unacknowledged}), held {outcome.held}, "
        f"dropped by the round policy {outcome.dropped}, "
        f"released unacknowledged {sum(extra.values())} of {outcome.unacknowledged}, "
        f"lost {lost}"
    )
    return lost


def check_series(stack: Stack, recorder: Recorder, applied: set[bytes]) -> None:
    """The per-round series the aggregator kept (its checkpoint and series file, read
    offline) holds each release round's sums exactly as recomputed from the recorder's
    batches of that round: nothing of a round lost or counted twice across the fault."""
    series = load_series(stack.checkpoint)
    rows = {row.round: row for row in series.rows()}
    expected = recorder.per_round(applied)
    assert sorted(rows) == sorted(expected)
    for round_, (state, batches, smallest) in expected.items():
        row = rows[round_]
        assert (row.start, row.end, row.rounds) == (
            round_ * ROUND_SECONDS,
            (round_ + 1) * ROUND_SECONDS,
            1,
        )
        assert (row.state.n, row.batches, row.smallest_release) == (state.n, batches, smallest)
        assert np.array_equal(row.state.sum_u, state.sum_u), round_
        assert np.array_equal(row.state.sum_v, state.sum_v), round_
    cut = (
        "cut" in stack.aggregator.output()
        and "written after checkpoint" in stack.aggregator.output()
    )
    print(
        f"series: {len(rows)} rounds, each equal to the recorder's; records cut at a restart: {cut}"
    )


def pause(rng: random.Random) -> None:
    time.sleep(rng.uniform(0.5, 3.0))
