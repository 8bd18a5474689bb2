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
import importlib.util
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout

import pipeline_roles
from common import MOSQUITTO, Child, own_mosquitto
from pipeline_roles import FILTER, KEY_ENV, SINGLE_TOPIC, rate_of

CLIENTS = ("aiomqtt", "aiomqtt-v5", "paho", "gmqtt")


# --- orchestration -------------------------------------------------------------------------


def role(*args: object) -> Child:
    """A role of this script (bench/pipeline_roles.py) in its own process."""
    return Child([sys.executable, __file__, "--role", *map(str, args)])


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
    return {"count": count, "first": first, "last": last, "rate": rate_of(count, first, last)}


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
        pub = role("publish", port, n, qos)
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
        sink = role(f"sink-{client}", port, n, timeout)
        sink.wait_ready()
        _, (res,) = case_fleet(port, n, qos=qos, receivers=[sink], timeout=timeout)
        out[f"fleet -> {client}"] = res
    if "shuffler" in cases:
        shuf = role("shuffler", port, n, timeout, "default", "memory")
        shuf.wait_ready()
        _, (alone,) = case_fleet(port, n, qos=qos, receivers=[shuf], timeout=timeout)
        out["fleet -> shuffler (ingest)"] = alone
    if "durable" in cases:
        with tempfile.TemporaryDirectory() as state:
            shuf = role("shuffler", port, n, timeout, "default", Path(state) / "shuffler")
            shuf.wait_ready()
            _, (durable,) = case_fleet(port, n, qos=qos, receivers=[shuf], timeout=timeout)
        out["fleet -> shuffler, durable state (ingest)"] = durable
    if "v311" in cases:
        shuf = role("shuffler", port, n, timeout, "3.1.1")
        shuf.wait_ready()
        _, (v311,) = case_fleet(port, n, qos=qos, receivers=[shuf], timeout=timeout)
        out["fleet -> shuffler, MQTT 3.1.1"] = v311
    if "e2e" in cases:
        agg = role("aggregator", port, n, timeout)
        agg.wait_ready()
        shuf = role("shuffler", port, n, timeout)
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
    pipeline_roles.run(role, rest)


if __name__ == "__main__":
    main()
