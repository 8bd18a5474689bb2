"""The announced period policy, kept by every simulated device (``period_seconds`` and
``budget_per_period`` of the announcement: docs/protocol.md 10.5 and 12.1).

A real device charges its ledger for each report, in the period holding the start of the
report's round, and sits rounds out once its period cap is spent (its publisher waits for
the next period; it draws no participation word meanwhile). A device of the policy
therefore reports at most ``cap = floor(budget_per_period / epsilon)`` times per period.
The simulated devices do the same without a ledger file: device ``i``'s reports in period
``k`` are its first ``cap`` rounds of the period in which it is sampled (participation
``q``: the first word of its randomiser lane in the round, :mod:`edge.participation`), which
is a function of ``(seed, i, round)`` alone. :class:`PeriodCaps` recomputes the count of
each device's reports in the period from the period's first round (on its own copy of the
streams) whenever the fleet starts in, or moves to, a period: a fleet restarted within a
period does not hand its devices a fresh budget.
"""

from __future__ import annotations

from fractions import Fraction

import numpy as np
from numpy.typing import NDArray

from edge.announce import AnnouncedPeriod
from edge.participation import WORD, threshold
from sim.fleet.models import DeviceStreams

__all__ = ["PeriodCaps"]


class PeriodCaps:
    """Which devices may still report in a round under the announced ``policy``, for a
    fleet of ``n_devices`` with ``seed``, reports of cost ``epsilon``, participation ``q``
    and rounds of ``round_seconds`` (a divisor of the period, as the announcement says)."""

    def __init__(
        self,
        policy: AnnouncedPeriod,
        *,
        epsilon: float,
        round_seconds: int,
        q: float,
        seed: int,
        n_devices: int,
    ) -> None:
        if policy.seconds % round_seconds:
            raise ValueError(
                f"the period ({policy.seconds} s) is not a whole number of rounds "
                f"({round_seconds} s)"
            )
        self.cap = int(Fraction(policy.budget) // Fraction(epsilon))
        """Reports per period: ``floor(budget_per_period / epsilon)``, exactly."""
        self.rounds_per_period = policy.seconds // round_seconds
        self._limit = threshold(q)
        self._streams = DeviceStreams(seed, n_devices)
        self._n = n_devices
        self._period: int | None = None
        self._next = 0  # the round the counts are complete up to (excluded)
        self._counts = np.zeros(n_devices, dtype=np.int64)

    def period_of(self, round_: int) -> int:
        return round_ // self.rounds_per_period

    def allowed(self, round_: int) -> NDArray[np.bool_]:
        """Per device: whether its period of ``round_`` has budget left for a report."""
        period = self.period_of(round_)
        if period != self._period or round_ < self._next:
            self._period = period
            self._next = period * self.rounds_per_period
            self._counts[:] = 0
        while self._next < round_:
            self._counts += self._decisions(self._next)
            self._next += 1
        return self._counts < self.cap

    def reports_in_period(self, round_: int) -> NDArray[np.int64]:
        """Per device: its reports in ``round_``'s period before ``round_`` (tests)."""
        self.allowed(round_)
        return self._counts.copy()

    def _decisions(self, round_: int) -> NDArray[np.bool_]:
        """Who reported in ``round_``: budget left, then sampled (no word drawn at q = 1)."""
        eligible = self._counts < self.cap
        if self._limit >= WORD:
            return eligible
        streams = self._streams
        streams.set_round(round_)
        words = np.fromiter(
            (int(streams.randomiser(i).random_raw()) >> 32 for i in range(self._n)),
            dtype=np.uint64,
            count=self._n,
        )
        sampled: NDArray[np.bool_] = words < self._limit
        return eligible & sampled
