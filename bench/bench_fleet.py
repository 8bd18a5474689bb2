"""Fleet publish rate: ``coco fleet`` (own connections, multiplexed) vs raw Mosquitto, in one run.

Run: ``.venv/bin/python bench/bench_fleet.py [--devices 1000 5000] [--rounds 3] [--qos 1]
[--round-seconds 2] [--json PATH]``. It raises its own soft ``RLIMIT_NOFILE`` to the hard
limit, then starts its own Mosquitto on a free 127.0.0.1 port (it inherits the limit; never
the system broker) and measures, one case at a time:

* ``raw``: bench_pipeline's raw-socket publisher (its own process, one connection, the same
  16-byte reports on per-device ingress topics, one report per device id), ``devices x
  rounds`` messages, rate from its first write to its last PUBACK (QoS 1) or last write
  (QoS 0): the denominator;
* ``fleet own``: :class:`sim.fleet.run.Fleet`, one MQTT connection per device, ``--rounds``
  wall-clock rounds of ``--round-seconds``; ``publish_rate_per_s`` (reports acknowledged /
  time inside rounds, including the per-round sensor model, encoding and randomisation, not
  the wait for the next round) and ``connect_rate_per_s``;
* ``fleet multiplexed``: the same over 4 shared connections;
* ``library``: the choice of client library, ``--library-devices`` own connections, each
  connecting then publishing one QoS 1 report, with the fleet's gmqtt connection and with
  aiomqtt (paho-mqtt underneath; paho's own loop needs a thread per client, ruled out).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout
sys.path.insert(0, str(Path(__file__).resolve().parent))

import aiomqtt
import bench_pipeline as bp
from common import Child, own_mosquitto

from edge.codec import encode_report
from edge.spec import MechanismSpec
from sim.credentials.accounts import device_id
from sim.fleet.connection import Connection, Report
from sim.fleet.run import Fleet, FleetConfig, ensure_fd_limit

SPEC = MechanismSpec(mechanism="coco", d=6, s=2, epsilon=1.0)
MULTIPLEXED_CONNECTIONS = 4


def raw_case(port: int, n: int, qos: int) -> dict[str, Any]:
    """bench_pipeline's raw publisher: ``n`` reports of ``n`` distinct devices."""
    pub = Child([sys.executable, bp.__file__, "--role", "publish", *map(str, (port, n, qos))])
    pub.wait_ready(120)
    res = pub.result(600)
    rate = n / (res["end"] - res["start"])
    return {"rate": rate, "messages": n}


def fleet_case(
    port: int, devices: int, rounds: int, qos: int, mode: str, *, round_seconds: int
) -> dict[str, Any]:
    cfg = FleetConfig(
        broker=f"mqtt://127.0.0.1:{port}",
        deployment=f"bench-{mode}-{devices}",
        spec=SPEC,
        devices=devices,
        rounds=rounds,
        round_seconds=round_seconds,
        qos=1 if qos else 0,
        mode="connections" if mode == "own" else "multiplexed",
        connections=MULTIPLEXED_CONNECTIONS,
        seed=1,
    )
    summary = asyncio.run(Fleet(cfg).run())
    return {
        "rate": summary["publish_rate_per_s"],
        "connect_rate": summary["connect_rate_per_s"],
        "published": summary["reports_published"],
        "failures": sum(summary["publish_failures"].values())
        + sum(summary["connect_failures"].values()),
    }


def _ignore(_conn: Connection) -> None:
    pass


async def _gmqtt_library(port: int, n: int) -> dict[str, Any]:
    conns = [
        Connection(device_id(i, "lib-g-"), username=None, password=None, window=10, on_lost=_ignore)
        for i in range(n)
    ]
    gate = asyncio.Semaphore(200)

    async def connect(c: Connection) -> None:
        async with gate:
            assert await c.connect("127.0.0.1", port, False, 30) is None

    t0 = time.monotonic()
    await asyncio.gather(*(connect(c) for c in conns))
    t1 = time.monotonic()
    done = asyncio.Event()
    acked = 0

    def on_done(reason: str | None) -> None:
        nonlocal acked
        assert reason is None
        acked += 1
        if acked == n:
            done.set()

    payload = encode_report(SPEC.fingerprint_int, 0, 1, 1)
    for i, c in enumerate(conns):
        topic = f"coco/v1/bench-lib/ingress/{device_id(i, 'lib-g-')}"
        c.publish(Report(topic, payload, on_done), 1)
    await asyncio.wait_for(done.wait(), 120)
    t2 = time.monotonic()
    await asyncio.gather(*(c.close(5) for c in conns))
    return {"connect_rate": n / (t1 - t0), "rate": n / (t2 - t1)}


async def _aiomqtt_library(port: int, n: int) -> dict[str, Any]:
    gate = asyncio.Semaphore(200)
    async with contextlib.AsyncExitStack() as stack:
        clients = [
            aiomqtt.Client("127.0.0.1", port, identifier=device_id(i, "lib-a-"), timeout=30)
            for i in range(n)
        ]

        async def connect(c: aiomqtt.Client) -> None:
            async with gate:
                await stack.enter_async_context(c)

        t0 = time.monotonic()
        await asyncio.gather(*(connect(c) for c in clients))
        t1 = time.monotonic()
        payload = encode_report(SPEC.fingerprint_int, 0, 1, 1)
        await asyncio.gather(
            *(
                c.publish(f"coco/v1/bench-lib/ingress/{device_id(i, 'lib-a-')}", payload, qos=1)
                for i, c in enumerate(clients)
            )
        )
        t2 = time.monotonic()
    return {"connect_rate": n / (t1 - t0), "rate": n / (t2 - t1)}


def _fmt(rate: float | None) -> str:
    return "-" if rate is None else f"{rate:,.0f}"


def orchestrate(args: argparse.Namespace) -> dict[str, Any]:
    ensure_fd_limit(2 * max(args.devices) + 500)  # the fleet and (inherited) the broker
    results: dict[str, Any] = {"library": {}, "cases": []}
    with tempfile.TemporaryDirectory() as tmp, own_mosquitto(Path(tmp)) as port:
        print(f"own mosquitto on 127.0.0.1:{port}", flush=True)
        n = args.library_devices
        for name, fn in (("gmqtt", _gmqtt_library), ("aiomqtt", _aiomqtt_library)):
            res = asyncio.run(fn(port, n))
            results["library"][name] = res
            print(
                f"library {name:8} {n} own connections: connect {_fmt(res['connect_rate'])}/s, "
                f"one QoS 1 report each {_fmt(res['rate'])}/s",
                flush=True,
            )
        for qos in args.qos:
            for devices in args.devices:
                raw = raw_case(port, devices * args.rounds, qos)
                row: dict[str, Any] = {"qos": qos, "devices": devices, "raw": raw}
                for mode in ("own", "multiplexed"):
                    row[mode] = fleet_case(
                        port, devices, args.rounds, qos, mode, round_seconds=args.round_seconds
                    )
                results["cases"].append(row)
                print(
                    f"QoS {qos} devices {devices}: raw {_fmt(raw['rate'])}/s | own "
                    f"{_fmt(row['own']['rate'])}/s (connect {_fmt(row['own']['connect_rate'])}/s,"
                    f" failures {row['own']['failures']}) | multiplexed "
                    f"{_fmt(row['multiplexed']['rate'])}/s (failures "
                    f"{row['multiplexed']['failures']})",
                    flush=True,
                )
    print("\nratios to raw mosquitto (reports/s)")
    print(f"{'qos':>3} {'devices':>8} {'raw r/s':>10} {'own r/s':>9} {'own/raw':>8} "
          f"{'mux r/s':>9} {'mux/raw':>8} {'own conn/s':>10}")  # fmt: skip
    for row in results["cases"]:
        raw_rate = row["raw"]["rate"]
        own, mux = row["own"], row["multiplexed"]
        print(
            f"{row['qos']:>3} {row['devices']:>8} {_fmt(raw_rate):>10} {_fmt(own['rate']):>9} "
            f"{own['rate'] / raw_rate:>8.3f} {_fmt(mux['rate']):>9} "
            f"{mux['rate'] / raw_rate:>8.3f} {_fmt(own['connect_rate']):>10}"
        )
    return results


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--devices", type=int, nargs="+", default=[1000, 5000])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--round-seconds", type=int, default=2)
    parser.add_argument("--qos", type=int, nargs="+", default=[1], choices=[0, 1])
    parser.add_argument("--library-devices", type=int, default=1000)
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    results = orchestrate(args)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
