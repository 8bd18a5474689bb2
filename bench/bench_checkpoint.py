"""The aggregator with ``--checkpoint`` through Mosquitto: this tree against an older commit.

Run: ``.venv/bin/python bench/bench_checkpoint.py [--old fa86eba] [--pairs 5]
[--batches 600] [--batch 1000] [--d 512] [--json PATH]``.

It starts its own Mosquitto on a free 127.0.0.1 port (never the system broker) with the
stock in-flight window (``max_inflight_messages 20``: the window the aggregator's
``max_unacked`` is sized for) and a queue large enough for every batch. The older commit
is checked out in a temporary ``git worktree`` (removed at the end, nothing committed);
``--old`` defaults to the commit before the privacy ledger got its own two-generation
file (``<checkpoint>.ledger`` and ``.prev``), the aggregator whose checkpoint was one file.

Each pair runs both aggregators, one after the other, in alternating order (old first in
even pairs), each in its own process with a fresh checkpoint directory, the same
``--batches`` sealed batches (CoCo, ``--d``, s = 16, ``--batch`` reports each, the current
round of ``--round-seconds``, so the new tree's per-round series file is written too), the
same publisher (paho, QoS 1, every batch queued for the aggregator's session as fast as the
broker takes them). The aggregator process counts the reports it applied every 2 ms; the
rate is reports / (time of the last - time of the first). It prints min/median/max of each
side and the ratio of the medians and of each pair (new / old).

Benchmarks print; nothing here asserts a time (the machine they run on is shared).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve()
ROOT = HERE.parents[1]
DEFAULT_OLD = "fa86eba"
"""The parent of c54ac48, which put the privacy ledger into its own file with a previous
generation kept (re-read before each rotation) beside the checkpoint."""
DEPLOYMENT = "bench"
POLL = 0.002
WINDOW = 20
"""Mosquitto's default ``max_inflight_messages``."""


# --- the aggregator, in its own process, from either tree --------------------------------


def role_aggregator(args: argparse.Namespace) -> None:
    tree = Path(args.tree)
    sys.path.insert(0, str(tree))
    os.chdir(tree)
    asyncio.run(_aggregate(args))


async def _aggregate(args: argparse.Namespace) -> None:
    try:  # this tree
        config_module = importlib.import_module("aggregator.service.config")
        service_module = importlib.import_module("aggregator.service.service")
    except ImportError:  # a tree from before the aggregator's packages
        config_module = importlib.import_module("aggregator.config")
        service_module = importlib.import_module("aggregator.service")
    AggregatorConfig = config_module.AggregatorConfig
    Aggregator = service_module.Aggregator
    from edge.spec import MechanismSpec  # noqa: PLC0415

    spec = MechanismSpec(mechanism="coco", d=args.d, s=args.s, epsilon=1.0)
    config = AggregatorConfig(
        broker=f"mqtt://127.0.0.1:{args.port}",
        deployment=DEPLOYMENT,
        spec=spec,
        delta=1e-8,
        batch_public_key=args.key,
        min_batch=args.batch,
        round_seconds=args.round_seconds,
        http_port=None,
        client_id=f"bench-checkpoint-{os.getpid()}",
        session_expiry=0,
        checkpoint=Path(args.checkpoint),
    )
    expected = args.batches * args.batch
    async with Aggregator(config) as aggregator:
        runner = asyncio.ensure_future(aggregator.run())
        await asyncio.wait_for(aggregator.subscribed.wait(), 30)
        print("ready", flush=True)
        first = last = None
        seen = 0.0
        deadline = time.monotonic() + args.timeout
        while time.monotonic() < deadline:
            await asyncio.sleep(POLL)
            value = aggregator.counters.reports
            if value and first is None:
                first, seen = time.perf_counter(), value
            if value >= expected:
                last = time.perf_counter()
                break
        runner.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await runner
        reports = aggregator.counters.reports
        generation = aggregator.generation
    rate = None
    if first is not None and last is not None and last > first:
        rate = (reports - seen) / (last - first)
    print(
        json.dumps({"reports": reports, "rate": rate, "generations": generation}),
        flush=True,
    )


# --- orchestration -----------------------------------------------------------------------


@contextlib.contextmanager
def old_tree(commit: str, workdir: Path) -> Iterator[Path]:
    path = workdir / "old"
    subprocess.run(
        ["git", "-C", str(ROOT), "worktree", "add", "--detach", str(path), commit],
        check=True,
        capture_output=True,
    )
    try:
        yield path
    finally:
        subprocess.run(
            ["git", "-C", str(ROOT), "worktree", "remove", "--force", str(path)],
            check=False,
            capture_output=True,
        )


@contextlib.contextmanager
def mosquitto(workdir: Path) -> Iterator[int]:
    sys.path.insert(0, str(HERE.parent))
    from common import MOSQUITTO, free_port  # noqa: PLC0415

    port = free_port()
    conf = workdir / "mosquitto.conf"
    conf.write_text(
        f"listener {port} 127.0.0.1\nallow_anonymous true\npersistence false\n"
        f"max_queued_messages 1000000\nmax_queued_bytes 0\nmax_inflight_messages {WINDOW}\n"
        "log_type error\n"
    )
    proc = subprocess.Popen([MOSQUITTO, "-c", str(conf)], stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            with contextlib.suppress(OSError):
                import socket  # noqa: PLC0415

                socket.create_connection(("127.0.0.1", port), 0.2).close()
                break
            time.sleep(0.05)
        yield port
    finally:
        proc.terminate()
        proc.wait(10)


def make_batches(args: argparse.Namespace) -> tuple[str, list[bytes]]:
    import numpy as np  # noqa: PLC0415

    sys.path.insert(0, str(ROOT))
    from aggregator.service.core.batch_codec import encode_batch_arrays  # noqa: PLC0415
    from edge.batch_auth import BatchSigner  # noqa: PLC0415
    from edge.rounds import current_round  # noqa: PLC0415
    from edge.spec import MechanismSpec  # noqa: PLC0415

    spec = MechanismSpec(mechanism="coco", d=args.d, s=args.s, epsilon=1.0)
    signer = BatchSigner.generate(DEPLOYMENT)
    rng = np.random.default_rng(args.seed)
    round_ = current_round(args.round_seconds)
    payloads = []
    for _ in range(args.batches):
        seeds = rng.integers(0, 2**32, size=args.batch, dtype=np.uint32)
        z = rng.integers(0, spec.t, size=args.batch, dtype=np.uint16)
        raw = encode_batch_arrays(spec.fingerprint_int, round_, rng.bytes(16), seeds, z)
        payloads.append(signer.seal(raw))
    return signer.public_key_hex, payloads


def publish(port: int, payloads: Sequence[bytes]) -> None:
    import paho.mqtt.client as paho  # noqa: PLC0415
    from paho.mqtt.enums import CallbackAPIVersion  # noqa: PLC0415

    from edge.topics import batches_topic  # noqa: PLC0415

    client = paho.Client(CallbackAPIVersion.VERSION2, client_id="bench-checkpoint-pub")
    client.max_inflight_messages_set(1000)
    client.max_queued_messages_set(0)
    client.connect("127.0.0.1", port)
    client.loop_start()
    try:
        infos = [client.publish(batches_topic(DEPLOYMENT), p, qos=1) for p in payloads]
        for info in infos:
            info.wait_for_publish(60)
    finally:
        client.disconnect()
        client.loop_stop()


def one_run(
    args: argparse.Namespace, tree: Path, port: int, key: str, payloads: Sequence[bytes]
) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="bench-ckpt-run-") as tmp:
        cmd = [
            sys.executable,
            str(HERE),
            "--role",
            "aggregator",
            "--tree",
            str(tree),
            "--port",
            str(port),
            "--key",
            key,
            "--checkpoint",
            str(Path(tmp) / "agg.json"),
            *("--batches", str(args.batches), "--batch", str(args.batch)),
            *("--d", str(args.d), "--s", str(args.s)),
            *("--round-seconds", str(args.round_seconds), "--timeout", str(args.timeout)),
        ]
        env = {**os.environ, "PYTHONPATH": str(tree)}
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, env=env)
        assert proc.stdout is not None
        line = proc.stdout.readline()
        if line.strip() != "ready":
            proc.kill()
            raise RuntimeError(f"aggregator of {tree} did not start: {line!r}")
        publisher = threading.Thread(target=publish, args=(port, payloads))
        publisher.start()
        out, _ = proc.communicate(timeout=args.timeout + 60)
        publisher.join()
        result: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
        return result


def summary(values: Sequence[float]) -> dict[str, float]:
    return {"min": min(values), "median": statistics.median(values), "max": max(values)}


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--role")
    parser.add_argument("--tree")
    parser.add_argument("--port", type=int)
    parser.add_argument("--key")
    parser.add_argument("--checkpoint")
    parser.add_argument("--old", default=DEFAULT_OLD)
    parser.add_argument("--pairs", type=int, default=5)
    parser.add_argument("--batches", type=int, default=600)
    parser.add_argument("--batch", type=int, default=1000)
    parser.add_argument("--d", type=int, default=512)
    parser.add_argument("--s", type=int, default=16)
    parser.add_argument("--round-seconds", type=int, default=3600)
    parser.add_argument("--timeout", type=float, default=120.0)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--json")
    args = parser.parse_args(argv)
    if args.role == "aggregator":
        role_aggregator(args)
        return
    key, payloads = make_batches(args)
    rates: dict[str, list[float]] = {"old": [], "new": []}
    runs: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="bench-ckpt-") as tmp:
        work = Path(tmp)
        with old_tree(args.old, work) as old, mosquitto(work) as port:
            trees = {"old": old, "new": ROOT}
            for pair in range(args.pairs):
                order = ("old", "new") if pair % 2 == 0 else ("new", "old")
                for side in order:
                    result = one_run(args, trees[side], port, key, payloads)
                    runs.append({"pair": pair, "side": side, **result})
                    print(
                        f"pair {pair} {side}: {result['rate'] or 0:,.0f} reports/s "
                        f"({result['reports']:,} reports, {result['generations']} generations)",
                        flush=True,
                    )
                    if result["rate"] is None:
                        raise SystemExit(f"{side}: not every report applied: {result}")
                    rates[side].append(result["rate"])
    ratios = [n / o for n, o in zip(rates["new"], rates["old"], strict=True)]
    report = {
        "old_commit": args.old,
        "batches": args.batches,
        "batch": args.batch,
        "d": args.d,
        "window": WINDOW,
        "old": summary(rates["old"]),
        "new": summary(rates["new"]),
        "ratio_of_medians": statistics.median(rates["new"]) / statistics.median(rates["old"]),
        "pair_ratios": summary(ratios),
        "runs": runs,
    }
    for side in ("old", "new"):
        s = report[side]
        print(f"{side}: {s['min']:,.0f} / {s['median']:,.0f} / {s['max']:,.0f} reports/s")
    print(
        f"new / old: {report['ratio_of_medians']:.3f} (medians); pairs "
        f"{min(ratios):.3f} / {statistics.median(ratios):.3f} / {max(ratios):.3f}"
    )
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
