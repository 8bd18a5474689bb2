"""SIMULATION-ONLY ground truth of a fleet run: what the aggregator's estimates estimate.

The aggregator estimates, per dimension ``j``, the mean of ``x_j`` over the reports it
applied and the share of them with ``x_j != 0`` (``/estimates``: ``mean``, ``freq``). The
fleet knows every vector it randomised, so it can compute both exactly over the reports it
*published* (acknowledged by the broker at QoS 1, written at QoS 0), per round (keyed by the
wall-clock round number the reports carried) and overall.
No real deployment has these numbers; they exist to measure the error of the private
estimates.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from edge.spec import MechanismSpec

__all__ = ["SIMULATION_ONLY_NOTE", "GroundTruth"]

SIMULATION_ONLY_NOTE = (
    "SIMULATION ONLY: exact per-dimension mean of x_j and share of reports with x_j != 0 over "
    "the ternary vectors of every report the simulated fleet published (same coordinates as "
    "the aggregator's /estimates mean and freq). No real deployment knows these values."
)


@dataclass
class _Sums:
    total: list[int]
    present: list[int]
    n: int = 0

    def stats(self) -> dict[str, Any]:
        n = self.n
        return {
            "n": n,
            "mean": [t / n if n else None for t in self.total],
            "freq": [c / n if n else None for c in self.present],
        }


@dataclass
class GroundTruth:
    """Integer sums of the published vectors, per round and overall (exact)."""

    d: int
    rounds: dict[int, _Sums] = field(default_factory=dict)
    overall: _Sums = field(init=False)

    def __post_init__(self) -> None:
        self.overall = _Sums([0] * self.d, [0] * self.d)

    def add(self, round_: int, keys: list[int], signs: list[int]) -> None:
        """One published report's vector."""
        sums = self.rounds.get(round_)
        if sums is None:
            sums = self.rounds[round_] = _Sums([0] * self.d, [0] * self.d)
        for target in (sums, self.overall):
            total, present = target.total, target.present
            for k, sign in zip(keys, signs, strict=True):
                total[k] += sign
                present[k] += 1
            target.n += 1

    @property
    def n(self) -> int:
        return self.overall.n

    def mean(self, j: int) -> float:
        """Running mean of ``x_j`` over every report published so far (NaN before any)."""
        n = self.overall.n
        return self.overall.total[j] / n if n else float("nan")

    def freq(self, j: int) -> float:
        """Running share of published reports with ``x_j != 0`` (NaN before any)."""
        n = self.overall.n
        return self.overall.present[j] / n if n else float("nan")

    def to_dict(
        self, *, spec: MechanismSpec, seed: int, model: str, extra: dict[str, Any] | None = None
    ) -> dict[str, Any]:
        """The ``--ground-truth`` document (``simulation_only`` says what it is)."""
        return {
            "simulation_only": True,
            "note": SIMULATION_ONLY_NOTE,
            "spec": spec.to_dict(),
            "seed": seed,
            "model": model,
            **(extra or {}),
            "overall": self.overall.stats(),
            "rounds": [{"round": r, **sums.stats()} for r, sums in sorted(self.rounds.items())],
        }
