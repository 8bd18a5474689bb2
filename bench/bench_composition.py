"""CPU seconds of ``epsilon_total``: this tree beside an older one (default ``main``).

Run: ``.venv/bin/python bench/bench_composition.py [--repeats R] [--baseline REV]
[--timeout S]``. Each measurement is a fresh process (nothing cached: the certified curve's
points are the cost), timing only the call with ``time.process_time``; ``R`` repeats give
min / median / max. The cases are the issue's: ``coco privacy --mechanism coco --epsilon 1
--s 8 --d 128 --n 1000000 --delta 1e-8 --rounds 1000`` (issue 19's target: within 10 s),
the same over 10^4 batches, and delta = 1e-6 (where the baseline finishes). The baseline
is ``git archive REV`` of ``aggregator/`` and ``edge/`` run the same way; a case it does not
finish within ``--timeout`` seconds of CPU (``RLIMIT_CPU``) is shown as such.
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

ROOT = Path(__file__).resolve().parents[1]
CASES = ((10**6, 1_000, 1e-8), (10**6, 10_000, 1e-8), (10**6, 1_000, 1e-6))
TARGET = 10.0
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


def run(tree: Path, case: tuple[int, int, float], timeout: float) -> tuple[float, float] | None:
    """(epsilon_total, CPU seconds) in a fresh process on ``tree``; None if it used
    ``timeout`` seconds of CPU (RLIMIT_CPU: a loaded machine does not count against it)."""
    env = {**os.environ, "PYTHONPATH": str(tree), "OMP_NUM_THREADS": "1"}
    args = [sys.executable, "-P", "-c", CHILD, *(str(x) for x in case)]
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
    result = json.loads(done.stdout.strip().splitlines()[-1])
    return float(result["value"]), float(result["cpu"])


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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--baseline", default="main", help="git revision to compare with")
    parser.add_argument("--timeout", type=float, default=120.0)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        baseline = Path(tmp)
        archive = subprocess.run(
            ["git", "-C", str(ROOT), "archive", args.baseline, "aggregator", "edge"],
            capture_output=True,
            check=True,
        ).stdout
        subprocess.run(["tar", "-x", "-C", str(baseline)], input=archive, check=True)
        print(
            f"coco s=8 d=128 eps0=1: epsilon_total, CPU seconds min / median / max over "
            f"{args.repeats} fresh processes; baseline {args.baseline}, timeout {args.timeout:g} s"
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
