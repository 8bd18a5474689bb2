"""The data a simulated fleet reports: sensor readings or key-value pairs, encoded as a
device encodes them (the stdlib device path of :mod:`edge.encoders`), one generator each.

A :class:`FleetModel` turns a round into each device's ``s``-sparse ternary vector (keys and
signs). Its mechanism dimension must equal the spec's ``d``:

* ``sensors``: ``d`` channels (5..8) of :class:`~sim.models.sensors.SensorFleet` (drift, daily
  cycle, noise, a few stuck and a few out-of-range channels), encoded by
  :class:`~edge.encoders.SensorEncoder` with ``clip=True``;
* ``keyvalue``: ``d - s`` features of :class:`~sim.models.keyvalue.KeyValueModel`, padded to ``s``
  keys by :class:`~edge.encoders.KeyValueEncoder` (``d = features + s``).

Randomness (STYLE.md): ``SeedSequence(seed).spawn(2)`` gives the model's parameters
(child 0: which devices are faulty, their offsets and drifts, the features' popularity) and
the parent of the devices' keys (child 1, ``spawn(n_devices)``). What a device draws in a
round comes from counter-based generators (:class:`DeviceStreams`): Philox with the
device's key and a counter that holds the wall-clock round and a lane (its data, its
randomiser). So device ``i``'s data and report in wall-clock round ``r`` depend on
``(seed, i, r)`` only: never on the fleet size, the connection mode, which devices failed
to connect, or the rounds the run published before. A run with the same seed in new rounds
sends new reports (a rerun is new data, not a replay); the same round gives the same
reports again. The sensor readings are those of the wall-clock round too
(:meth:`FleetModel.vectors`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import numpy as np

from edge.encoders import KeyValueEncoder, SensorEncoder
from edge.spec import MechanismSpec
from sim.models.day import DAY_SECONDS, hour_of_day
from sim.models.keyvalue import KeyValueModel
from sim.models.sensors import CHANNELS, SensorFleet

__all__ = ["MODELS", "DeviceStreams", "FleetModel", "ModelName", "device_bits", "seed_children"]

ModelName = Literal["sensors", "keyvalue"]
MODELS: tuple[ModelName, ...] = ("sensors", "keyvalue")
Sparse = tuple[list[int], list[int]]


def seed_children(seed: int) -> tuple[np.random.SeedSequence, ...]:
    """``(model parameters, device keys)`` seed sequences of a run."""
    return tuple(np.random.SeedSequence(seed).spawn(2))


def device_bits(bits: np.random.BitGenerator) -> Callable[[int], int]:
    """``getrandbits(k)`` (``0 <= k <= 32``) of a device's bit generator, for the device
    path (one 64-bit draw per call)."""
    raw = bits.random_raw

    def getrandbits(k: int) -> int:
        return int(raw()) >> (64 - k) if k > 0 else 0

    return getrandbits


_LANES = ("data", "randomiser")
_EMPTY_BUFFER = np.zeros(4, dtype=np.uint64)


class DeviceStreams:
    """Each device's generators, keyed by ``(seed, device)`` and set to a wall-clock round.

    Device ``i`` has a 128-bit Philox key (from child 1 of the run's seed, spawned per
    device); in round ``r`` lane ``l`` (0: data, 1: randomiser) starts at the counter
    ``(0, 0, r, l)``, so that each (device, round, lane) has a stream of its own, from any
    starting point and in any order. Call :meth:`set_round` before drawing a round's
    values.
    """

    def __init__(self, seed: int, n_devices: int) -> None:
        parent = seed_children(seed)[1]
        self._keys = [
            np.asarray(child.generate_state(2, np.uint64), dtype=np.uint64)
            for child in parent.spawn(n_devices)
        ]
        self._bits = {lane: [np.random.Philox(key=key) for key in self._keys] for lane in _LANES}
        self.data = [np.random.Generator(bits) for bits in self._bits["data"]]
        """Device ``i``'s data generator (the model's draws and its encoder's bits)."""
        self.round: int | None = None

    def set_round(self, round_: int) -> None:
        """Every device's lanes at the start of wall-clock round ``round_`` (>= 0)."""
        if round_ < 0:
            raise ValueError(f"round must be >= 0, got {round_}")
        for index, lane in enumerate(_LANES):
            counter = np.array([0, 0, round_, index], dtype=np.uint64)
            for key, bits in zip(self._keys, self._bits[lane], strict=True):
                bits.state = {
                    "bit_generator": "Philox",
                    "state": {"counter": counter, "key": key},
                    "buffer": _EMPTY_BUFFER,
                    "buffer_pos": 4,
                    "has_uint32": 0,
                    "uinteger": 0,
                }
        self.round = round_

    def randomiser(self, i: int) -> np.random.BitGenerator:
        """Device ``i``'s randomiser lane (the bits of its report's ``seed`` and ``z``)."""
        return self._bits["randomiser"][i]


@dataclass(frozen=True, kw_only=True)
class FleetModel:
    """Per-device ternary vectors of one model, for a spec of matching ``d``."""

    name: ModelName
    spec: MechanismSpec
    n_devices: int
    seed: int
    round_seconds: int = 3600
    """Length of a wall-clock round: places a round in the sensors' day."""
    day_seconds: int = DAY_SECONDS
    """Length of the sensors' day in wall-clock seconds (a real day by default; smaller
    compresses the daily cycle: :func:`~sim.models.day.hour_of_day`)."""
    faulty_fraction: float = 0.01
    out_of_range_fraction: float = 0.01

    def __post_init__(self) -> None:
        d, s = self.spec.d, self.spec.s
        if self.name == "sensors":
            if not 5 <= d <= len(CHANNELS):
                raise ValueError(
                    f"the sensors model has 5..{len(CHANNELS)} channels, one per dimension; "
                    f"the spec has d={d}"
                )
        elif self.name == "keyvalue":
            if d - s < 1:
                raise ValueError(
                    f"the keyvalue model needs d = features + s with features >= 1 "
                    f"(KeyValueEncoder pads to s keys); the spec has d={d}, s={s}"
                )
        else:
            raise ValueError(f"model must be one of {MODELS}, got {self.name!r}")
        params = seed_children(self.seed)[0]
        param_seed = int(params.generate_state(1)[0])
        if self.name == "sensors":
            sensors = SensorFleet(
                n_devices=self.n_devices,
                channels=d,
                seed=param_seed,
                faulty_fraction=self.faulty_fraction,
                out_of_range_fraction=self.out_of_range_fraction,
            )
            object.__setattr__(self, "_sensors", sensors)
            object.__setattr__(self, "_sensor_encoder", sensors.encoder(s))
        else:
            kv = KeyValueModel(features=d - s, expected_keys=min(float(s), d - s), seed=param_seed)
            object.__setattr__(self, "_keyvalue", kv)
            object.__setattr__(self, "_kv_encoder", KeyValueEncoder(d=d - s, s=s))

    @property
    def d(self) -> int:
        """The mechanism dimension (the spec's ``d``)."""
        return self.spec.d

    @property
    def sensors(self) -> SensorFleet:
        """The sensor model (``sensors`` only)."""
        sensors: SensorFleet = self.__dict__["_sensors"]
        return sensors

    @property
    def keyvalue(self) -> KeyValueModel:
        """The key-value model (``keyvalue`` only)."""
        kv: KeyValueModel = self.__dict__["_keyvalue"]
        return kv

    def vectors(self, round_: int, streams: DeviceStreams) -> list[Sparse]:
        """Every device's ``(keys, signs)`` of wall-clock round ``round_``, drawn from
        ``streams`` (set to that round: :meth:`DeviceStreams.set_round`).

        Sensors: the readings of round ``round_`` at the hour of the (UTC) day at its start,
        so the daily cycle is the real one and the drift restarts every day (a day of
        ``day_seconds``: compressed, the cycle runs that much faster)
        (:meth:`~sim.models.sensors.SensorFleet.readings`); each device's encoder bits from its data
        lane. Key-value: each device's pairs and encoder bits from its data lane.
        """
        if len(streams.data) != self.n_devices:
            raise ValueError(f"need {self.n_devices} devices' streams, got {len(streams.data)}")
        if streams.round != round_:
            raise ValueError(f"the streams are set to round {streams.round}, not {round_}")
        out: list[Sparse] = []
        if self.name == "sensors":
            hour = hour_of_day(round_ * self.round_seconds, self.day_seconds)
            readings = self.sensors.readings(round_, hour=hour).tolist()
            enc: SensorEncoder = self.__dict__["_sensor_encoder"]
            for values, rng in zip(readings, streams.data, strict=True):
                out.append(enc.encode(values, getrandbits=device_bits(rng.bit_generator)))
            return out
        kv_enc: KeyValueEncoder = self.__dict__["_kv_encoder"]
        for rng in streams.data:
            pairs = self.keyvalue.pairs(rng)
            out.append(kv_enc.encode(pairs, getrandbits=device_bits(rng.bit_generator)))
        return out
