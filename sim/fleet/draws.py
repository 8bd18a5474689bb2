"""What every device of a simulated fleet reports in a round: its vector of the model, then,
if it takes part (the announced participation, its period's budget), its randomised report.

A function of ``(seed, device, round)`` only (:class:`sim.fleet.models.DeviceStreams`):
any round, in any order, in any process, gives the same vectors and reports again, which is
what lets a test draw a run's reports a second time. Pure: no I/O, no clock.
"""

from __future__ import annotations

from collections.abc import Iterator

from edge import LocalMechanism
from edge.participation import participates
from sim.fleet.caps import PeriodCaps
from sim.fleet.config import FleetConfig
from sim.fleet.models import DeviceStreams, FleetModel, Sparse, device_bits

RoundReport = tuple[list[int], list[int], int, int]
"""``(keys, signs, seed, z)`` of one device's report in a round."""


def present(reports: list[RoundReport | None]) -> Iterator[tuple[int, RoundReport]]:
    """``(device, report)`` of the devices that report in the round."""
    return ((i, report) for i, report in enumerate(reports) if report is not None)


class FleetDraws:
    """The vectors and reports of a fleet's devices, round by round (module docstring)."""

    def __init__(self, config: FleetConfig) -> None:
        self.config = config
        self.model = FleetModel(
            name=config.model,
            spec=config.spec,
            n_devices=config.devices,
            seed=config.seed,
            round_seconds=config.round_seconds,
            day_seconds=config.day_seconds,
        )
        self._mechanism = LocalMechanism.from_spec(config.spec)
        self._streams = DeviceStreams(config.seed, config.devices)
        self.caps = (
            None
            if config.period is None
            else PeriodCaps(
                config.period,
                epsilon=config.spec.epsilon,
                round_seconds=config.round_seconds,
                q=config.participation,
                seed=config.seed,
                n_devices=config.devices,
            )
        )

    def round(self, round_: int) -> tuple[list[Sparse], list[RoundReport | None]]:
        """Every device's vector in ``round_`` and its report (``None``: its period's budget
        is spent, or it was not sampled)."""
        allowed = None if self.caps is None else self.caps.allowed(round_)
        streams = self._streams
        streams.set_round(round_)
        vectors = self.model.vectors(round_, streams)
        mech = self._mechanism
        q = self.config.participation
        out: list[RoundReport | None] = []
        for i, (keys, signs) in enumerate(vectors):
            bits = device_bits(streams.randomiser(i))
            if allowed is not None and not allowed[i]:  # its period's budget is spent
                out.append(None)
                continue
            if q < 1 and not participates(q, bits):  # q = 1 draws nothing: the old streams
                out.append(None)
                continue
            seed, z = mech.randomise_keys(keys, signs, getrandbits=bits)
            out.append((keys, signs, seed, z))
        return vectors, out
