"""Sharded shufflers on a 3-node NATS cluster: reports per CPU-second at K = 1, 2, 3 shards,
against plain MQTT subscribers on the same traffic.

Run: ``.venv/bin/python bench/bench_shards.py [--devices 3000] [--rounds 2]
[--round-seconds 8] [--repeats 3] [--shards 1 2 3] [--quick] [--json PATH]``.

Every case runs on a fresh 3-node NATS cluster (``tests.clusters.NatsCluster``: JetStream,
MQTT streams and consumers on 3 replicas) and only through the ``coco`` command line, in
separate processes, as an operator runs it (docs/operations.md, "Sharded shufflers"):

* ``shards K``: ``coco credentials --batch-key-dir`` once per shard, ``coco announce`` with K
  ``--shard-key``, one ``coco shuffler --shard g0s<i>`` per shard (its own state directory and
  key, durable state as always), one ``coco aggregator run --checkpoint``, then ``coco fleet``
  (``--devices`` x ``--rounds``, multiplexed over 12 connections spread on the 3 nodes, its
  acknowledged reports in ``--acked-log``). The case ends when the aggregator has applied as
  many reports as the fleet had acknowledged (its ``/estimates`` ``n``), or 60 s after the
  fleet's last round with no progress.
* ``mqtt``: the same announcement as the largest K and the same fleet, but the reports are
  consumed by plain MQTT subscribers (paho-mqtt, one persistent QoS 1 session per shard on
  ``ingress/<label>/+``, the filter a shuffler subscribes, on the nodes in turn, in one
  process of their own) that only count distinct payloads: the broker's share of the cost.

CPU is user + system seconds read from ``/proc/<pid>/stat`` (each process and its
descendants) from just before the fleet starts to the end of the case, for the shufflers
(summed over the K processes), the 3 broker nodes, the aggregator and the subscribers (the
fleet's from ``getrusage(RUSAGE_CHILDREN)`` once it is reaped); per CPU-second rates divide
the reports the fleet had acknowledged by those seconds.
The window includes each shuffler's idle time between rounds and until the last round is
released (``--max-skew`` 5 s after it ends), which an operator pays too; so, with every
process started and before the fleet, each case first measures the idle CPU rate of the
consumers and of the brokers over 5 s, and the second table gives the CPU per report less
that rate times the case's wall time (the marginal cost of a report). Completeness:
acknowledged == aggregated (each acknowledged ``(seed, z)`` once in the subscribers' copy,
for ``mqtt``). The cases of one repeat run one after the other in a shuffled order, so each
ratio K/1 is taken within a repeat; tables give min / median / max over the repeats.
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
import random
import resource
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import paho.mqtt.client as mqtt

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout

from bench_brokers import tree_rss

from edge.codec import CodecError, decode_report
from tests.clusters import NATS_SERVER, NatsCluster
from tests.cputime import tree_cpu_seconds
from tests.mqtt_adapters import FailoverClient
from tests.ports import free_port
from tests.processes import COCO, Process, estimates, read_acked
from tests.service_http import metrics

DEP = "benchshards"
MECHANISM = ("coco", 128, 8)  # mechanism, d, s: the spec of docs/scaling.md's privacy table
MIN_BATCH = 200
CONNECTIONS = 12
SPREAD_FRACTION = 0.5  # of a round, over which its reports are spread
MAX_SKEW = 5.0
IDLE_SECONDS = 60.0  # after the fleet: no progress for this long ends a case
IDLE_PROBE = 5.0  # seconds of CPU measured with everything started and no fleet yet
READY_TIMEOUT = 120.0


def label(index: int) -> str:
    return f"g0s{index}"


# --- plain MQTT subscribers (the baseline), in a process of their own ----------------------


def subscribers_main(
    *,
    urls: list[str],
    shards: int,
    ready: multiprocessing.synchronize.Event,
    stop: multiprocessing.synchronize.Event,
    received: Any,
    out: Any,
) -> None:
    """One persistent QoS 1 session per shard on ``ingress/<label>/+``, on the nodes in turn;
    sends back every distinct ``(seed, z)`` received and the number of deliveries."""
    lock = threading.Lock()
    seen: set[tuple[int, int]] = set()
    deliveries = [0]
    subscribed = [threading.Event() for _ in range(shards)]
    clients = []

    def on_message(_c: Any, _u: Any, message: mqtt.MQTTMessage) -> None:
        try:
            _v, _fp, _round, seed, z = decode_report(bytes(message.payload))
        except CodecError:
            return
        with lock:
            deliveries[0] += 1
            if (seed, z) not in seen:
                seen.add((seed, z))
                with received.get_lock():
                    received.value += 1

    for index in range(shards):
        topic = f"coco/v1/{DEP}/ingress/{label(index)}/+"

        def subscribe(client: mqtt.Client, topic: str = topic) -> None:
            client.subscribe(topic, qos=1)

        fc = FailoverClient(
            urls,
            index % len(urls),
            f"bench-shards-sub-{label(index)}",
            clean_session=False,
            on_connected=subscribe,
        )
        fc.client.on_message = on_message
        fc.client.on_subscribe = lambda *_a, e=subscribed[index]: e.set()
        clients.append(fc)
    for event in subscribed:
        event.wait(READY_TIMEOUT)
    ready.set()
    stop.wait()
    for fc in clients:
        fc.close()
    with lock:
        out.put((sorted(seen), deliveries[0]))


# --- one case ------------------------------------------------------------------------------


@dataclass
class CaseResult:
    case: str  # "mqtt" or "shards K"
    shards: int
    repeat: int
    acked: int
    consumed: int  # aggregated (shuffler cases) or distinct reports received (mqtt)
    complete: bool  # every acknowledged report consumed, once
    wall_seconds: float  # fleet start to the last report consumed
    shuffler_cpu: float
    broker_cpu: float
    aggregator_cpu: float
    subscriber_cpu: float
    fleet_cpu: float
    idle_consumer_cpu_per_s: float = 0.0  # the consumers' CPU per wall second before the fleet
    idle_broker_cpu_per_s: float = 0.0
    shuffler_rss_mib: list[float] = field(default_factory=list)
    broker_rss_mib: list[float] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def consumer_cpu(self) -> float:
        """The consuming side: the shufflers, or the plain subscribers."""
        return self.subscriber_cpu if self.case == "mqtt" else self.shuffler_cpu

    def net_us_per_report(self, cpu: float, idle_per_s: float) -> float:
        """CPU microseconds per report, less the idle rate over the case's wall time."""
        busy = cpu - idle_per_s * self.wall_seconds
        return 1e6 * busy / self.acked if self.acked else 0.0

    def per_cpu(self, seconds: float) -> float:
        return self.acked / seconds if seconds > 0 else 0.0


def coco(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(
        [*COCO, *args], check=False, capture_output=True, text=True, timeout=timeout
    )
    if done.returncode != 0:
        raise RuntimeError(f"coco {args[0]} failed: {done.stderr[-2000:]}")
    return done


def wait_until(what: str, predicate: Any, timeout: float, process: Process | None = None) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if process is not None and not process.alive():
            raise RuntimeError(f"{what}: the process exited\n{process.output()[-3000:]}")
        if time.monotonic() > deadline:
            extra = process.output()[-3000:] if process is not None else ""
            raise RuntimeError(f"timed out waiting for {what}\n{extra}")
        time.sleep(0.1)


def pid_of(process: Process) -> int:
    assert process.proc is not None
    return process.proc.pid


class Case:
    """One case on a fresh cluster in ``work``: ``shards`` = the layout announced (the
    number of plain subscribers for ``mqtt``)."""

    def __init__(
        self, case: str, shards: int, repeat: int, args: argparse.Namespace, work: Path
    ) -> None:
        self.case, self.shards, self.repeat, self.args, self.work = case, shards, repeat, args, work
        work.mkdir(parents=True)
        self.cluster = NatsCluster(work / "nats")
        self.processes: list[Process] = []
        self.shufflers: list[tuple[Process, int]] = []
        self.aggregator: Process | None = None
        self.aggregator_port = free_port()
        ctx = multiprocessing.get_context("fork")
        self.ctx = ctx
        self.ready, self.stop = ctx.Event(), ctx.Event()
        self.received: Any = ctx.Value("i", 0)
        self.sub_out: Any = ctx.Queue()
        self.sub_proc: multiprocessing.process.BaseProcess | None = None

    @property
    def broker(self) -> str:
        return ",".join(self.cluster.urls)

    def node_pids(self) -> list[int]:
        return [n.proc.pid for n in self.cluster.nodes if n.proc is not None]

    def announce(self) -> list[Path]:
        """A key per shard (``coco credentials``) and the layout (``coco announce``)."""
        keys = []
        for index in range(self.shards):
            key_dir = self.work / f"key-{label(index)}"
            coco("credentials", "--batch-key-dir", str(key_dir))
            keys.append(key_dir)
        mechanism, d, s = MECHANISM
        cmd = ["announce", "--deployment", DEP, "--mechanism", mechanism, "--d", str(d)]
        cmd += ["--s", str(s), "--epsilon", "1", "--delta", "1e-8"]
        cmd += ["--min-batch", str(MIN_BATCH), "--round-seconds", str(self.args.round_seconds)]
        cmd += ["--shard-seed", "12345", "--broker", self.cluster.urls[0]]
        cmd += ["--mqtt-version", "auto"]
        for key_dir in keys:
            cmd += ["--shard-key", str(key_dir / "public" / "signing.pub")]
        coco(*cmd)
        return keys

    def start_subscribers(self) -> None:
        self.sub_proc = self.ctx.Process(
            target=subscribers_main,
            kwargs={
                "urls": self.cluster.urls,
                "shards": self.shards,
                "ready": self.ready,
                "stop": self.stop,
                "received": self.received,
                "out": self.sub_out,
            },
        )
        self.sub_proc.start()
        if not self.ready.wait(READY_TIMEOUT):
            raise RuntimeError("the subscribers did not subscribe")

    def start_pipeline(self, keys: list[Path]) -> None:
        """``coco shuffler --shard`` per shard, then ``coco aggregator run``."""
        for index, key_dir in enumerate(keys):
            port = free_port()
            cmd = ["shuffler", "--deployment", DEP, "--broker", self.broker]
            cmd += ["--shard", label(index), "--state-dir", str(self.work / f"state-{index}")]
            cmd += ["--signing-key", str(key_dir / "private" / "signing.key")]
            cmd += ["--metrics-port", str(port), "--max-skew", str(MAX_SKEW)]
            cmd += ["--no-broker-stats"]
            process = Process(f"shuffler-{label(index)}", cmd, self.work)
            process.start()
            self.processes.append(process)
            self.shufflers.append((process, port))
        for process, port in self.shufflers:
            wait_until(
                process.name,
                lambda port=port: (metrics(port) or {}).get("coco_shuffler_ready") == 1,
                READY_TIMEOUT,
                process,
            )
        cmd = ["aggregator", "run", "--deployment", DEP, "--broker", self.broker]
        cmd += ["--checkpoint", str(self.work / "aggregator.json")]
        cmd += ["--metrics-port", str(self.aggregator_port)]
        aggregator = Process("aggregator", cmd, self.work)
        self.aggregator = aggregator
        aggregator.start()
        self.processes.append(aggregator)
        wait_until(
            "the aggregator",
            lambda: bool((estimates(self.aggregator_port) or {}).get("subscribed")),
            READY_TIMEOUT,
            aggregator,
        )

    def cpu(self) -> dict[str, float]:
        sub_pid = self.sub_proc.pid if self.sub_proc is not None else None
        return {
            "shuffler": tree_cpu_seconds(*(pid_of(p) for p, _ in self.shufflers)),
            "broker": tree_cpu_seconds(*self.node_pids()),
            "aggregator": tree_cpu_seconds(pid_of(self.aggregator)) if self.aggregator else 0.0,
            "subscriber": tree_cpu_seconds(sub_pid) if sub_pid else 0.0,
        }

    def run_fleet(self, acked_log: Path) -> tuple[dict[str, Any], float]:
        """``coco fleet`` to its end: its summary and its CPU seconds."""
        args = self.args
        cmd = ["fleet", "--deployment", DEP, "--broker", self.broker]
        cmd += ["--devices", str(args.devices), "--rounds", str(args.rounds)]
        cmd += ["--seed", str(1000 * self.repeat + self.shards), "--acked-log", str(acked_log)]
        cmd += ["--round-spread", str(args.round_seconds * SPREAD_FRACTION)]
        cmd += ["--mode", "multiplexed", "--connections", str(CONNECTIONS)]
        cmd += ["--model", "keyvalue", "--json", "--no-progress"]
        fleet = Process("fleet", cmd, self.work, capture=True)
        # the fleet is the only child reaped meanwhile: its CPU is the children's usage added
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        fleet.start()
        assert fleet.proc is not None
        stdout, _ = fleet.proc.communicate(timeout=600)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        fleet_cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
        if fleet.proc.returncode not in (0, 3):
            raise RuntimeError(f"coco fleet exited {fleet.proc.returncode}\n{fleet.output()}")
        return dict(json.loads(stdout)), fleet_cpu

    def consumed(self) -> int:
        if self.case == "mqtt":
            return int(self.received.value)
        return int((estimates(self.aggregator_port) or {}).get("n", 0))

    def wait_consumed(self, target: int) -> tuple[int, float]:
        """Until ``target`` reports are consumed, or no progress for IDLE_SECONDS: the count
        and when it last changed (time.monotonic)."""
        last, last_change = -1, time.monotonic()
        while True:
            now = self.consumed()
            if now != last:
                last, last_change = now, time.monotonic()
            if now >= target or time.monotonic() - last_change > IDLE_SECONDS:
                return last, last_change
            time.sleep(0.1)

    def shuffler_losses(self) -> list[str]:
        notes = []
        for process, port in self.shufflers:
            samples = metrics(port) or {}
            dropped = sum(
                value
                for name, value in samples.items()
                if name.startswith(
                    ("coco_shuffler_reports_rejected_total", "coco_shuffler_dropped_total")
                )
            )
            if dropped:
                notes.append(f"{process.name}: {dropped:.0f} rejected or dropped")
        return notes

    def run(self) -> CaseResult:
        self.cluster.start_all()
        keys = self.announce()
        if self.case == "mqtt":
            self.start_subscribers()
        else:
            self.start_pipeline(keys)
        acked_log = self.work / "acked.log"
        idle0, t_idle = self.cpu(), time.monotonic()
        time.sleep(IDLE_PROBE)
        cpu0, t0 = self.cpu(), time.monotonic()
        idle = {k: (cpu0[k] - idle0[k]) / (t0 - t_idle) for k in cpu0}
        summary, fleet_cpu = self.run_fleet(acked_log)
        acked_pairs = read_acked(acked_log) if acked_log.exists() else collections.Counter()
        acked = sum(acked_pairs.values())
        consumed, t_last = self.wait_consumed(acked)
        cpu1 = self.cpu()
        notes = [f"{k}: {v}" for k, v in summary.get("publish_failures", {}).items() if v]
        if summary.get("rounds_late"):
            notes.append(f"rounds_late {summary['rounds_late']}")
        complete = consumed == acked
        if self.case == "mqtt":
            self.stop.set()
            seen, deliveries = self.sub_out.get(timeout=120)
            got = {(int(a), int(b)) for a, b in seen}
            complete = complete and all(pair in got for pair in acked_pairs)
            notes.append(f"{deliveries - len(got)} redelivered")
        else:
            notes += self.shuffler_losses()
        return CaseResult(
            case=self.case if self.case == "mqtt" else f"shards {self.shards}",
            shards=self.shards,
            repeat=self.repeat,
            acked=acked,
            consumed=consumed,
            complete=complete,
            wall_seconds=t_last - t0,
            shuffler_cpu=cpu1["shuffler"] - cpu0["shuffler"],
            broker_cpu=cpu1["broker"] - cpu0["broker"],
            aggregator_cpu=cpu1["aggregator"] - cpu0["aggregator"],
            subscriber_cpu=cpu1["subscriber"] - cpu0["subscriber"],
            fleet_cpu=fleet_cpu,
            idle_consumer_cpu_per_s=idle["subscriber" if self.case == "mqtt" else "shuffler"],
            idle_broker_cpu_per_s=idle["broker"],
            shuffler_rss_mib=[tree_rss(pid_of(p)) / 2**20 for p, _ in self.shufflers],
            broker_rss_mib=[tree_rss(pid) / 2**20 for pid in self.node_pids()],
            notes=notes,
        )

    def close(self) -> None:
        self.stop.set()
        if self.sub_proc is not None:
            self.sub_proc.join(timeout=30)
            if self.sub_proc.is_alive():
                self.sub_proc.kill()
        for process in self.processes:
            if process.alive():
                process.stop()
        self.cluster.close()


def run_case(
    case: str, shards: int, repeat: int, args: argparse.Namespace, work: Path
) -> CaseResult:
    runner = Case(case, shards, repeat, args, work)
    try:
        return runner.run()
    finally:
        runner.close()


# --- the table -----------------------------------------------------------------------------


def spread(values: Sequence[float], fmt: str = "{:,.0f}") -> str:
    if not values:
        return "-"
    picks = (min(values), statistics.median(values), max(values))
    return " / ".join(fmt.format(v) for v in picks)


def net_table(by_case: dict[str, list[CaseResult]], cases: Sequence[str]) -> list[str]:
    """The idle CPU rates, and the CPU per report less them."""
    lines = [
        "",
        "| case | consumers' idle CPU s per s | consumers' net CPU us per report "
        "| brokers' idle CPU s per s | brokers' net CPU us per report |",
        "|---|---:|---:|---:|---:|",
    ]
    for case in cases:
        runs = by_case.get(case, [])
        if not runs:
            continue
        name = "plain MQTT subscribers" if case == "mqtt" else case
        consumer = [r.net_us_per_report(r.consumer_cpu, r.idle_consumer_cpu_per_s) for r in runs]
        broker = [r.net_us_per_report(r.broker_cpu, r.idle_broker_cpu_per_s) for r in runs]
        lines.append(
            f"| {name} | {spread([r.idle_consumer_cpu_per_s for r in runs], '{:.3f}')} "
            f"| {spread(consumer)} | {spread([r.idle_broker_cpu_per_s for r in runs], '{:.3f}')} "
            f"| {spread(broker)} |"
        )
    return lines


def tables(results: Sequence[CaseResult], shard_counts: Sequence[int]) -> str:
    cases = ["mqtt"] + [f"shards {k}" for k in shard_counts]
    by_case: dict[str, list[CaseResult]] = collections.defaultdict(list)
    for r in results:
        by_case[r.case].append(r)
    lines = [
        "| case | acked = consumed | reports per consumer CPU-s | per broker CPU-s "
        "| consumer CPU s | broker CPU s | aggregator CPU s | fleet CPU s | wall s |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for case in cases:
        runs = by_case.get(case, [])
        if not runs:
            continue
        name = "plain MQTT subscribers" if case == "mqtt" else case
        done = sum(1 for r in runs if r.complete)
        acked = sorted({r.acked for r in runs})
        lines.append(
            f"| {name} | {done}/{len(runs)} ({', '.join(f'{a:,}' for a in acked)}) "
            f"| {spread([r.per_cpu(r.consumer_cpu) for r in runs])} "
            f"| {spread([r.per_cpu(r.broker_cpu) for r in runs])} "
            f"| {spread([r.consumer_cpu for r in runs], '{:.1f}')} "
            f"| {spread([r.broker_cpu for r in runs], '{:.1f}')} "
            f"| {spread([r.aggregator_cpu for r in runs], '{:.1f}')} "
            f"| {spread([r.fleet_cpu for r in runs], '{:.1f}')} "
            f"| {spread([r.wall_seconds for r in runs], '{:.1f}')} |"
        )
    lines += net_table(by_case, cases)
    ratio_lines = [
        "",
        "| ratio, within each repeat | reports per shuffler CPU-s | per broker CPU-s |",
        "|---|---:|---:|",
    ]
    base = shard_counts[0]
    repeats = sorted({r.repeat for r in results})
    for k in shard_counts[1:]:
        shuffler_ratios, broker_ratios = [], []
        for rep in repeats:
            one = [r for r in by_case[f"shards {base}"] if r.repeat == rep]
            many = [r for r in by_case[f"shards {k}"] if r.repeat == rep]
            if one and many and one[0].shuffler_cpu and many[0].shuffler_cpu:
                shuffler_ratios.append(
                    many[0].per_cpu(many[0].shuffler_cpu) / one[0].per_cpu(one[0].shuffler_cpu)
                )
                broker_ratios.append(
                    many[0].per_cpu(many[0].broker_cpu) / one[0].per_cpu(one[0].broker_cpu)
                )
        ratio_lines.append(
            f"| K={k} / K={base} | {spread(shuffler_ratios, '{:.2f}')} "
            f"| {spread(broker_ratios, '{:.2f}')} |"
        )
    mqtt_ratios = []
    for rep in repeats:
        plain = [r for r in by_case["mqtt"] if r.repeat == rep]
        for k in shard_counts:
            sharded = [r for r in by_case[f"shards {k}"] if r.repeat == rep]
            if plain and sharded and plain[0].broker_cpu and sharded[0].broker_cpu:
                mqtt_ratios.append(
                    (
                        k,
                        sharded[0].per_cpu(sharded[0].broker_cpu)
                        / plain[0].per_cpu(plain[0].broker_cpu),
                    )
                )
    for k in shard_counts:
        values = [v for kk, v in mqtt_ratios if kk == k]
        if values:
            ratio_lines.append(
                f"| broker, K={k} / plain subscribers | - | {spread(values, '{:.2f}')} |"
            )
    return "\n".join(lines + ratio_lines)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else "")
    parser.add_argument("--devices", type=int, default=3000)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--round-seconds", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--shards", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--no-mqtt", action="store_true", help="skip the plain-MQTT baseline")
    parser.add_argument(
        "--quick", action="store_true", help="1,000 devices x 2 rounds of 6 s, 1 repeat"
    )
    parser.add_argument("--seed", type=int, default=0, help="order of the cases in a repeat")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    if args.quick:
        args.devices, args.rounds, args.round_seconds, args.repeats = 1000, 2, 6, 1
    if not Path(NATS_SERVER).exists():
        parser.error(f"{NATS_SERVER} is not installed (scripts/setup dev installs it)")
    shard_counts = sorted(set(args.shards))
    print(
        f"{platform.node()}: {os.cpu_count()} cores, load {os.getloadavg()}, "
        f"Python {platform.python_version()}, paho-mqtt {importlib.metadata.version('paho-mqtt')}, "
        f"{args.devices} devices x {args.rounds} rounds of {args.round_seconds} s, "
        f"shards {shard_counts}, {args.repeats} repeats",
        flush=True,
    )
    cases = [("mqtt", max(shard_counts))] if not args.no_mqtt else []
    cases += [("shards", k) for k in shard_counts]
    order = random.Random(args.seed)
    results: list[CaseResult] = []
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="bench-shards-") as tmp:
        for repeat in range(args.repeats):
            todo = list(cases)
            order.shuffle(todo)
            for case, k in todo:
                work = Path(tmp) / f"r{repeat}-{case}-{k}"
                result = run_case(case, k, repeat, args, work)
                results.append(result)
                print(
                    f"  repeat {repeat + 1} {result.case}: acked {result.acked}, consumed "
                    f"{result.consumed}, consumer CPU {result.consumer_cpu:.2f} s, broker CPU "
                    f"{result.broker_cpu:.2f} s, aggregator CPU {result.aggregator_cpu:.2f} s, "
                    f"wall {result.wall_seconds:.1f} s, idle CPU per s: consumers "
                    f"{result.idle_consumer_cpu_per_s:.3f}, brokers "
                    f"{result.idle_broker_cpu_per_s:.3f} {result.notes}",
                    flush=True,
                )
    print(tables(results, shard_counts))
    print(f"load after: {os.getloadavg()}, {time.monotonic() - started:.0f} s in all")
    if args.json:
        args.json.write_text(json.dumps([asdict(r) for r in results], indent=2))


if __name__ == "__main__":
    main()
