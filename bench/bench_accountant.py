"""Wall time of the stronger-clone accountant's epsilon_central for n = 10^4 .. 10^8.

Run: ``.venv/bin/python bench/bench_accountant.py``. For each n (eps0 = 1,
delta = min(1e-8, n^-1.1)) it prints epsilon_central with the generic clone probability
1/(e^eps0 + 1) (the certified one) and with Collision's s / (s e^eps0 + t - s) for
s = 8, t = 40 (ERRATA item 4; not certified, see the accountant's module docstring),
each with the median wall time of 3 runs.
"""

from __future__ import annotations

import math
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout

from aggregator.accountant import epsilon_central, generic_clone_probability

EPSILON0 = 1.0
SIZES = (10**4, 10**5, 10**6, 10**7, 10**8)
REPEATS = 3


def collision_clone_probability(*, epsilon0: float, s: int, t: int) -> float:
    """ERRATA item 4: beta / (e^eps0 - 1) = s / (s e^eps0 + t - s)."""
    return s / (s * math.exp(epsilon0) + (t - s))


def timed(*, n: int, delta: float, alpha: float) -> tuple[float, float]:
    """(epsilon_central, median wall seconds over REPEATS runs)."""
    times: list[float] = []
    value = math.nan
    for _ in range(REPEATS):
        start = time.perf_counter()
        value = epsilon_central(n=n, delta=delta, epsilon0=EPSILON0, clone_probability=alpha)
        times.append(time.perf_counter() - start)
    return value, statistics.median(times)


def main() -> None:
    alphas = {
        "generic": generic_clone_probability(EPSILON0),
        "collision s=8 t=40": collision_clone_probability(epsilon0=EPSILON0, s=8, t=40),
    }
    print(f"epsilon0 = {EPSILON0}, delta = min(1e-8, n^-1.1), median of {REPEATS} runs")
    header = f"{'n':>11} {'delta':>9} {'alpha':>18} {'clone p':>8} {'eps_c':>12} {'seconds':>8}"
    print(header)
    print("-" * len(header))
    for n in SIZES:
        delta = min(1e-8, n**-1.1)
        for name, alpha in alphas.items():
            eps_c, seconds = timed(n=n, delta=delta, alpha=alpha)
            print(f"{n:>11,} {delta:>9.2e} {name:>18} {alpha:>8.5f} {eps_c:>12.9f} {seconds:>8.3f}")


if __name__ == "__main__":
    main()
