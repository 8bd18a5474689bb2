"""The shuffler's durable state: bytes per device-round live and after a restart, recovery
time against log size, the log's size across restarts, the per-report ingest path, and the
process's own baseline, for two trees side by side.

Run: ``.venv/bin/python bench/bench_shuffler_state.py [--devices 100000 1000000]
[--rounds 3] [--repeats 3] [--before PATH] [--json PATH]``. ``--before`` is a checkout of
an older tree (for instance ``git archive <commit> broker edge | tar -x -C /tmp/before``):
every case then runs once with that tree's ``broker`` and once with this one's, each in a
fresh process (so RSS is its own), and the table shows both with their ratio.

``--memory`` runs only what memory needs (the cases ``state``, ``log``, ``recover`` and
``baseline``; no ingest), by default at 200,000 devices x 3 rounds, 3 repeats (about a
minute); ``--memory --devices 1000000`` for 10^6.

Cases, for ``D`` devices reporting in each of ``W`` rounds, all reports pooled (the state
of a shuffler holding ``W`` open rounds: the late window after a restart):

* ``state``: build the state through the core's own per-report path, then the resident
  memory it added (``VmRSS`` after ``gc.collect()``, minus before), per device-round;
* ``log``: the same reports written through the real ``EffectLog`` as the service writes
  them (records of one socket read of 500 reports at a time), its size per device-round;
* ``recover``: a fresh process replays that log into a core and compacts it, as
  ``coco shuffler`` does on start: seconds, peak RSS of the process (``ru_maxrss``), the
  resident memory the recovered state holds (``VmRSS`` after ``gc.collect()``, minus
  before, as in ``state``: per device-round, and its ratio to ``state`` of the same
  repeat), the log's size after; then twice more (restart after restart: the size must
  not grow; the first restart replays the log as written live, the others its
  compaction);
* ``baseline``: the resident memory of a process before any state: ``python -c pass``,
  Python after importing the shuffler service (``broker.service.shuffler``), and an idle
  ``coco shuffler`` (own Mosquitto on a free port, an empty state directory) once
  ``/ready`` answers 200, sampled from ``/proc/<pid>/status`` 3 times over 3 s;
* ``ingest``: 100,000 reports through the shuffler's message handler (topic check, decode,
  token, core, log, the group commit every 200 reports as after a socket read), durable
  state: microseconds per report. No broker: bench_pipeline.py measures it end to end.
"""

from __future__ import annotations

import argparse
import gc
import importlib
import json
import os
import resource
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parents[1]
READ = 500


def _rss() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS")


def _tree_is_new() -> bool:
    from broker.core import machine as core  # noqa: PLC0415

    return hasattr(core.ShufflerCore, "offer")


def _config(rounds: int, devices: int) -> Any:
    from broker.core.machine import CoreConfig  # noqa: PLC0415

    return CoreConfig(
        fingerprint=1,
        t=64,
        round_seconds=60,
        min_batch=100,
        max_batch=20_000,
        max_skew=5.0,
        late_seconds=60.0 * (rounds + 1),
        max_reports_per_round=devices + 1,
    )


def _feed(devices: int, rounds: int, log: Any = None) -> Any:
    """A core holding ``devices`` x ``rounds`` pooled reports (and the log written)."""
    from broker.core.machine import ShufflerCore  # noqa: PLC0415

    core: Any = ShufflerCore(_config(rounds, devices))  # either tree's API
    now = 1_800_000_000.0
    last = int(now // 60)
    new = _tree_is_new()
    for w in range(rounds):
        round_ = last - rounds + 1 + w
        for start in range(0, devices, READ):
            for device in range(start, min(start + READ, devices)):
                report = (1, round_, device * 7 + w, device % 64)
                token = (device * 0x9E3779B97F4A7C15 + 12345) % 2**64
                if new:
                    core.offer(now, token, report)
                else:
                    effect = core.accept(now, token.to_bytes(16, "little"), report)
                    if log is not None:
                        log.stage(effect)
                    core.apply_accepted(effect)
            if new:
                effects, _ = core.settle()
                for effect in effects:
                    if log is not None:
                        log.stage(effect)
                    core.apply(effect)
            if log is not None:
                log.flush()
    return core


def case_state(devices: int, rounds: int) -> dict[str, Any]:
    import broker.core.machine  # noqa: PLC0415  # modules (numpy...) loaded before measuring
    import broker.store.wal  # noqa: PLC0415, F401

    _feed(200, 1)  # and the core's code paths warmed up
    gc.collect()
    before = _rss()
    t0 = time.perf_counter()
    core = _feed(devices, rounds)
    seconds = time.perf_counter() - t0
    gc.collect()
    grown = _rss() - before
    assert core.buffered == devices * rounds
    return {"bytes_per_device_round": grown / (devices * rounds), "build_s": seconds}


def _log(path: Path) -> Any:
    from broker.store.wal import EffectLog  # noqa: PLC0415

    return EffectLog(path)


def case_log(devices: int, rounds: int, path: str) -> dict[str, Any]:
    log = _log(Path(path))
    log.replay()
    _feed(devices, rounds, log)
    log.close()
    size = Path(path).stat().st_size
    return {"log_bytes": size, "log_bytes_per_device_round": size / (devices * rounds)}


def _recover(log: Any, core: Any) -> None:
    """Replay ``log`` into ``core`` as ``coco shuffler`` does (``recover``: one record at a
    time; an older tree has only ``replay``) and compact it."""
    for effect in getattr(log, "recover", log.replay)():
        core.apply(effect)
    log.compact(core.snapshot())


def case_recover(devices: int, rounds: int, path: str) -> dict[str, Any]:
    from broker.core.machine import ShufflerCore  # noqa: PLC0415

    _feed(200, 1)  # the same modules and code paths warmed up as in case_state
    with tempfile.TemporaryDirectory() as tmp:
        warm = Path(tmp) / "warm.log"
        case_log(200, 1, str(warm))
        _recover(_log(warm), ShufflerCore(_config(1, 200)))
    gc.collect()
    rss = _rss()
    before = Path(path).stat().st_size
    t0 = time.perf_counter()
    log = _log(Path(path))
    core = ShufflerCore(_config(rounds, devices))
    _recover(log, core)
    seconds = time.perf_counter() - t0
    log.close()
    del log
    gc.collect()
    grown = _rss() - rss
    assert core.buffered == devices * rounds, core.buffered
    return {
        "recover_s": seconds,
        "bytes_per_device_round": grown / (devices * rounds),
        "log_bytes_before": before,
        "log_bytes_after": Path(path).stat().st_size,
        "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
    }


def case_ingest(n: int, state: str) -> dict[str, Any]:
    import asyncio  # noqa: PLC0415

    from prometheus_client import CollectorRegistry  # noqa: PLC0415

    from broker.service.shuffler import Shuffler, ShufflerConfig  # noqa: PLC0415
    from edge.batch_auth import load_or_create_signing_key  # noqa: PLC0415
    from edge.codec import encode_report  # noqa: PLC0415
    from edge.spec import MechanismSpec  # noqa: PLC0415

    spec = MechanismSpec(mechanism="collision", d=512, s=16, epsilon=1.0)
    key = Path(state) / "key" / "signing.key"
    load_or_create_signing_key(key)
    config = ShufflerConfig(
        broker="mqtt://127.0.0.1:1",
        deployment="bench",
        spec=spec,
        min_batch=1_000,
        max_batch=10_000,
        release_size=10_000,
        round_seconds=3600,
        max_reports_per_round=2 * n,
        state_dir=Path(state) / "shuffler",
        signing_key=key,
    )
    round_ = int(time.time() // 3600)
    topics = [f"coco/v1/bench/ingress/dev-{i:07d}" for i in range(n)]
    payloads = [encode_report(spec.fingerprint_int, round_, i, i % spec.t) for i in range(n)]

    async def run() -> float:
        async with Shuffler(config, registry=CollectorRegistry()) as shuffler:
            handle = shuffler._handle_report
            flush = shuffler._flush_log
            t0 = time.perf_counter()
            for start in range(0, n, 200):
                for i in range(start, min(start + 200, n)):
                    handle(topics[i], payloads[i], retain=False)
                flush()
            return time.perf_counter() - t0

    seconds = asyncio.run(run())
    return {"us_per_report": seconds / n * 1e6}


def case_imported(module: str) -> dict[str, Any]:
    """The resident memory of this Python process after importing ``module`` (nothing
    for ``-``)."""
    if module != "-":
        importlib.import_module(module)
    gc.collect()
    return {"rss_bytes": _rss()}


def _status_rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no VmRSS for {pid}")


def idle_shuffler(tree: Path, samples: int = 3) -> list[int]:
    """VmRSS of an idle ``coco shuffler`` (own Mosquitto, empty state directory) once its
    ``/ready`` answers 200: ``samples`` readings one second apart."""
    from common import free_port, own_mosquitto  # noqa: PLC0415

    spec = {"mechanism": "collision", "d": 512, "s": 16, "epsilon": 1.0}
    with tempfile.TemporaryDirectory() as tmp, own_mosquitto(Path(tmp)) as port:
        spec_file = Path(tmp) / "spec.json"
        spec_file.write_text(json.dumps(_spec_dict(tree, spec)))
        metrics = free_port()
        argv = [sys.executable, "-c", "from sim.cli import main; main()", "shuffler"]
        argv += ["--deployment", "bench", "--broker", f"mqtt://127.0.0.1:{port}"]
        argv += ["--spec", str(spec_file), "--min-batch", "100", "--round-seconds", "60"]
        argv += ["--state-dir", f"{tmp}/state", "--signing-key", f"{tmp}/signing.key"]
        argv += ["--create-signing-key", "--metrics-port", str(metrics)]
        env = {**os.environ, "PYTHONPATH": str(tree)}
        proc = subprocess.Popen(
            argv, cwd=tree, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
        )
        try:
            deadline = time.monotonic() + 60
            while True:
                if proc.poll() is not None or time.monotonic() > deadline:
                    err = proc.stderr.read().decode() if proc.stderr else ""
                    raise RuntimeError(f"coco shuffler did not get ready: {err[-2000:]}")
                try:
                    with urllib.request.urlopen(f"http://127.0.0.1:{metrics}/ready", timeout=1):
                        break
                except OSError:
                    time.sleep(0.2)
            readings = []
            for _ in range(samples):
                time.sleep(1.0)
                readings.append(_status_rss(proc.pid))
            return readings
        finally:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def _spec_dict(tree: Path, fields: dict[str, Any]) -> dict[str, Any]:
    """The spec file's document, made by the tree's own ``MechanismSpec``."""
    code = (
        "import json, sys; from edge.spec import MechanismSpec; "
        "print(json.dumps(MechanismSpec(**json.loads(sys.argv[1])).to_dict()))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, json.dumps(fields)],
        env={**os.environ, "PYTHONPATH": str(tree)},
        cwd=tree,
        capture_output=True,
        text=True,
        check=True,
    )
    return dict(json.loads(done.stdout))


def baseline(tree: Path) -> dict[str, Any]:
    return {
        "python_rss_bytes": run_child(tree, "imported", "-")["rss_bytes"],
        "imported_rss_bytes": run_child(tree, "imported", "broker.service.shuffler")["rss_bytes"],
        "idle_shuffler_rss_bytes": idle_shuffler(tree),
    }


def child(args: list[str]) -> None:
    name, *rest = args
    if name == "imported":
        out = case_imported(rest[0])
    elif name == "state":
        out = case_state(int(rest[0]), int(rest[1]))
    elif name == "log":
        out = case_log(int(rest[0]), int(rest[1]), rest[2])
    elif name == "recover":
        out = case_recover(int(rest[0]), int(rest[1]), rest[2])
    else:
        out = case_ingest(int(rest[0]), rest[1])
    print(json.dumps(out), flush=True)


def run_child(tree: Path, *args: object) -> dict[str, Any]:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    done = subprocess.run(
        [sys.executable, str(Path(__file__).resolve()), "--child", *map(str, args)],
        env=env,
        capture_output=True,
        text=True,
        check=False,
        cwd=tree,
    )
    if done.returncode != 0:
        raise RuntimeError(done.stderr[-3000:])
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def measure(tree: Path, devices: int, rounds: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        path = str(Path(tmp) / "effects.log")
        out = run_child(tree, "state", devices, rounds)
        out.update(run_child(tree, "log", devices, rounds, path))
        recoveries = [run_child(tree, "recover", devices, rounds, path) for _ in range(3)]
    out["recover_s"] = recoveries[0]["recover_s"]
    out["peak_rss_bytes"] = recoveries[0]["peak_rss_bytes"]
    out["restart_bytes_per_device_round"] = [r["bytes_per_device_round"] for r in recoveries]
    out["log_bytes_after_restarts"] = [r["log_bytes_after"] for r in recoveries]
    return out


def _mmm(values: list[float], fmt: str) -> str:
    return " / ".join(format(v, fmt) for v in (min(values), statistics.median(values), max(values)))


def _print_state(name: str, devices: int, rounds: int, runs: list[dict[str, Any]]) -> None:
    print(f"{name:8} D={devices:>9,} W={rounds}", flush=True)
    state = _mmm([r["bytes_per_device_round"] for r in runs], ".1f")
    log = _mmm([r["log_bytes_per_device_round"] for r in runs], ".1f")
    recover = _mmm([r["recover_s"] for r in runs], ".2f")
    peak = _mmm([r["peak_rss_bytes"] / 1e6 for r in runs], ".0f")
    after = [round(b / 1e6, 1) for b in runs[0]["log_bytes_after_restarts"]]
    print(f"  state B/device-round {state} | log B/device-round {log}")
    restarts = [r["restart_bytes_per_device_round"] for r in runs]
    first = _mmm([r[0] for r in restarts], ".1f")
    later = _mmm([b for r in restarts for b in r[1:]], ".1f")
    ratios = [r[0] / run["bytes_per_device_round"] for r, run in zip(restarts, runs, strict=True)]
    print(
        f"  after a restart B/device-round {first} (ratio to live, per repeat, "
        f"{_mmm(ratios, '.2f')}) | after the next restarts {later}"
    )
    print(
        f"  log MB {runs[0]['log_bytes'] / 1e6:.1f} | recover s {recover} | "
        f"peak RSS MB {peak} | log MB after 3 restarts {after}",
        flush=True,
    )


def _baselines(name: str, tree: Path, repeats: int) -> list[dict[str, Any]]:
    runs = [baseline(tree) for _ in range(repeats)]
    python = _mmm([r["python_rss_bytes"] / 1e6 for r in runs], ".1f")
    imported = _mmm([r["imported_rss_bytes"] / 1e6 for r in runs], ".1f")
    idle = _mmm([b / 1e6 for r in runs for b in r["idle_shuffler_rss_bytes"]], ".1f")
    print(
        f"{name:8} baseline RSS MB: python {python} | after importing the shuffler service "
        f"{imported} | idle coco shuffler {idle}",
        flush=True,
    )
    return runs


def _ingest(trees: dict[str, Path], repeats: int, n: int) -> dict[str, list[dict[str, Any]]]:
    ingest: dict[str, list[dict[str, Any]]] = {name: [] for name in trees}
    with tempfile.TemporaryDirectory() as tmp:
        for k in range(repeats):
            for name, tree in trees.items():
                ingest[name].append(run_child(tree, "ingest", n, f"{tmp}/{name}{k}"))
    for name, runs in ingest.items():
        print(
            f"{name:8} ingest us/report (durable, in process) "
            f"{_mmm([r['us_per_report'] for r in runs], '.2f')}",
            flush=True,
        )
    return ingest


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--devices", type=int, nargs="+", default=None)
    parser.add_argument(
        "--memory",
        action="store_true",
        help="memory only: live vs after a restart, and the baseline (default 200,000 devices)",
    )
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--ingest", type=int, default=100_000)
    parser.add_argument("--before", type=Path, default=None)
    parser.add_argument("--json", default=None)
    parser.add_argument("--child", nargs="+", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child)
        return
    if args.devices is None:
        args.devices = [200_000] if args.memory else [100_000, 1_000_000]
    trees = {"current": HERE}
    if args.before is not None:
        trees = {"before": args.before.resolve(), **trees}
    results: dict[str, Any] = {}
    for devices in args.devices:
        by_tree: dict[str, list[dict[str, Any]]] = {name: [] for name in trees}
        for _ in range(args.repeats):  # interleaved: a busy moment hits both trees alike
            for name, tree in trees.items():
                by_tree[name].append(measure(tree, devices, args.rounds))
        for name, runs in by_tree.items():
            results[f"{name} {devices}"] = runs
            _print_state(name, devices, args.rounds, runs)
    for name, tree in trees.items():
        results[f"{name} baseline"] = _baselines(name, tree, args.repeats)
    if not args.memory:
        for name, runs in _ingest(trees, args.repeats, args.ingest).items():
            results[f"{name} ingest"] = runs
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
