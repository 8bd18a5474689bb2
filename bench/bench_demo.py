"""How long `scripts/demo`'s pipeline step takes on the embedded broker: wall clock and CPU.

The README states this time ("19-23 s of wall clock and 8-9 s of CPU" on the 2-core
development machine at load ~7). A wall-clock time is a property of a machine and its load,
so it is measured here, not asserted by a test (tests/sim/test_embedded_broker.py checks the
CPU time of a smaller run, which load does not stretch).

Run: ``.venv/bin/python bench/bench_demo.py [--repeats 3] [--json PATH]``. Each repeat runs
``coco demo`` with the arguments of `scripts/demo` plus ``--embedded-broker`` in a fresh
process, and reports its wall-clock seconds, its CPU seconds (user + system, the process and
its children) and whether it accounted for every report.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
DEMO_ARGS = [
    *("--rounds", "3", "--epsilon", "1.0", "--s", "2", "--min-batch", "500"),
    *("--delta", "1e-6", "--seed", "1", "--embedded-broker", "--json"),
]


def one_run() -> dict[str, Any]:
    coco = Path(sys.executable).with_name("coco")
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    done = subprocess.run(
        [str(coco), "demo", *DEMO_ARGS], cwd=ROOT, capture_output=True, text=True, check=False
    )
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    doc: dict[str, Any] = {}
    if done.returncode == 0 and "{" in done.stdout:
        doc = json.loads(done.stdout[done.stdout.index("{") :])
    return {
        "exit": done.returncode,
        "wall_s": round(wall, 2),
        "cpu_s": round(cpu, 2),
        "reports_sent": doc.get("reports_sent"),
        "reports_unaccounted": doc.get("reports_unaccounted"),
    }


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", type=Path, default=None, help="also write the runs here")
    args = parser.parse_args(argv)
    load = os.getloadavg()[0]
    runs = [one_run() for _ in range(args.repeats)]
    print(f"coco demo {' '.join(DEMO_ARGS)}  ({os.cpu_count()} cores, load {load:.1f})")
    print("run  exit  wall s  cpu s  sent  unaccounted")
    for i, r in enumerate(runs, 1):
        print(
            f"{i:>3}  {r['exit']:>4}  {r['wall_s']:>6}  {r['cpu_s']:>5}  "
            f"{r['reports_sent']}  {r['reports_unaccounted']}"
        )
    if args.json is not None:
        args.json.write_text(json.dumps({"load": load, "runs": runs}, indent=2) + "\n")


if __name__ == "__main__":
    main()
