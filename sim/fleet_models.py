"""The data a simulated fleet reports: sensor readings or key-value pairs, encoded as a
device encodes them (the stdlib device path of :mod:`edge.encoders`), one generator each.

A :class:`FleetModel` turns a round into each device's ``s``-sparse ternary vector (keys and
signs). Its mechanism dimension must equal the spec's ``d``:

* ``sensors``: ``d`` channels (5..8) of :class:`~sim.sensors.SensorFleet` (drift, daily
  cycle, noise, a few stuck and a few out-of-range channels), encoded by
  :class:`~edge.encoders.SensorEncoder` with ``clip=True``;
* ``keyvalue``: ``d - s`` features of :class:`~sim.keyvalue.KeyValueModel`, padded to ``s``
  keys by :class:`~edge.encoders.KeyValueEncoder` (``d = features + s``).

Randomness (STYLE.md): ``SeedSequence(seed).spawn(3)`` gives the model's parameters
(child 0), the parent of the per-device generators (child 1, ``spawn(n_devices)``) and the
parent of the devices' randomisers (child 2, used by :mod:`sim.fleet`). Device ``i``'s
vector depends only on the seed, ``i`` and the rounds before it, never on the fleet size,
the connection mode or which devices failed to connect.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import numpy as np

from edge.encoders import KeyValueEncoder, SensorEncoder
from edge.spec import MechanismSpec
from sim.keyvalue import KeyValueModel
from sim.sensors import CHANNELS, SensorFleet

__all__ = ["MODELS", "FleetModel", "ModelName", "device_bits", "seed_children"]

ModelName = Literal["sensors", "keyvalue"]
MODELS: tuple[ModelName, ...] = ("sensors", "keyvalue")
Sparse = tuple[list[int], list[int]]


def seed_children(seed: int) -> tuple[np.random.SeedSequence, ...]:
    """``(model parameters, device data, device randomisers)`` seed sequences of a run."""
    return tuple(np.random.SeedSequence(seed).spawn(3))


def device_bits(rng: np.random.Generator) -> Callable[[int], int]:
    """``getrandbits(k)`` (``0 <= k <= 32``) of a device's generator, for the device path."""
    raw = rng.bit_generator.random_raw

    def getrandbits(k: int) -> int:
        return int(raw()) >> (64 - k) if k > 0 else 0

    return getrandbits


@dataclass(frozen=True, kw_only=True)
class FleetModel:
    """Per-device ternary vectors of one model, for a spec of matching ``d``."""

    name: ModelName
    spec: MechanismSpec
    n_devices: int
    seed: int
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

    def device_generators(self) -> list[np.random.Generator]:
        """One data generator per device (child 1 of the run's seed, spawned per device)."""
        parent = seed_children(self.seed)[1]
        return [np.random.default_rng(child) for child in parent.spawn(self.n_devices)]

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

    def vectors(self, round_: int, rngs: list[np.random.Generator]) -> list[Sparse]:
        """Every device's ``(keys, signs)`` of round ``round_`` (``rngs``: one per device).

        ``round_`` is the run's round index (0, 1, ...), not the wall-clock round number the
        reports carry, so that a seed fixes the data whenever the run happens.
        """
        if len(rngs) != self.n_devices:
            raise ValueError(f"need {self.n_devices} generators, got {len(rngs)}")
        out: list[Sparse] = []
        if self.name == "sensors":
            readings = self.sensors.readings(round_).tolist()
            enc: SensorEncoder = self.__dict__["_sensor_encoder"]
            for values, rng in zip(readings, rngs, strict=True):
                out.append(enc.encode(values, getrandbits=device_bits(rng)))
            return out
        kv_enc: KeyValueEncoder = self.__dict__["_kv_encoder"]
        for rng in rngs:
            out.append(kv_enc.encode(self.keyvalue.pairs(rng), getrandbits=device_bits(rng)))
        return out
