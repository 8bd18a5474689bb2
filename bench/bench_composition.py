"""CPU seconds of ``epsilon_total``: this tree beside an older one (default ``main``).

Run: ``.venv/bin/python bench/bench_composition.py [--repeats R] [--baseline REV]
[--timeout S]``. Each measurement is a fresh process (nothing cached: the certified curve's
points are the cost), timing only the call with ``time.process_time``; ``R`` repeats give
min / median / max. The cases are the issue's: ``coco privacy --mechanism coco --epsilon 1
--s 8 --d 128 --n 1000000 --delta 1e-8 --rounds 1000`` (issue 19's target: within 10 s),
the same over 10^4 batches, and delta = 1e-6 (where the baseline finishes). The baseline
is ``git archive REV`` of ``aggregator/`` and ``edge/`` run the same way; a case it does not
finish within ``--timeout`` seconds of CPU (``RLIMIT_CPU``) is shown as such.

The live ledger's case (issue 27): 1,000 rounds whose release sizes are drawn uniformly in
``[5e5, 2e6]`` (seeded; 33 distinct accounting sizes), ``delta = 1e-8``, composed as the
ledger does (``aggregator.accountant.history.epsilon_total_rounds``): the first call in a
fresh process (cold, its target 10 s) and then ``--increments`` calls each after one more
round (a size from the same draw), as the ledger asks after every round. Each repeat draws
another history (seed = repeat), the same for both trees. This tree runs it twice: in a
fresh process with no curve file (writing one afterwards, untimed but reported), then in
another fresh process that reads that file first (the realistic restart of a live ledger:
:mod:`aggregator.ledger.curve_file`; reading and checking it is timed as part of cold, and
the increments write it as the accountant's process does).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import signal
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
CASES = ((10**6, 1_000, 1e-8), (10**6, 10_000, 1e-8), (10**6, 1_000, 1e-6))
TARGET = 10.0
VARIED_CHILD = """
import json, random, sys, time
from collections import Counter
from pathlib import Path
from aggregator.accountant.history import accounting_size, epsilon_total_rounds
from edge.spec import MechanismSpec
seed, rounds, increments = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
curves = Path(sys.argv[4]) if len(sys.argv) > 5 else Path()
mode = sys.argv[5] if len(sys.argv) > 5 else "none"  # none, write (after), read (first)
spec = MechanismSpec(mechanism="coco", d=128, s=8, epsilon=1.0)
rng = random.Random(seed)
history = Counter(rng.randint(500_000, 2_000_000) for _ in range(rounds))
distinct = len({accounting_size(n) for n in history})
file = None
if mode != "none":
    from aggregator.ledger.curve_file import CurveFile
    file = CurveFile(curves, spec, 1e-8)
start = time.process_time()
if mode == "read":
    loaded = file.load()
value = epsilon_total_rounds(spec, history, delta=1e-8)
cold = time.process_time() - start
write = None
if mode == "write":
    start = time.process_time()
    file.save()
    write = time.process_time() - start
steps = []
for _ in range(increments):
    history[rng.randint(500_000, 2_000_000)] += 1
    start = time.process_time()
    last = epsilon_total_rounds(spec, history, delta=1e-8)
    if mode == "read":
        file.save()  # as the accountant's process does after each computation
    steps.append(time.process_time() - start)
print(json.dumps({"value": value, "cold": cold, "steps": steps, "last": last,
                  "distinct": distinct, "write": write,
                  "loaded": loaded if mode == "read" else None}))
"""
CHILD = """
import json, sys, time
from aggregator.accountant import blanket_pair_for_spec, epsilon_total
from edge.spec import MechanismSpec
n, rounds, delta = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
spec = MechanismSpec(mechanism="coco", d=128, s=8, epsilon=1.0)
pair = blanket_pair_for_spec(spec, n=n)
start = time.process_time()
value = epsilon_total(pair, rounds=rounds, delta=delta)
print(json.dumps({"value": value, "cpu": time.process_time() - start}))
"""


def child(tree: Path, code: str, argv: list[str], timeout: float) -> dict[str, Any] | None:
    """The JSON a fresh process on ``tree`` prints; None if it used ``timeout`` seconds of
    CPU (RLIMIT_CPU: a loaded machine does not count against it)."""
    env = {**os.environ, "PYTHONPATH": str(tree), "OMP_NUM_THREADS": "1"}
    args = [sys.executable, "-P", "-c", code, *argv]
    limit = math.ceil(timeout)

    def limit_cpu() -> None:
        resource.setrlimit(resource.RLIMIT_CPU, (limit, limit + 5))

    try:
        done = subprocess.run(
            args,
            env=env,
            capture_output=True,
            text=True,
            timeout=20 * timeout,
            check=False,
            preexec_fn=limit_cpu,
        )
    except subprocess.TimeoutExpired:
        return None
    if done.returncode != 0:
        if done.returncode in (-signal.SIGXCPU, -signal.SIGKILL):
            return None
        raise RuntimeError(f"the measurement failed: {done.stderr.strip()}")
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def run(tree: Path, case: tuple[int, int, float], timeout: float) -> tuple[float, float] | None:
    """(epsilon_total, CPU seconds) of one equal-size case in a fresh process."""
    result = child(tree, CHILD, [str(x) for x in case], timeout)
    return None if result is None else (float(result["value"]), float(result["cpu"]))


def repeat(
    tree: Path, case: tuple[int, int, float], args: argparse.Namespace
) -> list[tuple[float, float] | None]:
    """``args.repeats`` runs, stopping at the first that does not finish."""
    results: list[tuple[float, float] | None] = []
    for _ in range(args.repeats):
        results.append(run(tree, case, args.timeout))
        if results[-1] is None:
            break
    return results


def summary(times: list[float]) -> str:
    return f"{min(times):6.2f} / {statistics.median(times):6.2f} / {max(times):6.2f}"


def cell(results: list[tuple[float, float] | None], timeout: float) -> str:
    """The value and min / median / max CPU, or how long it ran without finishing."""
    done = [r for r in results if r is not None]
    if len(done) < len(results):
        return f"{'no finish':>10} {f'> {timeout:g} s CPU':>24}"
    return f"{done[0][0]:10.6f} {summary([cpu for _, cpu in done]):>24}"


def ratio(
    baseline: list[tuple[float, float] | None], ours: list[tuple[float, float] | None]
) -> str:
    """Median baseline CPU over median CPU of this tree."""
    if any(r is None for r in (*baseline, *ours)):
        return f"{'-':>6}"
    return f"{median_cpu(baseline) / median_cpu(ours):6.1f}"


def median_cpu(results: list[tuple[float, float] | None]) -> float:
    return statistics.median(r[1] for r in results if r is not None)


def varied(trees: dict[str, Path], args: argparse.Namespace) -> None:
    """The live ledger's case: each tree cold with no curve file, and this tree again in a
    fresh process reading the curve file the first one wrote (a restart), side by side per
    repeat (alternating which tree runs first, so a change of load hits both)."""
    ours, theirs = list(trees)
    rows = {f"{ours}, no file": ours, f"{ours}, restart": ours, f"{theirs}": theirs}
    results: dict[str, list[dict[str, Any] | None]] = {row: [] for row in rows}
    with tempfile.TemporaryDirectory() as tmp:
        for repeat in range(args.repeats):
            curves = Path(tmp) / f"seed{repeat}.curves"
            argv = [str(repeat), "1000", str(args.increments)]
            order = [
                (f"{ours}, no file", [*argv, str(curves), "write"]),
                (f"{ours}, restart", [*argv, str(curves), "read"]),
                (f"{theirs}", argv),
            ]
            if repeat % 2:
                order = [order[2], order[0], order[1]]
            for row, row_argv in order:
                tree = trees[rows[row]]
                results[row].append(child(tree, VARIED_CHILD, row_argv, args.varied_timeout))
    print()
    print(
        f"1,000 rounds of sizes uniform in [5e5, 2e6], delta 1e-8, {args.repeats} histories "
        f"(seed = repeat), {args.increments} one-round increments each; CPU seconds "
        "min / median / max; 'restart': a fresh process that reads the curve file the "
        "'no file' run wrote (reading and checking it is counted in 'cold')"
    )
    header = f"{'run':>22} | {'cold':>24} | {'one more round':>24} | epsilon_total"
    print(header)
    print("-" * len(header))
    for row, runs in results.items():
        done = [r for r in runs if r is not None]
        if len(done) < len(runs):
            print(f"{row:>22} | {f'> {args.varied_timeout:g} s CPU':>24} |")
            continue
        values = ", ".join(f"{r['value']:.9f}" for r in done)
        cold = summary([float(r["cold"]) for r in done])
        steps = summary([float(t) for r in done for t in r["steps"]])
        print(f"{row:>22} | {cold:>24} | {steps:>24} | {values}")
        extra = f"distinct accounting sizes {[r['distinct'] for r in done]}"
        if done[0]["write"] is not None:
            extra += f"; writing the file: {summary([float(r['write']) for r in done])} s"
        if done[0]["loaded"] is not None:
            extra += f"; sizes read from it: {[r['loaded'] for r in done]}"
        print(f"{'':>22}   {extra}")
    base = results[theirs]
    if all(r is not None for rs in results.values() for r in rs):
        for row in (f"{ours}, no file", f"{ours}, restart"):
            mine = results[row]
            ratio_cold = _median(base, "cold") / _median(mine, "cold")
            ratio_step = _median_steps(base) / _median_steps(mine)
            print(
                f"{row}: speed-up over {theirs} (median over median): cold "
                f"{ratio_cold:.1f}x, one more round {ratio_step:.1f}x"
            )
        for fresh, restart, old in zip(
            results[f"{ours}, no file"], results[f"{ours}, restart"], base, strict=True
        ):
            assert fresh is not None
            assert restart is not None
            assert old is not None
            same = fresh["value"] == restart["value"] and fresh["last"] == restart["last"]
            change = (float(fresh["value"]) - float(old["value"])) / float(old["value"])
            print(
                f"{'':>22}   restart == no file bit for bit: {same}; relative to "
                f"{theirs}: {change:+.2e}"
            )
    print(f"target (issue 27): cold within {TARGET:g} s")


def _median(runs: list[dict[str, Any] | None], key: str) -> float:
    return statistics.median(float(r[key]) for r in runs if r is not None)


def _median_steps(runs: list[dict[str, Any] | None]) -> float:
    return statistics.median(float(t) for r in runs if r is not None for t in r["steps"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--baseline", default="main", help="git revision to compare with")
    parser.add_argument("--timeout", type=float, default=120.0)
    parser.add_argument("--increments", type=int, default=5)
    parser.add_argument(
        "--varied-timeout", type=float, default=600.0, help="CPU seconds, the live ledger's case"
    )
    parser.add_argument("--only-varied", action="store_true", help="skip the equal-size cases")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        baseline = Path(tmp)
        archive = subprocess.run(
            ["git", "-C", str(ROOT), "archive", args.baseline, "aggregator", "edge"],
            capture_output=True,
            check=True,
        ).stdout
        subprocess.run(["tar", "-x", "-C", str(baseline)], input=archive, check=True)
        print(f"coco s=8 d=128 eps0=1; baseline {args.baseline}")
        varied({"this tree": ROOT, "baseline": baseline}, args)
        if args.only_varied:
            return
        print()
        print(
            f"equal sizes: epsilon_total, CPU seconds min / median / max over "
            f"{args.repeats} fresh processes; timeout {args.timeout:g} s"
        )
        header = (
            f"{'n':>9} {'batches':>8} {'delta':>7} | {'this tree':>10} {'seconds':>24} | "
            f"{'baseline':>10} {'seconds':>24} | {'ratio':>6}"
        )
        print(header)
        print("-" * len(header))
        for case in CASES:
            ours = repeat(ROOT, case, args)
            theirs = repeat(baseline, case, args)
            n, rounds, delta = case
            print(
                f"{n:>9} {rounds:>8} {delta:>7g} | {cell(ours, args.timeout)} | "
                f"{cell(theirs, args.timeout)} | {ratio(theirs, ours)}"
            )
        print(f"target (issue 19): the first row within {TARGET:g} s of CPU")


if __name__ == "__main__":
    main()
