"""What memoisation would save on the project's sensor model (docs/privacy-model.md,
"Memoisation: evaluated, not built").

Run from the repository root as ``.venv/bin/python docs/gen_memoisation.py``; it prints the
table that section quotes. Deterministic (seeded).

Memoisation in the style of Ding, Kulkarni and Yekhanin (2017), applied to this project's
encoder: each device fixes, once, the ``s`` channels it reports and a threshold
``alpha_j ~ U[-1, 1]`` per channel (alpha-point rounding: the sign of channel ``j`` is +1
when the normalised reading ``v_j > alpha_j``, which is +1 with probability ``(1 + v_j)/2``
over the devices, as the stochastic encoder's is); it randomises a report once per distinct
encoded vector and repeats it while the vector stays the same. The local budget is then
spent once per *change* of the encoded vector instead of once per round. This counts the
changes.
"""

from __future__ import annotations

import numpy as np

from sim.models.sensors import SensorFleet

DEVICES = 2000
DAYS = 30
S = 2


def changes_per_day(hours_per_round: float, *, seed: int = 1) -> tuple[float, float, float]:
    """Mean, median and 99th percentile over devices of the encoded vector's changes per day
    (rounds of ``hours_per_round`` hours; the drift is the model's per hour)."""
    fleet = SensorFleet(n_devices=DEVICES, seed=seed, hours_per_round=1.0)
    rng = np.random.default_rng(seed + 1000)
    lo, hi = (np.array(r) for r in fleet.ranges)
    d = lo.size
    chosen = np.argsort(rng.random((DEVICES, d)), axis=1)[:, :S]
    alpha = rng.uniform(-1, 1, size=(DEVICES, S))
    rows = np.arange(DEVICES)[:, None]
    rounds = round(DAYS * 24 / hours_per_round)
    previous = None
    changes = np.zeros(DEVICES)
    for r in range(rounds):
        hour = r * hours_per_round
        x = fleet.readings(r, hour=hour)  # drift per model hour: hour / 1.0
        v = 2 * (x - lo) / (hi - lo) - 1
        signs = v[rows, chosen] > alpha
        if previous is not None:
            changes += (signs != previous).any(axis=1)
        previous = signs
    per_day = changes / DAYS
    return float(per_day.mean()), float(np.median(per_day)), float(np.quantile(per_day, 0.99))


def main() -> None:
    print(
        "| rounds | rounds per day | changes per device-day: mean | median | 99th pct "
        "| reports randomised |"
    )
    print("| --- | --- | --- | --- | --- | --- |")
    for label, hours in (("1 h", 1.0), ("10 min", 1 / 6), ("1 min", 1 / 60)):
        per_round_day = 24 / hours
        mean, median, p99 = changes_per_day(hours)
        print(
            f"| {label} | {per_round_day:.0f} | {mean:.1f} | {median:.1f} | {p99:.1f} | "
            f"{100 * mean / per_round_day:.2f}% |"
        )


if __name__ == "__main__":
    main()
