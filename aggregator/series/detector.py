"""A change detector on the per-round series, robust to the daily cycle (pure, no I/O).

**Residuals.** Each row (a round, or a step of equal length) gives per channel ``j`` a mean
``m_j`` and a variance ``v_j`` (below). The row's *phase* is its place in the cycle of
``period`` seconds (a day): ``phase = round(start / L) mod P`` with ``L`` the row length and
``P = period / L`` rows per cycle. For each phase the detector keeps a *profile*: the
inverse-variance weighted mean of the earlier rows of that phase, ``ref = sum(w m) / sum(w)``
with ``w = 1 / v`` and variance ``1 / sum(w)``. A row's residual is

    z_j = (m_j - ref_j) / sqrt(v_j + 1 / sum(w)),

then the row joins its phase's profile. The reference is the same time of the earlier
cycles, so the daily cycle cancels. Under no change (each phase's expected mean the same
every cycle) and independent rows with normal means, these ``z`` are independent ``N(0, 1)``:
at one phase they are the innovations of the sequential weighted mean, which are
uncorrelated with every earlier row's (hence with its innovations), and rows of different
phases share nothing. The first cycle has no reference: the detector learns for ``P`` rows.

**Variance of a row's mean.** The aggregator's ``mean_se`` is the mechanism's noise around the
mean of the encoded vectors of *those* reports. Between rounds the reports themselves
change (sensor encodings draw ``s`` channels and signs afresh, devices come and go), which
adds the variance of one encoded entry over the population, ``f_j - mu_j^2`` per report
(``x_j`` in ``{-1, 0, 1}``: ``E x_j^2 = f_j``), so ``v_j = mean_se_j^2 + (f_j - m_j^2)^+ / n``
with ``f_j`` the estimated frequency clipped to ``[0, 1]``. For sensor data this is the
encoding term of docs/maths.md ("Sensor means"); it counts the devices' spread too, so it is
conservative by ``(s/d)^2 Var_i(v_ij) / n`` where the same devices report every round.

**Chart.** Per channel a two-sided CUSUM (:mod:`aggregator.series.cusum`) on ``z``; a side
that crosses ``h`` raises an alarm and restarts at 0. The statistic of a row is
``max(S+, S-)`` before the restart; ``alarm`` is whether the channel raised one within the
newest ``hold`` rows (so a gauge shows it for ``hold`` rounds). Under the assumptions above
the false-alarm rate is ``CusumDesign.false_alarm_rate`` per row and channel, exactly in the
long run; docs/estimates.md ("Change detection") states it and what was measured.

Rows with no reports or no value for a channel leave that channel's chart and profile as
they are; rows of another length than the first are skipped (counted).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from numpy.typing import NDArray

from aggregator.series.cusum import CusumDesign

F64 = NDArray[np.float64]
DEFAULT_ARL = 10_000.0
"""Default in-control ARL per channel, in rows (two-sided)."""


@dataclass(frozen=True)
class Observation:
    """One row of the series, as the detector reads it: ``[start, end)`` in seconds, the
    reports ``n`` and per channel ``mean``, ``mean_se`` and ``freq`` (NaN: no value)."""

    start: float
    end: float
    n: int
    mean: F64
    mean_se: F64
    freq: F64

    @classmethod
    def from_estimates(cls, start: float, end: float, estimates: Mapping[str, Any]) -> Observation:
        """A row from an ``Estimates.to_dict()`` object (``null`` for NaN), as in ``/series``."""

        def arr(name: str) -> F64:
            values = estimates.get(name)
            if not isinstance(values, list):
                raise ValueError(f"estimates have no list {name!r}")
            out: F64 = np.array([np.nan if v is None else v for v in values], dtype=np.float64)
            return out

        n = estimates.get("n")
        if not isinstance(n, int) or isinstance(n, bool) or n < 0:
            raise ValueError(f"estimates have no report count n >= 0: {n!r}")
        mean, se, freq = arr("mean"), arr("mean_se"), arr("freq")
        if not mean.shape == se.shape == freq.shape:
            raise ValueError("estimates' mean, mean_se and freq differ in length")
        if not (math.isfinite(start) and math.isfinite(end) and end > start):
            raise ValueError(f"row [{start}, {end}) is empty or not finite")
        return cls(start=float(start), end=float(end), n=n, mean=mean, mean_se=se, freq=freq)

    def variance(self) -> F64:
        """``v_j`` of the module docs (NaN where the row has no value)."""
        if self.n == 0:
            return np.full(self.mean.shape, np.nan)
        f = np.clip(self.freq, 0.0, 1.0)
        spread = np.maximum(f - self.mean**2, 0.0) / self.n
        out: F64 = self.mean_se**2 + spread
        return out


def observations(document: Mapping[str, Any]) -> tuple[list[int], list[Observation]]:
    """The dimensions and rows of a ``/series`` JSON document (docs/estimates.md)."""
    columns = document.get("columns")
    rows = document.get("rows")
    dims = document.get("dims")
    if not isinstance(columns, list) or not isinstance(rows, list) or not isinstance(dims, list):
        raise ValueError("a series document needs 'columns', 'rows' and 'dims' lists")
    try:
        at = {name: columns.index(name) for name in ("start", "end", "estimates")}
    except ValueError:
        raise ValueError("a series document needs the columns start, end, estimates") from None
    out = []
    for row in rows:
        obs = Observation.from_estimates(
            float(row[at["start"]]), float(row[at["end"]]), row[at["estimates"]]
        )
        if obs.mean.shape != (len(dims),):
            raise ValueError(f"a row has {obs.mean.size} values for {len(dims)} dims")
        out.append(obs)
    return [int(d) for d in dims], out


@dataclass(frozen=True, kw_only=True)
class DetectorConfig:
    """The cycle (``period`` seconds, a day by default), the chart and ``hold``."""

    period: float = 86_400.0
    design: CusumDesign = field(default_factory=lambda: CusumDesign.for_arl(DEFAULT_ARL))
    hold: int = 10

    def __post_init__(self) -> None:
        if not (math.isfinite(self.period) and self.period > 0):
            raise ValueError(f"the period must be > 0 seconds, got {self.period}")
        if self.hold < 1:
            raise ValueError(f"hold must be >= 1 row, got {self.hold}")


@dataclass(frozen=True)
class RowResult:
    """What one row did, per channel: its residual ``z`` (NaN while learning or without a
    value) and the scale it was divided by (``sqrt(v + 1 / sum(w))``), the statistic
    ``max(S+, S-)`` before any restart, whether it raised an alarm (``+1`` up, ``-1`` down,
    0 none), and the alarm flag (an alarm within ``hold`` rows)."""

    start: float
    z: F64
    scale: F64
    statistic: F64
    raised: NDArray[np.int8]
    alarm: NDArray[np.bool_]


class ChangeDetector:
    """The detector of the module docs over ``dims`` channels, fed row by row in time order."""

    def __init__(self, config: DetectorConfig, dims: int) -> None:
        if dims < 1:
            raise ValueError(f"need at least one channel, got {dims}")
        self.config = config
        self.dims = dims
        self.row_seconds: float | None = None
        self.phases = 0
        self._weight: dict[int, F64] = {}
        self._weighted: dict[int, F64] = {}
        self.upper = np.zeros(dims)
        self.lower = np.zeros(dims)
        self.statistic = np.zeros(dims)
        self.rows = 0
        self.skipped = 0
        self.alarms = np.zeros(dims, dtype=np.int64)
        self._last_alarm = np.full(dims, -(10**9), dtype=np.int64)
        self._last_start = -math.inf

    def _phase(self, obs: Observation) -> int | None:
        length = obs.end - obs.start
        if self.row_seconds is None:
            phases = self.config.period / length
            if abs(phases - round(phases)) > 1e-6 * phases or round(phases) < 1:
                raise ValueError(
                    f"the period {self.config.period} s is not a whole number of {length} s rows"
                )
            self.row_seconds, self.phases = length, round(phases)
        elif abs(length - self.row_seconds) > 1e-9 * self.row_seconds:
            return None
        return round(obs.start / self.row_seconds) % self.phases

    def update(self, obs: Observation) -> RowResult:
        """Fold one row (later than the previous one) into the profiles and charts."""
        if obs.mean.shape != (self.dims,):
            raise ValueError(f"a row has {obs.mean.size} channels, the detector {self.dims}")
        if obs.start <= self._last_start:
            raise ValueError("rows must come in time order, each once")
        nan = np.full(self.dims, np.nan)
        phase = self._phase(obs)
        if phase is None:
            self.skipped += 1
            return RowResult(obs.start, nan, nan, self.statistic.copy(), *self._flags(None))
        self._last_start = obs.start
        var = obs.variance()
        ok = np.isfinite(obs.mean) & np.isfinite(var) & (var > 0)
        weight = self._weight.setdefault(phase, np.zeros(self.dims))
        weighted = self._weighted.setdefault(phase, np.zeros(self.dims))
        z, scale = nan.copy(), nan.copy()
        known = ok & (weight > 0)
        with np.errstate(divide="ignore", invalid="ignore"):
            ref = weighted / weight
            scale[known] = np.sqrt(var + 1.0 / weight)[known]
            z[known] = (obs.mean - ref)[known] / scale[known]
            weight[ok] += 1.0 / var[ok]
            weighted[ok] += obs.mean[ok] / var[ok]
        k, h = self.config.design.k, self.config.design.h
        zz = np.where(known, z, 0.0)
        upper = np.where(known, np.maximum(0.0, self.upper + zz - k), self.upper)
        lower = np.where(known, np.maximum(0.0, self.lower - zz - k), self.lower)
        self.statistic = np.maximum(upper, lower)
        raised = np.where(upper > h, 1, np.where(lower > h, -1, 0)).astype(np.int8)
        self.upper = np.where(upper > h, 0.0, upper)
        self.lower = np.where(lower > h, 0.0, lower)
        self.alarms += (upper > h).astype(np.int64) + (lower > h).astype(np.int64)
        self._last_alarm[raised != 0] = self.rows
        self.rows += 1
        return RowResult(obs.start, z, scale, self.statistic.copy(), *self._flags(raised))

    def _flags(self, raised: NDArray[np.int8] | None) -> tuple[NDArray[np.int8], NDArray[np.bool_]]:
        if raised is None:
            raised = np.zeros(self.dims, dtype=np.int8)
        alarm: NDArray[np.bool_] = self.rows - 1 - self._last_alarm < self.config.hold
        return raised, alarm


def detect(rows: Iterable[Observation], config: DetectorConfig, dims: int) -> list[RowResult]:
    """Run a fresh detector over ``rows`` (time order): one result per row."""
    detector = ChangeDetector(config, dims)
    return [detector.update(obs) for obs in rows]


def latest(results: Sequence[RowResult], dims: int) -> tuple[F64, NDArray[np.bool_]]:
    """The newest statistic and alarm flag per channel (zeros before any row)."""
    if not results:
        return np.zeros(dims), np.zeros(dims, dtype=np.bool_)
    return results[-1].statistic, results[-1].alarm
