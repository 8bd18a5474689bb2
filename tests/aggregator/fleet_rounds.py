"""Rounds of a simulated sensor fleet through the real mechanism, for the tests of estimates
over time (seeded; simulation only).

Round ``r`` of a fleet with ``rounds_per_day`` rounds per day reads the sensor model
(sim/models/sensors.py) at the hour ``(r mod rounds_per_day) * 24 / rounds_per_day``: the
daily cycle of a compressed day, the drift restarting daily as on the wall clock (``coco
fleet``), so the expected fleet mean repeats every day. Every device reports once per round:
readings -> :class:`~edge.encoders.SensorEncoder` -> the mechanism -> one
:class:`~aggregator.estimation.estimators.AggregateState` per round.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from aggregator.estimation.estimators import AggregateState
from aggregator.series.detector import Observation
from edge import LocalMechanism, MechanismSpec
from sim.models.sensors import SensorFleet

F64 = NDArray[np.float64]
Change = Callable[[int, F64], F64]
"""``(round, readings) -> readings``: a change of the fleet from some round on."""


@dataclass
class FleetRounds:
    spec: MechanismSpec
    fleet: SensorFleet
    rounds_per_day: int
    round_seconds: float = 60.0

    def __post_init__(self) -> None:
        self.encoder = self.fleet.encoder(self.spec.s)
        self.mechanism = LocalMechanism.from_spec(self.spec)
        self.lo, self.hi = (np.array(r) for r in self.fleet.ranges)

    @property
    def day_seconds(self) -> float:
        return self.rounds_per_day * self.round_seconds

    def readings(self, r: int, change: Change | None = None) -> F64:
        hour = (r % self.rounds_per_day) * 24.0 / self.rounds_per_day
        x = self.fleet.readings(r, hour=hour)
        return x if change is None else np.clip(change(r, x), self.lo, self.hi)

    def round(
        self, r: int, rng: np.random.Generator, change: Change | None = None
    ) -> tuple[AggregateState, F64]:
        """Round ``r``'s state and its truth (the fleet mean of its readings, physical)."""
        x = self.readings(r, change)
        keys, signs = self.encoder.encode_batch(x, rng)
        seeds, z = self.mechanism.randomise_sparse(keys, signs, rng)
        state = AggregateState(self.spec)
        state.add(seeds, z)
        truth: F64 = x.mean(axis=0)
        return state, truth

    def observation(self, r: int, state: AggregateState) -> Observation:
        start = r * self.round_seconds
        return Observation.from_estimates(
            start, start + self.round_seconds, state.estimate().to_dict()
        )

    def decoded(self, state: AggregateState) -> tuple[F64, F64]:
        """Fleet means in physical units and their standard errors (``decode_mean``)."""
        est = state.estimate()
        return self.encoder.decode_mean(est.mean, est.mean_se, n=state.n)
