"""The shuffler core's rules: its configuration and the randomness a release is given
(:mod:`broker.core` applies them)."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from edge.rounds import check_round_seconds

__all__ = ["MAX_BATCH_LIMIT", "BatchMaker", "CoreConfig", "RoundPolicy"]

RoundPolicy = Literal["carry", "drop"]
MAX_BATCH_LIMIT = 40_000
"""Largest ``max_batch``: a sealed batch of 40,000 records is 240,094 bytes, under the
shipped broker's ``max_packet_size`` of 256 KiB (deploy/mosquitto/mosquitto.conf)."""


@dataclass(frozen=True, kw_only=True)
class CoreConfig:
    """Release and acceptance rules (see the module docstring)."""

    fingerprint: int
    t: int
    round_seconds: int
    min_batch: int
    max_batch: int = 10_000
    release_size: int | None = None
    round_policy: RoundPolicy = "carry"
    max_skew: float = 5.0
    late_seconds: float = 0.0
    max_reports_per_round: int = 1_000_000
    max_outbox_batches: int = 1_000

    def __post_init__(self) -> None:
        check_round_seconds(self.round_seconds)
        for name in ("min_batch", "max_batch", "max_reports_per_round", "max_outbox_batches"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int):
                raise ValueError(f"{name} must be an integer, got {value!r}")
        if self.min_batch < 2:
            raise ValueError(f"min_batch must be >= 2, got {self.min_batch}")
        if self.max_batch > MAX_BATCH_LIMIT:
            raise ValueError(f"max_batch must be <= {MAX_BATCH_LIMIT}, got {self.max_batch}")
        if self.max_batch < 2 * self.min_batch:
            raise ValueError(
                f"max_batch must be >= 2 * min_batch = {2 * self.min_batch}, got {self.max_batch}"
            )
        release = self.release_size
        if release is not None and not self.min_batch <= release <= self.max_reports_per_round:
            raise ValueError(
                f"release_size must be None or in [min_batch={self.min_batch}, "
                f"max_reports_per_round], got {release}"
            )
        if self.round_policy not in ("carry", "drop"):
            raise ValueError(f"round_policy must be 'carry' or 'drop', got {self.round_policy!r}")
        for name in ("max_skew", "late_seconds"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value >= 0):
                raise ValueError(f"{name} must be a finite number >= 0, got {value}")
        if self.max_reports_per_round < self.min_batch:
            raise ValueError(
                f"max_reports_per_round must be >= min_batch, got {self.max_reports_per_round}"
            )
        if self.max_outbox_batches < 1:
            raise ValueError(f"max_outbox_batches must be >= 1, got {self.max_outbox_batches}")


@dataclass(frozen=True, kw_only=True)
class BatchMaker:
    """The randomness and the key a release needs, injected so that the core stays pure:
    a uniform in-place shuffle, fresh 16-byte batch ids, and the batch seal."""

    shuffle: Callable[[list[int]], None]
    new_batch_id: Callable[[], bytes]
    seal: Callable[[bytes], bytes]
    seal_manifest: Callable[[bytes], bytes] | None = None
    """Seals the release's manifest (docs/protocol.md: one per release, published after
    its batches); ``None``: no manifest."""
