"""The aggregator's rules, with no I/O: what a batch must satisfy, and what a check concludes.

The configuration of the checks (:class:`CoreRules`), a batch that passed them
(:class:`Verified`), a refusal and its reason (:class:`RejectedError`, :data:`Outcome`), and
which refusals the privacy ledger accounts all the same (:data:`ACCOUNTED_REFUSALS`). The state
they are applied to, and the checks themselves in order, are
:class:`~aggregator.service.core.machine.AggregatorCore`'s (:mod:`aggregator.service.core.machine`):
kept apart so that the terms, and how rounds are keyed, can be read without the state machine.

Rounds are times
----------------
A round is identified by its start time, Unix seconds ``round * round_seconds``, with its
length alongside: a batch or manifest of wire version 2 carries its round's length, one of
version 1 is read under the announced length (:attr:`CoreRules.unit`). Everything kept per
round (the batch memory and its horizon, the manifests' reconciliation, the silent shards,
the series' rows, the privacy ledger's releases) is keyed by that start, so that a change of
``round_seconds`` in either direction keeps rounds in their order in time: the rounds
numbered under the new length follow those of the old one, whatever their numbers.

Batch-id memory and the retained horizon
----------------------------------------
The ids of applied batches are kept per round for the rounds that started in the newest
``retention_rounds * unit`` seconds applied
(:class:`~aggregator.service.core.memory.BatchMemory`): a replay of a retained round is a duplicate,
a batch of an older round is ``stale_round``. Memory follows the
window's traffic, not the deployment's age.

Trusted keys and shards
-----------------------
What is trusted is one pinned anchor (:mod:`aggregator.service.core.keys`): the batch key of an
unsharded deployment, or the announced shard layouts, whose shard ``L`` signs only the
batches and manifests of its own topic and of its layout's rounds (``unknown_shard``,
``wrong_shard``). Applied batches are also counted per shard
(:class:`~aggregator.service.core.memory.ShardStats`): the smallest batch of every shard is the
guarantee each report has.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import numpy as np
import numpy.typing as npt

from aggregator.series.core import Series
from aggregator.service.core.keys import TrustedKeys
from aggregator.service.core.silence import DEFAULT_SILENT_SHARD_ROUNDS
from edge.rounds import check_round_seconds
from edge.spec import MechanismSpec

__all__ = [
    "ACCOUNTED_REFUSALS",
    "CoreRules",
    "Outcome",
    "RejectedError",
    "Verified",
]

ACCOUNTED_REFUSALS = frozenset({"future_round", "stale_round", "wrong_shard"})
"""Verified batches and manifests refused for their round, yet released by a trusted
shuffler (whoever listens on the batches topic has them): the privacy ledger accounts them
all the same. A stale round's detail is usually compacted in the ledger: the record is then
charged as an extra participation, and its id remembered in the ledger's bounded memory
(:data:`~aggregator.ledger.participations.FORGOTTEN_KEPT` ids, saved in its file), so a
replay is not charged again until that id is forgotten; after that it is, pessimistically.
A verified batch below ``min_batch`` is accounted too, at its real size
(:meth:`~aggregator.service.core.machine.AggregatorCore.check`)."""

Outcome = Literal["applied", "duplicate"] | str
"""What :meth:`~aggregator.service.core.machine.AggregatorCore.handle` did: ``"applied"``,
``"duplicate"`` or the reason a batch was rejected
(:data:`aggregator.service.metric_labels.REJECT_REASONS`)."""


class RejectedError(Exception):
    """A batch refused for ``reason``; ``reports`` is its record count when its signature
    verified (an unverified count means nothing), else 0. ``keep``: verified under an
    announced key and refused for a reason an operator can fix (kept in the quarantine:
    :mod:`aggregator.service.core.quarantine`)."""

    def __init__(self, reason: str, reports: int = 0, *, keep: bool = False) -> None:
        super().__init__(reason)
        self.reason = reason
        self.reports = reports
        self.keep = keep


@dataclass(frozen=True, kw_only=True)
class CoreRules:
    """What a batch must satisfy (:mod:`aggregator.service.core.machine`, *Checks, in order*)."""

    spec: MechanismSpec
    deployment: str
    trusted: str
    """The trusted anchor: the batch key, or the announced shard layouts as JSON
    (:mod:`aggregator.service.core.keys`)."""
    min_batch: int
    retention_rounds: int
    round_seconds: int | None = None
    """The announced round length; ``None`` (a spec file without it) skips the
    ``future_round`` check: there is no clock to judge by."""
    manifest_grace: float = 120.0
    """Seconds a manifest waits for its batches before the missing ones are counted."""
    silent_shard_rounds: int = DEFAULT_SILENT_SHARD_ROUNDS
    """Rounds others released while a shard released nothing, from which it is silent
    (:mod:`aggregator.service.core.silence`)."""
    series_retention: float = 7 * 86400.0
    """Seconds the series keeps each round's own row (:class:`~aggregator.series.core.Series`)."""
    series_step: int | None = 3600
    """Seconds of the coarse rows older rounds are rolled into (``None``: dropped)."""
    series_coarse_retention: float = 90 * 86400.0
    """Seconds the coarse rows are kept past ``series_retention``."""

    @property
    def unit(self) -> int:
        """The round length of a batch or manifest of wire version 1, and the one the
        horizon and the ledger's lag are counted in: the announced ``round_seconds``, or 1
        without one (version-1 rounds then keyed by their numbers, as they come; the
        horizon and the lag then count rounds of the newest length applied)."""
        return 1 if self.round_seconds is None else self.round_seconds

    def new_series(self) -> Series | None:
        """An empty series for these rules; ``None`` without a round length."""
        if self.round_seconds is None:
            return None
        return Series(
            self.spec,
            round_seconds=self.round_seconds,
            retention=self.series_retention,
            step=self.series_step,
            coarse_retention=self.series_coarse_retention,
        )

    @property
    def ledger_lag_rounds(self) -> int:
        """Rounds the privacy ledger keeps in detail behind the newest one: twice the
        grace period in rounds, and two more (ten without a round length)."""
        if self.round_seconds is None:
            return 10
        return math.ceil(2 * self.manifest_grace / self.round_seconds) + 2

    def __post_init__(self) -> None:
        TrustedKeys(self.trusted, self.deployment)  # CocoError if malformed
        if self.min_batch < 1:
            raise ValueError(f"min_batch must be >= 1, got {self.min_batch}")
        if self.retention_rounds < 1:
            raise ValueError(f"retention_rounds must be >= 1, got {self.retention_rounds}")
        if self.round_seconds is not None:
            check_round_seconds(self.round_seconds)
        if self.silent_shard_rounds < 1:
            raise ValueError(f"silent_shard_rounds must be >= 1, got {self.silent_shard_rounds}")


@dataclass(frozen=True)
class Verified:
    """A batch that passed every check but the records'
    (:meth:`~aggregator.service.core.machine.AggregatorCore.partial`)."""

    batch_id: bytes
    round: int
    seeds: npt.NDArray[np.uint32]
    z: npt.NDArray[np.uint16]
    shard: str | None = None
    round_seconds: int = 1
    """The length of ``round`` (the batch's, or the announced one for wire version 1)."""
    dating: int = 0
    """The round length that dates the batch in the privacy ledger while no manifest lists
    it: the one it carries, or the announced one, 0 with neither."""

    @property
    def size(self) -> int:
        return int(self.seeds.size)

    @property
    def start(self) -> int:
        """When the round started (Unix seconds): the round's key (module docs)."""
        return self.round * self.round_seconds
