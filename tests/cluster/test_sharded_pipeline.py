"""Sharded shufflers on a replicated broker cluster, with faults at random moments.

Real processes only: a 3-node NATS cluster (JetStream, replicas 3, an MQTT 3.1.1 listener per
node: tests/clusters.py) and the ``coco`` command line in subprocesses, each given every
node's URL (``--broker mqtt://n1,mqtt://n2,mqtt://n3``): ``coco announce`` with one key per
shard, ``coco shuffler --shard g0s<i>`` with its own state directory and key (and its broker
statistics on, over the same node list), one ``coco aggregator run --checkpoint``, and
``coco fleet`` (:data:`DEVICES` devices, :data:`ROUNDS` rounds, multiplexed over connections
spread on the nodes). Faults come at moments drawn
from a seeded generator whose seed is printed (``FAULT_SEED=... pytest`` replays a run):

* ``kill -9`` of one broker node (restarted a few seconds later), of one shard's shuffler
  (restarted on its state directory) and of the aggregator (restarted on its checkpoint),
  in one run;
* a second shuffler started on a shard that is owned (another state directory: refused by
  the shard's lease, exit 1, nothing else harmed), then a reshard from 3 shards to 2 at a
  round boundary (a second layout announced ahead, the new shards' shufflers started, the
  aggregator told to trust their keys; the old shards' shufflers retire), in another.

An independent recorder (a persistent MQTT session on the cluster that moves to the next
node when its node dies) verifies every batch's and manifest's signature with the announced
key of its shard. After each run, exactly:

1. every report acknowledged to a device was released once (its ``(round, seed, z)`` in
   exactly one batch of all shards), none twice, and nothing released was never sent. A
   report is keyed by its round (a batch carries one round) and its ``(seed, z)``, which two
   devices may draw alike (32-bit seeds, z in ``0..d-1``: with :data:`DEVICES` x
   :data:`ROUNDS` reports, some runs in a hundred have such a collision, in one round or
   across two). So "released twice" is "released more often than the fleet's devices drew
   it in that round": the fleet's reports are a function of its seed, the device and the
   round only (:meth:`sim.fleet.run.Fleet.reports`), so the test draws them again.
   Collisions are printed, never failed;
2. no shard released a report of a device it does not serve (the shufflers' ``wrong_shard``
   is 0: a device's report of a round is in one shard only, so no device is in two batches
   of one round);
3. the aggregator applied each released batch once: its checkpoint's sums equal an offline
   aggregate of the recorder's batches, and the manifests account for every released
   report (no report counted missing).
"""

from __future__ import annotations

import contextlib
import functools
import json
import random
import signal
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

from aggregator.estimation.estimators import AggregateState
from aggregator.service.checkpoint_files import load_checkpoint
from edge.batch_auth import BatchAuthError, BatchVerifier
from edge.codec import CodecError, decode_batch, decode_manifest
from edge.spec import MechanismSpec
from sim.fleet.config import FleetConfig
from sim.fleet.run import Fleet
from tests.clusters import NatsCluster, nats_server_or_skip
from tests.mqtt_adapters import FailoverClient
from tests.ports import free_port
from tests.processes import (
    Process,
    aggregator_args,
    aggregator_ready,
    announce_args,
    coco,
    estimates,
    fleet_args,
    offline,
    read_acked_reports,
    rng_for,
    shuffler_args,
    shuffler_ready,
    wait_until,
)
from tests.service_http import metrics
from tests.waiting import StalledError

pytestmark = [pytest.mark.integration, pytest.mark.timeout(420)]

DEP = "cluster"
SPEC = MechanismSpec(mechanism="coco", d=6, s=2, epsilon=1.0)
DEVICES = 6000
ROUNDS = 5
ROUND_SECONDS = 8
SPREAD_SECONDS = 4.0
MIN_BATCH = 200
MAX_BATCH = 900
SHARDS = 3
MAX_SKEW = 35
TIMEOUT = 90.0
RESHARD_LEAD = 5
"""Rounds between the reshard's announcement and the new layout's first round: time for
two shufflers to start and subscribe on a loaded machine."""
RESHARD_ROUNDS = RESHARD_LEAD + 3
"""The reshard case's fleet rounds: the old layout's and at least one of the new one's."""

Report = tuple[int, int, int]
"""``(round, seed, z)``: a report as a device sends it and a batch releases it."""


def label(generation: int, index: int) -> str:
    return f"g{generation}s{index}"


# -- the recorder ---------------------------------------------------------------------------


class Recorder:
    """Every distinct batch and manifest of every shard, each verified with the announced key
    of the shard its topic names, through a persistent MQTT 3.1.1 session on the cluster."""

    def __init__(self, urls: list[str], keys: dict[str, str]) -> None:
        self.keys = dict(keys)
        self.lock = threading.Lock()
        self.batches: dict[bytes, tuple[str, int, list[int], list[int]]] = {}
        self.manifests: dict[bytes, tuple[str, int, list[tuple[bytes, int]]]] = {}
        self.problems: list[str] = []
        self.client = FailoverClient(
            urls, 0, "cluster-recorder", clean_session=False, on_connected=self._subscribe
        )
        self.client.client.on_message = self._on_message
        wait_until(self.client.connected.is_set, 60, what="the recorder")

    def trust(self, keys: dict[str, str]) -> None:
        with self.lock:
            self.keys.update(keys)

    def _subscribe(self, client: mqtt.Client) -> None:
        client.subscribe([(f"coco/v1/{DEP}/batches/+", 1), (f"coco/v1/{DEP}/manifests/+", 1)])

    def _on_message(self, _c: object, _u: object, message: mqtt.MQTTMessage) -> None:
        kind, shard = message.topic.split("/")[-2:]
        payload = bytes(message.payload)
        with self.lock:
            key = self.keys.get(shard)
            if key is None:
                self.problems.append(f"a message on an unannounced shard {shard}")
                return
            verifier = BatchVerifier(key, DEP, shard)
            try:
                if kind == "batches":
                    _fp, round_, batch_id, seeds, zs = decode_batch(bytes(verifier.open(payload)))
                    known = self.batches.setdefault(batch_id, (shard, round_, seeds, zs))
                    if known != (shard, round_, seeds, zs):
                        self.problems.append(f"batch {batch_id.hex()} re-sent with other bytes")
                else:
                    fields = decode_manifest(bytes(verifier.open_manifest(payload)))
                    _fp, round_, release_id, entries, _sources = fields
                    self.manifests.setdefault(release_id, (shard, round_, entries))
            except (BatchAuthError, CodecError) as exc:
                self.problems.append(f"unverified {kind} on {shard}: {exc}")

    @property
    def released(self) -> Counter[Report]:
        with self.lock:
            return Counter(
                (round_, seed, z)
                for _shard, round_, seeds, zs in self.batches.values()
                for seed, z in zip(seeds, zs, strict=True)
            )

    @property
    def count(self) -> int:
        with self.lock:
            return sum(len(seeds) for _, _, seeds, _ in self.batches.values())

    def listed(self) -> dict[bytes, int]:
        """Batch id -> count, of every batch a manifest lists."""
        with self.lock:
            return {b: c for _, _, entries in self.manifests.values() for b, c in entries}

    def offline(self) -> AggregateState:
        with self.lock:
            batches = [(seeds, zs) for _, _, seeds, zs in self.batches.values()]
        return offline(SPEC, batches)

    def close(self) -> None:
        self.client.close()


# -- the stack ------------------------------------------------------------------------------


@dataclass
class Shard:
    label: str
    state_dir: Path
    key_dir: Path
    port: int
    process: Process


@dataclass
class Stack:
    workdir: Path
    cluster: NatsCluster
    shards: dict[str, Shard] = field(default_factory=dict)
    aggregator_port: int = field(default_factory=free_port)
    checkpoint: Path = field(init=False)
    aggregator: Process = field(init=False)
    recorder: Recorder | None = None
    others: list[Process] = field(default_factory=list)
    """Processes beside the services (the fleet, an intruder): killed with the stack."""
    timers: list[threading.Timer] = field(default_factory=list)
    """A node's delayed restart: cancelled (or waited for) before the cluster stops."""

    def __post_init__(self) -> None:
        self.checkpoint = self.workdir / "aggregator.json"
        args = aggregator_args(
            DEP, self.broker, checkpoint=self.checkpoint, metrics_port=self.aggregator_port
        )
        args += ["--checkpoint-interval", "0.5", "--manifest-grace", "30"]
        self.aggregator = Process("aggregator", args, self.workdir)

    @property
    def broker(self) -> str:
        return ",".join(self.cluster.urls)

    def make_shard(self, generation: int, index: int) -> Shard:
        name = label(generation, index)
        key_dir = self.workdir / f"key-{name}"
        done = coco("credentials", "--batch-key-dir", str(key_dir))
        assert done.returncode == 0, done.stderr
        state_dir = self.workdir / f"state-{name}"
        port = free_port()
        process = Process(
            f"shuffler-{name}", self.shuffler_args(name, state_dir, key_dir, port), self.workdir
        )
        shard = Shard(name, state_dir, key_dir, port, process)
        self.shards[name] = shard
        return shard

    def shuffler_args(self, name: str, state_dir: Path, key_dir: Path, port: int) -> list[str]:
        args = shuffler_args(
            DEP,
            self.broker,
            state_dir=state_dir,
            signing_key=key_dir / "private" / "signing.key",
            metrics_port=port,
        )
        args += ["--shard", name, "--flush-interval", "0.2"]
        # A report in flight to a shuffler when a node dies comes back after NATS's ack_wait
        # (30 s): its round must still be open then (docs/brokers.md), so the rounds are
        # released MAX_SKEW seconds after they end.
        args += ["--max-batch", str(MAX_BATCH), "--max-skew", str(MAX_SKEW)]
        args += ["--late-seconds", "60"]
        args += ["--lease-ttl", "10"]  # broker statistics on: --broker is the node list
        return args

    def public(self, shard: Shard) -> str:
        return (shard.key_dir / "public" / "signing.pub").read_text().strip()

    def announce(self, shards: list[Shard], *extra: str) -> dict[str, Any]:
        args = announce_args(
            DEP, SPEC, self.cluster.urls[0], min_batch=MIN_BATCH, round_seconds=ROUND_SECONDS
        )
        args += ["--shard-seed", "12345", "--mqtt-version", "auto"]
        for shard in shards:
            args += ["--shard-key", str(shard.key_dir / "public" / "signing.pub")]
        done = coco(*args, *extra)
        assert done.returncode == 0, done.stderr
        return dict(json.loads(done.stdout))

    def shuffler_ready(self, shard: Shard) -> bool:
        return shuffler_ready(shard.port, "coco_shuffler_ready")

    def start_shuffler(self, shard: Shard) -> None:
        shard.process.start()
        self.wait_ready(shard.process, functools.partial(self.shuffler_ready, shard))

    def start_aggregator(self) -> None:
        self.aggregator.start()
        self.wait_ready(self.aggregator, lambda: aggregator_ready(self.aggregator_port))

    @staticmethod
    def wait_ready(process: Process, ready: Callable[[], bool]) -> None:
        """Until ``ready()``; a failure names the process and ends with its log (what tells
        why a restarted service did not come back)."""
        try:
            wait_until(ready, TIMEOUT, what=process.name)
        except StalledError as exc:
            raise AssertionError(f"{exc}; its log ends:\n{process.output()[-4000:]}") from None

    def track(self, process: Process) -> Process:
        """``process``, killed with the stack whatever the test's outcome."""
        self.others.append(process)
        return process

    def fleet(self, acked_log: Path, seed: int, rounds: int = ROUNDS) -> Process:
        args = fleet_args(
            DEP,
            self.broker,
            devices=DEVICES,
            rounds=rounds,
            seed=seed,
            round_spread=SPREAD_SECONDS,
            acked_log=acked_log,
        )
        args += ["--mode", "multiplexed", "--connections", "12"]
        return self.track(Process("fleet", args, self.workdir, capture=True))

    def close(self) -> None:
        for timer in self.timers:
            timer.cancel()
            timer.join()
        for process in [self.aggregator, *(s.process for s in self.shards.values()), *self.others]:
            process.kill()
        if self.recorder is not None:
            self.recorder.close()


@contextlib.contextmanager
def running_stack(workdir: Path) -> Iterator[Stack]:
    nats_server_or_skip()
    with NatsCluster(workdir / "nats") as cluster:
        stack = Stack(workdir, cluster)
        try:
            shards = [stack.make_shard(0, i) for i in range(SHARDS)]
            stack.announce(shards)
            stack.recorder = Recorder(cluster.urls, {s.label: stack.public(s) for s in shards})
            for shard in shards:
                stack.start_shuffler(shard)
            stack.start_aggregator()
            yield stack
        finally:
            stack.close()


# -- running and reconciling ----------------------------------------------------------------


def run_fleet(stack: Stack, rng: random.Random, rounds: int = ROUNDS) -> tuple[Process, Path]:
    acked_log = stack.workdir / "acked.log"
    fleet = stack.fleet(acked_log, seed=rng.randrange(2**31), rounds=rounds)
    fleet.start()
    wait_until(
        lambda: acked_log.exists() and acked_log.stat().st_size > 0,
        TIMEOUT,
        what="the fleet's first PUBACK",
    )
    return fleet, acked_log


def finish_fleet(fleet: Process) -> dict[str, Any]:
    assert fleet.proc is not None
    stdout, _ = fleet.proc.communicate(timeout=300)
    summary = dict(json.loads(stdout))
    assert fleet.proc.returncode in (0, 3), fleet.output()[-3000:]
    return summary


def drawn(summary: dict[str, Any]) -> Counter[Report]:
    """Every report the fleet's devices drew in the rounds it ran (from its summary's seed
    and rounds, as :meth:`sim.fleet.run.Fleet.reports` gives them again): how often a
    report can be released at most."""
    config = FleetConfig(
        broker="mqtt://127.0.0.1:1",  # never connected: only its reports are drawn
        deployment=DEP,
        spec=SPEC,
        devices=DEVICES,
        round_seconds=ROUND_SECONDS,
        seed=int(summary["seed"]),
    )
    fleet = Fleet(config)
    return Counter(
        (round_, seed, z)
        for round_ in range(int(summary["first_round"]), int(summary["last_round"]) + 1)
        for report in fleet.reports(round_)
        if report is not None  # participation 1: every device reports
        for _keys, _signs, seed, z in [report]
    )


def print_collisions(released: Counter[Report]) -> None:
    """Print the ``(seed, z)`` released more than once (devices that drew alike)."""
    rounds: dict[tuple[int, int], list[int]] = {}
    for (round_, seed, z), count in released.items():
        rounds.setdefault((seed, z), []).extend([round_] * count)
    for (seed, z), where in sorted(rounds.items()):
        if len(where) > 1:
            print(f"(seed, z) = ({seed}, {z}) drawn by {len(where)} devices, rounds {where}")


def settle(stack: Stack, acked: Counter[Report], shards: list[Shard]) -> str:
    """Until every acknowledged report is released, the shards' outboxes are empty and the
    aggregator has applied what the recorder saw, unchanged for a while; then stop the
    shards' shufflers gracefully. Returns whether it settled, for :func:`reconcile`'s
    messages (a pipeline that did not settle fails there, with what is missing)."""
    recorder = stack.recorder
    assert recorder is not None
    history: list[tuple[int, int, int]] = []

    def done() -> bool:
        document = estimates(stack.aggregator_port)
        outboxes = [metrics(s.port) for s in shards if s.process.alive()]
        if document is None or any(m is None for m in outboxes):
            return False
        outbox = sum(int(m.get("coco_shuffler_outbox_reports", 1)) for m in outboxes if m)
        missing = sum((acked - recorder.released).values())
        state = (missing, outbox, recorder.count - int(document["n"]))
        history.append(state)
        return state == (0, 0, 0) and len(history) >= 20 and set(history[-20:]) == {state}

    try:
        wait_until(done, 180, what="the pipeline to settle")
        settled = "settled"
    except AssertionError:
        last = history[-1] if history else None
        settled = f"not settled (reports missing, in outboxes, recorded - applied: {last})"
    for shard in shards:
        samples = metrics(shard.port) or {}
        lost = {
            name: value
            for name, value in samples.items()
            if value
            and name.startswith(
                ("coco_shuffler_reports_rejected_total", "coco_shuffler_dropped_total")
            )
        }
        print(f"{shard.label}: rejected or dropped {lost}")
        if shard.process.alive():
            assert shard.process.stop() == 0, shard.process.output()[-3000:]
    return settled


NATS_TROUBLE = ("new stream leader", "took too long", "timeout for request", "slow consumer")
"""NATS log lines of a loaded or re-electing cluster (stream leaders are elected once at
start; consumer leaders at every new subscription, so those are not listed)."""


def unapplied(stack: Stack, applied: set[bytes], settled: str) -> str:
    """Why the aggregator lacks batches the recorder verified: each such batch, what the
    aggregator counted (rejections by reason, batches left unacknowledged, manifests'
    batches that never came), its log's warnings, and the cluster's trouble."""
    recorder = stack.recorder
    assert recorder is not None
    checkpoint = load_checkpoint(stack.checkpoint)
    listed = recorder.listed()
    lines = [f"the pipeline {settled}"]
    for batch_id in sorted(set(recorder.batches) - applied)[:10]:
        shard, round_, seeds, _zs = recorder.batches[batch_id]
        manifest = "listed in a manifest" if batch_id in listed else "in no manifest"
        lines.append(
            f"not applied: batch {batch_id.hex()} of {shard}, round {round_}, "
            f"{len(seeds)} reports, {manifest}"
        )
    unrecorded = sorted(applied - set(recorder.batches))
    lines += [f"applied, not recorded: {batch_id.hex()}" for batch_id in unrecorded[:10]]
    counters = checkpoint.counters
    lines.append(
        f"aggregator: rejected {counters.rejected}, unacknowledged {counters.unacknowledged}, "
        f"manifests rejected {counters.manifests_rejected}, reconciliation "
        f"{(checkpoint.reconciliation or {}).get('counts')}"
    )
    lines += [
        line
        for line in stack.aggregator.output().splitlines()
        if " WARNING " in line or " ERROR " in line
    ][-10:]
    trouble = [
        f"{node.name}: {line}"
        for node in stack.cluster.nodes
        for line in node.log_text().splitlines()
        if any(word in line for word in NATS_TROUBLE)
    ]
    return "\n".join(lines + trouble[-20:])


def reconcile(stack: Stack, acked: Counter[Report], summary: dict[str, Any], settled: str) -> None:
    recorder = stack.recorder
    assert recorder is not None
    assert not recorder.problems, recorder.problems[:3]
    released = recorder.released
    assert summary["reports_published"] == sum(acked.values())
    possible = drawn(summary)
    assert not acked - possible, "the fleet's reports are not drawn again alike"
    missing, extra = acked - released, released - acked
    assert not missing, f"{sum(missing.values())} acknowledged reports never released"
    # a report published before a fault cut its connection may be released without a PUBACK
    assert sum(extra.values()) <= sum(summary["publish_failures"].values()), extra
    twice = released - possible
    assert not twice, f"released more often than devices drew them (twice): {dict(twice)}"
    print_collisions(released)
    for shard in stack.shards.values():
        rejected = shard.process.output().count("wrong_shard")
        assert rejected == 0, f"{shard.label} logged wrong_shard"
    checkpoint = load_checkpoint(stack.checkpoint)
    offline = recorder.offline()
    applied = {batch_id for ids in checkpoint.batch_rounds.values() for batch_id in ids}
    assert applied == set(recorder.batches), unapplied(stack, applied, settled)
    assert checkpoint.state.n == offline.n == recorder.count
    assert np.array_equal(checkpoint.state.sum_u, offline.sum_u)
    assert np.array_equal(checkpoint.state.sum_v, offline.sum_v)
    listed = recorder.listed()
    assert set(listed) == set(recorder.batches), "a released batch without its manifest"
    print(
        f"acknowledged {sum(acked.values())}, released {recorder.count} in "
        f"{len(recorder.batches)} batches of {len({s for s, *_ in recorder.batches.values()})} "
        f"shards, {len(recorder.manifests)} manifests; aggregated {checkpoint.state.n}"
    )


def aggregator_counters(stack: Stack) -> dict[str, float]:
    samples = metrics(stack.aggregator_port) or {}
    return {
        name: value
        for name, value in samples.items()
        if name.startswith(
            ("coco_aggregator_reports_missing_total", "coco_aggregator_batches_rejected_total")
        )
        and value
    }


# -- the cases ------------------------------------------------------------------------------


def test_kill_a_broker_node_a_shard_and_the_aggregator(tmp_path: Path) -> None:
    rng = rng_for("kills")
    with running_stack(tmp_path) as stack:
        fleet, acked_log = run_fleet(stack, rng)
        span = (ROUNDS - 1.5) * ROUND_SECONDS
        moments = sorted((rng.uniform(0.0, span), what) for what in ("node", "shard", "aggregator"))
        start = time.monotonic()
        node = rng.randrange(3)
        shard = stack.shards[label(0, rng.randrange(SHARDS))]
        for moment, what in moments:
            time.sleep(max(0.0, start + moment - time.monotonic()))
            print(f"{what}: kill -9 {moment:.1f} s after the first PUBACK")
            if what == "node":
                stack.cluster.kill(node)
                restart = threading.Timer(rng.uniform(2.0, 6.0), stack.cluster.start, [node])
                stack.timers.append(restart)
                restart.start()
            elif what == "shard":
                shard.process.send(signal.SIGKILL)
                shard.process.wait()
                stack.start_shuffler(shard)
            else:
                stack.aggregator.send(signal.SIGKILL)
                stack.aggregator.wait()
                stack.start_aggregator()
        summary = finish_fleet(fleet)
        wait_until(lambda: len(stack.cluster.running()) == 3, TIMEOUT, what="every node")
        acked = read_acked_reports(acked_log)
        settled = settle(stack, acked, list(stack.shards.values()))
        counters = aggregator_counters(stack)
        assert stack.aggregator.stop() == 0, stack.aggregator.output()[-3000:]
        reconcile(stack, acked, summary, settled)
        assert not any(value for name, value in counters.items() if "reports_missing" in name), (
            counters
        )


def test_a_second_shuffler_on_an_owned_shard_and_a_reshard(tmp_path: Path) -> None:
    rng = rng_for("reshard")
    with running_stack(tmp_path) as stack:
        fleet, acked_log = run_fleet(stack, rng, rounds=RESHARD_ROUNDS)
        time.sleep(rng.uniform(0.0, ROUND_SECONDS))
        # a reshard to 2 shards, RESHARD_LEAD rounds ahead: the new shards' shufflers must
        # be subscribed, and the aggregator trust their keys, before their first round
        # (docs/operations.md, "Sharded shufflers")
        new = [stack.make_shard(1, i) for i in range(2)]
        first_new = int(time.time() // ROUND_SECONDS) + RESHARD_LEAD
        announced = stack.announce(new, "--reshard", "--shards-from-round", str(first_new))
        assert announced["shards"][1]["from_round"] == first_new
        print(f"reshard: 2 shards from round {first_new}")
        assert stack.recorder is not None
        stack.recorder.trust({s.label: stack.public(s) for s in new})
        # meanwhile a second process on a shard still owned, with its own state directory
        owned = stack.shards[label(0, rng.randrange(SHARDS))]
        intruder = stack.track(
            Process(
                "intruder",
                stack.shuffler_args(
                    owned.label, stack.workdir / "intruder-state", owned.key_dir, free_port()
                ),
                stack.workdir,
            )
        )
        for shard in new:
            shard.process.start()
        intruder.start()
        for shard in new:
            stack.wait_ready(shard.process, functools.partial(stack.shuffler_ready, shard))
        done = coco(
            "aggregator", "trust", "--checkpoint", str(stack.checkpoint), "--accept-announced"
        )
        assert done.returncode == 0, done.stderr
        late = time.time() - first_new * ROUND_SECONDS
        assert late < 0, f"the new shards were ready and trusted {late:.1f} s into their round"
        assert intruder.wait(TIMEOUT) != 0
        assert "held by another shuffler" in intruder.output(), intruder.output()[-2000:]
        summary = finish_fleet(fleet)
        acked = read_acked_reports(acked_log)
        old = [s for s in stack.shards.values() if s.label.startswith("g0")]
        # the old layout's shufflers retire once their last round is out
        for shard in old:
            assert shard.process.wait(TIMEOUT * 2) == 0, shard.process.output()[-3000:]
            assert "retir" in shard.process.output()
        settled = settle(stack, acked, new)
        counters = aggregator_counters(stack)
        assert stack.aggregator.stop() == 0, stack.aggregator.output()[-3000:]
        reconcile(stack, acked, summary, settled)
        recorder = stack.recorder
        assert recorder is not None
        rounds: dict[str, set[int]] = {"g0": set(), "g1": set()}
        for name, round_, _seeds, _zs in recorder.batches.values():
            rounds[name[:2]].add(round_)
        assert rounds["g1"], "the new layout released nothing"
        assert max(rounds["g0"]) < first_new <= min(rounds["g1"])
        assert not any(value for name, value in counters.items() if "reports_missing" in name), (
            counters
        )
