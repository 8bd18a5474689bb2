"""Wall time of the accountant's central epsilon, certified blanket bound beside the generic.

Run: ``.venv/bin/python bench/bench_accountant.py [--repeats R] [--max-n N]``. For each n in
10^4 .. 10^8 (Collision, s = 8, d = 64, eps0 = 1, its MSE-optimal t; delta = min(1e-8,
n^-1.1)) it prints the certified mechanism-specific ``epsilon_central`` (the privacy-blanket
bound, :func:`aggregator.accountant.blanket_epsilon`) and the generic stronger-clone value
(``epsilon_central_generic``), each with min / median / max wall seconds over R runs.
Issue 11's targets: the blanket bound at n = 10^6 in at most 0.5 s, at n = 10^8 in at most 5 s.
Then ``epsilon_total`` (:func:`aggregator.accountant.epsilon_total`) for 1,000 rounds of
n = 10^6 at delta = 1e-6, target at most 10 s.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout

from aggregator.accountant import (
    blanket_epsilon,
    blanket_pair_for_spec,
    epsilon_central,
    epsilon_total,
    generic_clone_probability,
)
from edge.spec import MechanismSpec

SIZES = (10**4, 10**5, 10**6, 10**7, 10**8)
TARGETS = {10**6: 0.5, 10**8: 5.0}
ROUNDS, ROUNDS_N, ROUNDS_TARGET = 1_000, 10**6, 10.0


def timed(compute: Callable[[], float], repeats: int) -> tuple[float, list[float]]:
    """(value, wall seconds of each run)."""
    times: list[float] = []
    value = float("nan")
    for _ in range(repeats):
        start = time.perf_counter()
        value = compute()
        times.append(time.perf_counter() - start)
    return value, times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--max-n", type=float, default=1e8)
    args = parser.parse_args()
    spec = MechanismSpec(mechanism="collision", d=64, s=8, epsilon=1.0)
    eps0 = spec.epsilon_effective
    alpha = generic_clone_probability(eps0)
    print(
        f"collision s={spec.s} t={spec.t} eps0={eps0:.6f}, delta = min(1e-8, n^-1.1), "
        f"{args.repeats} runs: min / median / max seconds"
    )
    header = (
        f"{'n':>11} {'delta':>9} {'blanket eps_c':>14} {'seconds':>22} "
        f"{'generic eps_c':>14} {'seconds':>22} {'saving':>7} {'target':>7}"
    )
    print(header)
    print("-" * len(header))
    for n in SIZES:
        if n > args.max_n:
            break
        delta = min(1e-8, n**-1.1)
        pair = blanket_pair_for_spec(spec, n=n)
        blanket, tb = timed(
            lambda pair=pair, delta=delta: blanket_epsilon(pair, delta=delta),  # type: ignore[misc]
            args.repeats,
        )
        generic, tg = timed(
            lambda n=n, delta=delta: epsilon_central(  # type: ignore[misc]
                n=n, delta=delta, epsilon0=eps0, clone_probability=alpha
            ),
            args.repeats,
        )

        def span(ts: list[float]) -> str:
            return f"{min(ts):.3f}/{statistics.median(ts):.3f}/{max(ts):.3f}"

        target = TARGETS.get(n)
        verdict = "" if target is None else ("ok" if statistics.median(tb) <= target else "SLOW")
        print(
            f"{n:>11,} {delta:>9.2e} {blanket:>14.8g} {span(tb):>22} {generic:>14.8g} "
            f"{span(tg):>22} {1 - blanket / generic:>7.1%} {verdict:>7}"
        )
    pair = blanket_pair_for_spec(spec, n=ROUNDS_N)
    total, tt = timed(
        lambda: epsilon_total(pair, rounds=ROUNDS, delta=1e-6), max(1, args.repeats // 2)
    )
    verdict = "ok" if statistics.median(tt) <= ROUNDS_TARGET else "SLOW"
    print(
        f"\nepsilon_total, {ROUNDS:,} rounds of n = {ROUNDS_N:,}, delta = 1e-6: {total:.6g} "
        f"in {min(tt):.3f}/{statistics.median(tt):.3f}/{max(tt):.3f} s "
        f"(target {ROUNDS_TARGET:g} s: {verdict})"
    )


if __name__ == "__main__":
    main()
