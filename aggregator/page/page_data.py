"""What the live page needs beyond the estimates: the channels in the user's units and the
privacy level over time. Pure: no I/O, no clock (the shell passes the time in).

Channels
--------
Where the dimensions are sensor channels encoded with
:class:`~edge.encoders.SensorEncoder` (min-max normalised to ``[lo, hi]``, ``s`` channels
kept per report; the simulated sensor model of :mod:`sim.models.sensors` is one), a
:class:`Channel` per dimension names it and gives its unit and range, and
:func:`channel_estimates` turns the estimated means of the ternary vectors into each
channel's fleet mean in physical units, with its interval (the encoder's
:meth:`~edge.encoders.SensorEncoder.decode_mean`: the mechanism's standard error and the
encoding's variance). ``/estimates`` carries them as ``channels``: at most
:data:`MAX_CHANNELS` entries of a bounded size (a name of at most :data:`MAX_NAME` and a
unit of at most :data:`MAX_UNIT` printable ASCII characters, four numbers). They describe
the deployment's channels, never a device.

Privacy over time
-----------------
:class:`PrivacyHistory` keeps one point per privacy level the service showed (a new
``batches_accounted``): its time, ``batches_accounted``, the certified epsilon_central of
the smallest batch (the guarantee every report has) and of the latest, and
``epsilon_total`` (the ledger's composition over rounds). At most :data:`MAX_POINTS`
points: when full, every other point between the first and the newest is dropped, so the
history always spans the whole run at a coarser step. ``/estimates`` carries it as
``privacy_history`` (about 60 bytes a point); it starts with the service (it is not in the
checkpoint). A point's time is when the data its level covers arrived (the accountant's
computation can trail it), and a level with an epsilon not known is not a point.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from statistics import NormalDist
from typing import Any

import numpy as np

from edge.encoders import SensorEncoder

__all__ = [
    "HISTORY_COLUMNS",
    "MAX_CHANNELS",
    "MAX_NAME",
    "MAX_POINTS",
    "MAX_UNIT",
    "Channel",
    "PrivacyHistory",
    "channel_estimates",
    "channels_from_json",
    "check_channels",
]

MAX_CHANNELS = 1024
"""Most channels ``/estimates`` describes (the aggregator's ``MAX_METRICS_DIMS``)."""
MAX_NAME = 32
MAX_UNIT = 16
MAX_POINTS = 256
"""Most points of :class:`PrivacyHistory` (about 15 kB of ``/estimates``)."""
HISTORY_COLUMNS = ("time", "batches_accounted", "smallest", "latest", "epsilon_total")
"""The columns of a ``privacy_history`` point: Unix time in seconds, then the level."""


def _label(kind: str, text: str, limit: int) -> str:
    if not isinstance(text, str) or not 0 < len(text) <= limit:
        raise ValueError(f"a channel's {kind} must have 1 to {limit} characters, got {text!r}")
    if not all(" " <= c <= "~" for c in text):
        raise ValueError(f"a channel's {kind} must be printable ASCII, got {text!r}")
    return text


@dataclass(frozen=True)
class Channel:
    """One dimension as a sensor channel: its name, unit and physical range ``[lo, hi]``."""

    name: str
    unit: str
    lo: float
    hi: float

    def __post_init__(self) -> None:
        _label("name", self.name, MAX_NAME)
        _label("unit", self.unit, MAX_UNIT)
        if not (math.isfinite(self.lo) and math.isfinite(self.hi) and self.lo < self.hi):
            raise ValueError(f"channel {self.name}: range [{self.lo}, {self.hi}] is empty")

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "unit": self.unit, "lo": self.lo, "hi": self.hi}


def check_channels(channels: Sequence[Channel], *, d: int, s: int) -> tuple[Channel, ...]:
    """``channels`` as a tuple, if they describe the ``d`` dimensions of a spec with ``s``
    (one channel per dimension, distinct names, at most :data:`MAX_CHANNELS`)."""
    out = tuple(channels)
    if len(out) != d:
        raise ValueError(f"need one channel per dimension (d={d}), got {len(out)}")
    if d > MAX_CHANNELS:
        raise ValueError(f"at most {MAX_CHANNELS} channels, got {d}")
    if len({ch.name for ch in out}) != d:
        raise ValueError("channel names must be distinct")
    if not 1 <= s <= d:
        raise ValueError(f"s must be in [1, d={d}], got {s}")
    return out


def channels_from_json(data: object) -> tuple[Channel, ...]:
    """Channels from JSON (``coco aggregator run --channels FILE``): a list of objects with
    exactly ``name``, ``unit``, ``lo`` and ``hi``; :class:`ValueError` naming the first
    problem."""
    if not isinstance(data, list) or not data:
        raise ValueError("channels must be a non-empty JSON list of {name, unit, lo, hi}")
    if len(data) > MAX_CHANNELS:
        raise ValueError(f"at most {MAX_CHANNELS} channels, got {len(data)}")
    out = []
    for j, item in enumerate(data):
        if not isinstance(item, dict) or set(item) != {"name", "unit", "lo", "hi"}:
            raise ValueError(f"channel {j}: need exactly the keys name, unit, lo, hi")
        lo, hi = item["lo"], item["hi"]
        if not all(isinstance(v, int | float) and not isinstance(v, bool) for v in (lo, hi)):
            raise ValueError(f"channel {j}: lo and hi must be numbers")
        out.append(Channel(item["name"], item["unit"], float(lo), float(hi)))
    return tuple(out)


def _number(value: float) -> float | None:
    return float(value) if math.isfinite(value) else None


def channel_estimates(
    channels: Sequence[Channel],
    *,
    s: int,
    n: int,
    mean: Sequence[float | None],
    mean_se: Sequence[float | None],
    confidence: float,
) -> list[dict[str, Any]]:
    """Each channel with its fleet mean in physical units (``value``) and the interval
    ``value_lo``/``value_hi`` at ``confidence``; ``None`` where there is no estimate yet
    (``n = 0``, or the dimension's estimate is missing)."""
    encoder = SensorEncoder(
        lo=tuple(ch.lo for ch in channels), hi=tuple(ch.hi for ch in channels), s=s
    )
    m = np.array([math.nan if v is None else v for v in mean], dtype=np.float64)
    e = np.array([math.nan if v is None else v for v in mean_se], dtype=np.float64)
    value, se = encoder.decode_mean(m, e, n=n)
    z = NormalDist().inv_cdf(0.5 + confidence / 2)
    out = []
    for j, ch in enumerate(channels):
        v, h = float(value[j]), z * float(se[j])
        ok = math.isfinite(v) and math.isfinite(h)
        out.append(
            {
                **ch.to_json(),
                "value": _number(v),
                "value_lo": v - h if ok else None,
                "value_hi": v + h if ok else None,
            }
        )
    return out


@dataclass
class PrivacyHistory:
    """The privacy level over time (module docs); :meth:`to_json` for ``/estimates``.

    A point's time is when the data it covers arrived, not when its level was computed
    (the accountant can trail by seconds): :meth:`ledger_changed` notes when the privacy
    ledger reached each generation, and a level of generation ``g`` takes the time of the
    newest change at or before ``g`` (the time it is recorded when none is known: a ledger
    restored from a checkpoint)."""

    limit: int = MAX_POINTS
    points: list[tuple[float, int, float, float, float]] = field(default_factory=list)
    changes: list[tuple[int, float]] = field(default_factory=list)
    """``(ledger generation, time reached)`` not yet covered by a recorded level."""

    def __post_init__(self) -> None:
        if self.limit < 3:
            raise ValueError(f"a history needs room for 3 points, got {self.limit}")

    def ledger_changed(self, generation: int, now: float) -> None:
        """The ledger reached ``generation`` at ``now`` (a batch or a release recorded)."""
        if self.changes and self.changes[-1][0] >= generation:
            return
        self.changes.append((generation, now))
        if len(self.changes) > self.limit:  # an accountant far behind: keep the newest
            del self.changes[0]

    def _time_of(self, generation: int, now: float) -> float:
        covered = [c for c in self.changes if c[0] <= generation]
        if not covered:
            return now
        self.changes = self.changes[len(covered) - 1 :]  # older ones are covered for good
        return covered[-1][1]

    def record(
        self,
        now: float,
        *,
        generation: int = 0,
        batches: int,
        smallest: float | None,
        latest: float | None,
        total: float | None,
    ) -> bool:
        """Add the level of ledger ``generation`` shown at ``now`` if it is a new one
        (another ``batches_accounted`` or other numbers); whether it was added. No point
        before the first batch, nor for a level with an epsilon not known (its batch sizes
        changed since it was computed: the next level has them)."""
        if batches <= 0 or smallest is None or latest is None or total is None:
            return False
        point = (self._time_of(generation, now), batches, smallest, latest, total)
        if self.points and self.points[-1][1:] == point[1:]:
            return False
        if self.points and point[0] < self.points[-1][0]:  # never back in time
            point = (self.points[-1][0], *point[1:])
        self.points.append(point)
        if len(self.points) > self.limit:  # thin: the first, every other one, the newest
            self.points = [*self.points[:-1:2], self.points[-1]]
        return True

    def to_json(self) -> dict[str, Any]:
        return {"columns": list(HISTORY_COLUMNS), "points": [list(p) for p in self.points]}
