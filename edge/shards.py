"""Sharded deployments: which shuffler shard serves a device in a round.

A deployment whose announcement has the key ``shards`` splits its devices among ``K``
shuffler processes per *layout*; each shard pools, deduplicates and shuffles only its own
devices' reports, so adding shufflers adds capacity (docs/protocol.md, "Sharded
deployments"). The announcement lists one or two layouts::

    "shards": [{"count": K, "from_round": R, "generation": g, "keys": [hex, ...], "seed": S}, ...]

* the layout in force for round ``r`` is the one with the largest ``from_round <= r``; a
  round before the first layout has none (a device does not report in it);
* the shard of a device is ``(XXH32(utf8(device_id), S) * K) >> 32``
  (:func:`edge.device.shard_index`, which devices run);
* shard ``i`` of generation ``g`` is labelled ``g<g>s<i>``; its reports travel on
  ``coco/v1/<deployment>/ingress/<label>/<device-id>`` and its batches and manifests on
  ``.../batches/<label>`` and ``.../manifests/<label>`` (:mod:`edge.topics`);
* ``keys[i]`` is the Ed25519 public key of shard ``i``'s shuffler (raw 32-byte RFC 8032
  key, 64 lowercase hex digits): the aggregator trusts exactly these keys, each only for the
  rounds of its layout.

A reshard (``K`` to ``K'``, or a new seed) announces a second layout with a higher
generation and a ``from_round`` a few rounds ahead; every round is served by exactly one
layout, so no device is ever in two shards' batches of one round.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from edge.device import shard_index
from edge.errors import SpecError

__all__ = [
    "MAX_GENERATION",
    "MAX_SHARDS",
    "ShardLayout",
    "ShardPlan",
    "parse_label",
    "shard_label",
]

MAX_SHARDS = 256
MAX_GENERATION = 65535
_U32_MAX = 0xFFFFFFFF
_KEY_HEX = 64
_LABEL = re.compile(r"g(0|[1-9][0-9]{0,4})s(0|[1-9][0-9]{0,2})")
_LAYOUT_KEYS = frozenset({"count", "from_round", "generation", "keys", "seed"})


def shard_label(generation: int, index: int) -> str:
    """``g<generation>s<index>``: the topic level of one shard."""
    return f"g{generation}s{index}"


def parse_label(label: str) -> tuple[int, int]:
    """``(generation, index)`` of a shard label; :class:`SpecError` for anything else."""
    match = _LABEL.fullmatch(label)
    if match is None:
        raise SpecError(f"a shard label is g<generation>s<index>, e.g. g0s2; got {label!r}")
    generation, index = int(match.group(1)), int(match.group(2))
    if generation > MAX_GENERATION or index >= MAX_SHARDS:
        raise SpecError(f"shard label {label!r} is out of range")
    return generation, index


def _check_int(name: str, value: object, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise SpecError(f"shards: {name} must be an integer in [{low}, {high}], got {value!r}")
    return value


def _check_key(value: object) -> str:
    if (
        not isinstance(value, str)
        or len(value) != _KEY_HEX
        or any(c not in "0123456789abcdef" for c in value)
    ):
        raise SpecError(f"shards: each key must be {_KEY_HEX} lowercase hex digits, got {value!r}")
    return value


@dataclass(frozen=True, kw_only=True)
class ShardLayout:
    """One layout: ``count`` shards of generation ``generation`` from round ``from_round``."""

    count: int
    from_round: int
    generation: int
    seed: int
    keys: tuple[str, ...]

    def __post_init__(self) -> None:
        _check_int("count", self.count, 1, MAX_SHARDS)
        _check_int("from_round", self.from_round, 0, _U32_MAX)
        _check_int("generation", self.generation, 0, MAX_GENERATION)
        _check_int("seed", self.seed, 0, _U32_MAX)
        keys = tuple(_check_key(k) for k in self.keys)
        if len(keys) != self.count:
            raise SpecError(f"shards: {self.count} shards need {self.count} keys, got {len(keys)}")
        if len(set(keys)) != len(keys):
            raise SpecError("shards: every shard needs its own key (two keys are equal)")
        object.__setattr__(self, "keys", keys)

    def index_of(self, device_id: str) -> int:
        """The shard of ``device_id`` in this layout."""
        return shard_index(device_id.encode(), self.seed, self.count)

    def label(self, index: int) -> str:
        if not 0 <= index < self.count:
            raise ValueError(f"shard index {index} is not in [0, {self.count})")
        return shard_label(self.generation, index)

    @property
    def labels(self) -> tuple[str, ...]:
        return tuple(self.label(i) for i in range(self.count))

    def key_of(self, label: str) -> str | None:
        """The public key of shard ``label`` if it is one of this layout's, else ``None``."""
        generation, index = parse_label(label)
        if generation != self.generation or index >= self.count:
            return None
        return self.keys[index]

    def to_dict(self) -> dict[str, Any]:
        return {
            "count": self.count,
            "from_round": self.from_round,
            "generation": self.generation,
            "keys": list(self.keys),
            "seed": self.seed,
        }

    @classmethod
    def from_dict(cls, data: object) -> ShardLayout:
        if not isinstance(data, dict) or set(data) != _LAYOUT_KEYS:
            raise SpecError(
                f"shards: a layout is an object with exactly the keys {sorted(_LAYOUT_KEYS)}, "
                f"got {data!r}"
            )
        keys = data["keys"]
        if not isinstance(keys, list):
            raise SpecError(f"shards: keys must be a list, got {keys!r}")
        return cls(
            count=data["count"],
            from_round=data["from_round"],
            generation=data["generation"],
            seed=data["seed"],
            keys=tuple(keys),
        )


@dataclass(frozen=True)
class ShardPlan:
    """The announced layouts (one or two), oldest first."""

    layouts: tuple[ShardLayout, ...]

    def __post_init__(self) -> None:
        layouts = tuple(self.layouts)
        if not 1 <= len(layouts) <= 2:
            raise SpecError(f"shards: announce one or two layouts, got {len(layouts)}")
        for older, newer in itertools.pairwise(layouts):
            if newer.from_round <= older.from_round:
                raise SpecError("shards: layouts must be sorted by strictly increasing from_round")
            if newer.generation <= older.generation:
                raise SpecError("shards: a newer layout needs a higher generation")
        keys = [k for layout in layouts for k in layout.keys]
        if len(set(keys)) != len(keys):
            raise SpecError("shards: a key appears in two layouts; every shard needs its own")
        object.__setattr__(self, "layouts", layouts)

    @classmethod
    def from_json(cls, value: object) -> ShardPlan:
        if not isinstance(value, list):
            raise SpecError(f"shards must be a JSON list of layouts, got {value!r}")
        return cls(tuple(ShardLayout.from_dict(item) for item in value))

    def to_json(self) -> list[dict[str, Any]]:
        return [layout.to_dict() for layout in self.layouts]

    def layout_for_round(self, round_: int) -> ShardLayout | None:
        """The layout in force for ``round_``, or ``None`` before the first one."""
        found = None
        for layout in self.layouts:
            if layout.from_round <= round_:
                found = layout
        return found

    def rounds_of(self, layout: ShardLayout) -> tuple[int, int | None]:
        """``[first, end)`` rounds served by ``layout`` (``end`` ``None``: open-ended)."""
        index = self.layouts.index(layout)
        end = self.layouts[index + 1].from_round if index + 1 < len(self.layouts) else None
        return layout.from_round, end

    def label_for(self, device_id: str, round_: int) -> str | None:
        """The shard label serving ``device_id``'s report of ``round_`` (``None``: no layout
        is in force for that round, so the device does not report in it)."""
        layout = self.layout_for_round(round_)
        if layout is None:
            return None
        return layout.label(layout.index_of(device_id))

    def layout_of_label(self, label: str) -> ShardLayout | None:
        """The layout that has shard ``label``, or ``None``."""
        generation, index = parse_label(label)
        for layout in self.layouts:
            if layout.generation == generation and index < layout.count:
                return layout
        return None

    def key_of(self, label: str) -> str | None:
        layout = self.layout_of_label(label)
        return None if layout is None else layout.key_of(label)

    def serves(self, label: str, round_: int) -> bool:
        """Whether shard ``label`` serves round ``round_`` (its layout is in force then)."""
        layout = self.layout_of_label(label)
        return layout is not None and self.layout_for_round(round_) is layout

    @property
    def labels(self) -> tuple[str, ...]:
        return tuple(label for layout in self.layouts for label in layout.labels)

    def labels_ahead(self, round_: int) -> tuple[str, ...]:
        """The shards of every layout whose first round comes after ``round_`` (the current
        round): a reshard's new shards, before devices start publishing to them."""
        return tuple(
            label
            for layout in self.layouts
            if layout.from_round > round_
            for label in layout.labels
        )


def plan_from_layouts(layouts: Sequence[ShardLayout]) -> ShardPlan:
    """A :class:`ShardPlan` of ``layouts`` (validated)."""
    return ShardPlan(tuple(layouts))
