"""A multi-channel environmental sensor model with known ground truth (simulation only).

Each of ``n_devices`` devices carries ``channels`` channels, any number from 1: the first of
:data:`CHANNELS` (temperature, humidity, pressure, CO2, light, noise, PM2.5, VOC), then of
:data:`MORE_CHANNELS` (PM10, NO2, O3, CO, UV index, wind speed, soil moisture, battery
voltage), then, past those 16, the same 16 again as further sensor boards of the device
(``temperature_2``, ..., ``battery_2``, ``temperature_3``, ...: the same unit, range and
model, with readings of their own). :func:`channel_table` gives the channels of a count;
six is the default (the demo's). The reading of device ``i``, channel ``j`` at round ``r``
(the hour ``h = r * hours_per_round``, or the hour a caller gives: :mod:`sim.models.day`) is::

    x_ij(r) = clip(base_j + A_j cos(2 pi (h - peak_j) / 24) + offset_ij + drift_ij r
                   + noise_ij(r), lo_j, hi_j)

with a per-device calibration offset ``offset_ij ~ N(0, offset_sd_j^2)``, a per-device drift
per round ``drift_ij ~ N(0, drift_sd_j^2)`` and white noise ``noise_ij(r) ~ N(0,
noise_sd_j^2)``. A ``faulty_fraction`` of the devices has one channel stuck at an edge of
its range (``lo`` or ``hi``), as failed sensors often are, and an
``out_of_range_fraction`` (default 0) has one channel that reads outside its physical
range (a glitching sensor, above ``hi`` or below ``lo`` by up to one range width); an
encoder with ``clip=True`` clips such readings, as a device does.

**Ground truth is simulation-only**: :meth:`SensorFleet.ground_truth_mean` is the exact
fleet average of the readings, which no real deployment knows; the demo uses it only to
show the error of the private estimates.

Randomness: ``np.random.SeedSequence(seed).spawn(2)`` gives one stream for the devices'
static parameters and one parent for the rounds; round ``r`` uses the child with spawn key
``(r,)`` of the latter, so readings of a round do not depend on which rounds were read
before.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

import numpy as np
from numpy.typing import NDArray

from edge.encoders import SensorEncoder

__all__ = ["CHANNELS", "MORE_CHANNELS", "Channel", "SensorFleet", "channel_table"]

F64 = NDArray[np.float64]


@dataclass(frozen=True, kw_only=True)
class Channel:
    """One sensor channel: physical range ``[lo, hi]`` and the parameters of its model."""

    name: str
    unit: str
    lo: float
    hi: float
    base: float
    daily_amplitude: float
    peak_hour: float
    offset_sd: float
    drift_sd: float
    noise_sd: float

    def __post_init__(self) -> None:
        if not (math.isfinite(self.lo) and math.isfinite(self.hi) and self.lo < self.hi):
            raise ValueError(f"channel {self.name}: range [{self.lo}, {self.hi}] is empty")
        for name in ("daily_amplitude", "offset_sd", "drift_sd", "noise_sd"):
            value = getattr(self, name)
            if not value >= 0:
                raise ValueError(f"channel {self.name}: {name} must be >= 0, got {value}")


CHANNELS: tuple[Channel, ...] = (
    Channel(name="temperature", unit="degC", lo=-20.0, hi=50.0, base=21.0,
            daily_amplitude=4.0, peak_hour=15.0, offset_sd=1.5, drift_sd=0.05, noise_sd=0.3),
    Channel(name="humidity", unit="%RH", lo=0.0, hi=100.0, base=45.0,
            daily_amplitude=8.0, peak_hour=5.0, offset_sd=5.0, drift_sd=0.1, noise_sd=1.0),
    Channel(name="pressure", unit="hPa", lo=950.0, hi=1050.0, base=1013.0,
            daily_amplitude=1.0, peak_hour=10.0, offset_sd=3.0, drift_sd=0.02, noise_sd=0.2),
    Channel(name="co2", unit="ppm", lo=350.0, hi=5000.0, base=800.0,
            daily_amplitude=300.0, peak_hour=16.0, offset_sd=150.0, drift_sd=2.0, noise_sd=30.0),
    Channel(name="light", unit="lux", lo=0.0, hi=2000.0, base=400.0,
            daily_amplitude=350.0, peak_hour=13.0, offset_sd=120.0, drift_sd=0.0, noise_sd=40.0),
    Channel(name="noise", unit="dBA", lo=30.0, hi=110.0, base=55.0,
            daily_amplitude=8.0, peak_hour=14.0, offset_sd=4.0, drift_sd=0.02, noise_sd=2.0),
    Channel(name="pm25", unit="ug/m3", lo=0.0, hi=300.0, base=12.0,
            daily_amplitude=4.0, peak_hour=8.0, offset_sd=4.0, drift_sd=0.05, noise_sd=2.0),
    Channel(name="voc", unit="ppb", lo=0.0, hi=2000.0, base=250.0,
            daily_amplitude=80.0, peak_hour=17.0, offset_sd=60.0, drift_sd=1.0, noise_sd=20.0),
)  # fmt: skip
"""The first eight channels of the catalogue; a fleet of up to eight channels uses the first
``channels`` of them."""

MORE_CHANNELS: tuple[Channel, ...] = (
    Channel(name="pm10", unit="ug/m3", lo=0.0, hi=600.0, base=20.0,
            daily_amplitude=6.0, peak_hour=8.0, offset_sd=6.0, drift_sd=0.05, noise_sd=3.0),
    Channel(name="no2", unit="ppb", lo=0.0, hi=500.0, base=15.0,
            daily_amplitude=8.0, peak_hour=8.0, offset_sd=5.0, drift_sd=0.05, noise_sd=2.0),
    Channel(name="o3", unit="ppb", lo=0.0, hi=300.0, base=30.0,
            daily_amplitude=15.0, peak_hour=15.0, offset_sd=5.0, drift_sd=0.05, noise_sd=3.0),
    Channel(name="co", unit="ppm", lo=0.0, hi=50.0, base=0.4,
            daily_amplitude=0.2, peak_hour=8.0, offset_sd=0.1, drift_sd=0.002, noise_sd=0.05),
    Channel(name="uv_index", unit="UVI", lo=0.0, hi=15.0, base=2.0,
            daily_amplitude=2.5, peak_hour=13.0, offset_sd=0.2, drift_sd=0.0, noise_sd=0.2),
    Channel(name="wind_speed", unit="m/s", lo=0.0, hi=60.0, base=3.5,
            daily_amplitude=1.5, peak_hour=14.0, offset_sd=1.0, drift_sd=0.01, noise_sd=0.8),
    Channel(name="soil_moisture", unit="%VWC", lo=0.0, hi=60.0, base=25.0,
            daily_amplitude=1.0, peak_hour=6.0, offset_sd=5.0, drift_sd=0.05, noise_sd=0.5),
    Channel(name="battery", unit="V", lo=3.0, hi=4.2, base=3.9,
            daily_amplitude=0.05, peak_hour=14.0, offset_sd=0.05, drift_sd=0.002,
            noise_sd=0.01),
)  # fmt: skip
"""Channels 9 to 16 of the catalogue (air quality, weather, soil, the device's battery)."""


def channel_table(count: int) -> tuple[Channel, ...]:
    """The channels of a device with ``count`` channels (module docs): the catalogue's
    first ``count``, the catalogue repeated as numbered boards past its 16 entries."""
    if isinstance(count, bool) or count < 1:
        raise ValueError(f"channels must be >= 1, got {count}")
    catalogue = CHANNELS + MORE_CHANNELS
    board, rest = divmod(count, len(catalogue))
    table = list(catalogue) * board + list(catalogue[:rest])
    return tuple(
        ch if j < len(catalogue) else replace(ch, name=f"{ch.name}_{j // len(catalogue) + 1}")
        for j, ch in enumerate(table)
    )


@dataclass(frozen=True, kw_only=True)
class SensorFleet:
    """``n_devices`` devices with ``channels`` (>= 1, :func:`channel_table`) channels each,
    seeded by ``seed``.

    :meth:`readings` gives the ``(n_devices, channels)`` readings of a round;
    :meth:`ground_truth_mean` their exact mean (simulation only).
    """

    n_devices: int
    channels: int = 6
    seed: int = 0
    faulty_fraction: float = 0.01
    hours_per_round: float = 1.0
    out_of_range_fraction: float = 0.0
    _offset: F64 = field(init=False, repr=False, compare=False)
    _drift: F64 = field(init=False, repr=False, compare=False)
    _stuck: NDArray[np.bool_] = field(init=False, repr=False, compare=False)
    _stuck_value: F64 = field(init=False, repr=False, compare=False)
    _out_of_range: NDArray[np.bool_] = field(init=False, repr=False, compare=False)
    _out_of_range_value: F64 = field(init=False, repr=False, compare=False)
    _rounds: np.random.SeedSequence = field(init=False, repr=False, compare=False)
    _channel_specs: tuple[Channel, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if isinstance(self.n_devices, bool) or self.n_devices < 1:
            raise ValueError(f"n_devices must be >= 1, got {self.n_devices}")
        chans = channel_table(self.channels)  # validates the count
        object.__setattr__(self, "_channel_specs", chans)
        if not 0 <= self.faulty_fraction <= 1:
            raise ValueError(f"faulty_fraction must be in [0, 1], got {self.faulty_fraction}")
        if not 0 <= self.out_of_range_fraction <= 1:
            raise ValueError(
                f"out_of_range_fraction must be in [0, 1], got {self.out_of_range_fraction}"
            )
        if not (math.isfinite(self.hours_per_round) and self.hours_per_round > 0):
            raise ValueError(f"hours_per_round must be > 0, got {self.hours_per_round}")
        static, rounds = np.random.SeedSequence(self.seed).spawn(2)
        rng = np.random.default_rng(static)
        n, c = self.n_devices, self.channels
        offset = rng.normal(size=(n, c)) * np.array([ch.offset_sd for ch in chans])
        drift = rng.normal(size=(n, c)) * np.array([ch.drift_sd for ch in chans])
        stuck = np.zeros((n, c), dtype=np.bool_)
        faulty = np.flatnonzero(rng.random(n) < self.faulty_fraction)
        stuck[faulty, rng.integers(0, c, size=faulty.size)] = True
        lo, hi = (np.array(r) for r in self.ranges)
        stuck_value = np.where(rng.random((n, c)) < 0.5, lo, hi)
        out_of_range = np.zeros((n, c), dtype=np.bool_)
        out_value = np.zeros((n, c))
        if self.out_of_range_fraction > 0:  # drawn last: the other parameters do not change
            glitchy = np.flatnonzero(rng.random(n) < self.out_of_range_fraction)
            out_of_range[glitchy, rng.integers(0, c, size=glitchy.size)] = True
            excess = (hi - lo) * rng.uniform(0.01, 1.0, size=(n, c))
            out_value = np.where(rng.random((n, c)) < 0.5, lo - excess, hi + excess)
        object.__setattr__(self, "_out_of_range", out_of_range)
        object.__setattr__(self, "_out_of_range_value", out_value)
        object.__setattr__(self, "_offset", offset)
        object.__setattr__(self, "_drift", drift)
        object.__setattr__(self, "_stuck", stuck)
        object.__setattr__(self, "_stuck_value", stuck_value)
        object.__setattr__(self, "_rounds", rounds)

    @property
    def channel_specs(self) -> tuple[Channel, ...]:
        return self._channel_specs

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(ch.name for ch in self.channel_specs)

    @property
    def ranges(self) -> tuple[tuple[float, ...], tuple[float, ...]]:
        """``(lo, hi)`` per channel, as :class:`~edge.encoders.SensorEncoder` takes them."""
        chans = self.channel_specs
        return tuple(ch.lo for ch in chans), tuple(ch.hi for ch in chans)

    @property
    def faulty_devices(self) -> int:
        """Devices with a stuck or an out-of-range channel."""
        return int((self._stuck | self._out_of_range).any(axis=1).sum())

    def encoder(self, s: int) -> SensorEncoder:
        """The encoder that keeps ``s`` of the channels of each reading."""
        lo, hi = self.ranges
        return SensorEncoder(lo=lo, hi=hi, s=s, clip=True)

    def readings(self, round_: int, *, hour: float | None = None) -> F64:
        """Readings ``(n_devices, channels)`` of round ``round_`` (deterministic in it and
        ``hour``); only the out-of-range channels (``out_of_range_fraction``) leave
        ``[lo, hi]``.

        ``hour`` places the round in time: the daily cycle's hour, and the drift's
        ``hour / hours_per_round`` rounds (default ``round_ * hours_per_round``, the model's
        own clock). A caller on the wall clock (``coco fleet``) gives the hour of the day
        instead, so that the cycle follows the real time and the drift restarts daily; the
        noise is the round's either way.
        """
        if round_ < 0:
            raise ValueError(f"round must be >= 0, got {round_}")
        if hour is None:
            hour = round_ * self.hours_per_round
        elif not (math.isfinite(hour) and hour >= 0):
            raise ValueError(f"hour must be >= 0, got {hour}")
        child = np.random.SeedSequence(
            self._rounds.entropy, spawn_key=(*self._rounds.spawn_key, round_)
        )
        rng = np.random.default_rng(child)
        chans = self.channel_specs
        base = np.array(
            [
                ch.base + ch.daily_amplitude * math.cos(2 * math.pi * (hour - ch.peak_hour) / 24)
                for ch in chans
            ]
        )
        noise = rng.normal(size=self._offset.shape) * np.array([ch.noise_sd for ch in chans])
        x = base + self._offset + self._drift * (hour / self.hours_per_round) + noise
        x = np.where(self._stuck, self._stuck_value, x)
        lo, hi = (np.array(r) for r in self.ranges)
        out: F64 = np.where(self._out_of_range, self._out_of_range_value, np.clip(x, lo, hi))
        return out

    def ground_truth_mean(self, round_: int) -> F64:
        """SIMULATION-ONLY ground truth: the exact fleet mean of round ``round_``'s readings."""
        mean: F64 = self.readings(round_).mean(axis=0)
        return mean
