"""What the aggregator's checkpoint holds: the data model, with no I/O.

:class:`Checkpoint` is what :meth:`aggregator.service.core.machine.AggregatorCore.content` takes of
the core's state, and what a checked checkpoint file gives back. Its text, written, read and
checked, is :mod:`aggregator.service.core.checkpoint_codec`'s; the reading of files of version 3
or older (rounds by number) under the announced round length is
:mod:`aggregator.service.core.checkpoint_migration`'s; the files themselves are
:mod:`aggregator.service.checkpoint_files`'. Kept apart from both so that a reader learns what a
checkpoint *is* (and what each field means) without the parsing of every version's text.

Rounds are keyed by their start time, Unix seconds (``batch_rounds``, and the rounds of
``reconciliation``; :mod:`aggregator.service.core.rules`, *Rounds are times*), and
``newest_length`` is the length of the newest round applied (absent before the first), and
``forgotten`` the starts whose batch ids were forgotten (never accepted again).

``batch_rounds`` holds the ids of the applied batches of the retained rounds only
(:mod:`aggregator.service.core.rules`), so its size follows the traffic of the window, not the age
of the deployment. ``trusted`` is what the sums were verified under (the batch key, or the announced
shard layouts: :mod:`aggregator.service.core.keys`); ``shards`` the batches applied per shard;
``reconciliation`` the manifests and batches still being matched
(:mod:`aggregator.service.core.manifests`). ``ledger`` is the privacy ledger file written just
before this generation (:mod:`aggregator.ledger.ledger_file`): its generation and the SHA-256 of
its bytes, checked against the ledger file at start (:mod:`aggregator.service.core.binding`);
a file written before the field existed has none. ``series`` is the sequence number of the
newest record of the per-round series file written before this generation
(:mod:`aggregator.series.segment`, :mod:`aggregator.service.series_file`): recovery cuts the
file there. A file written before the field existed, or without a series (no round length),
has none.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aggregator.estimation.estimators import AggregateState
from aggregator.series.core import Delta
from edge.errors import CocoError

CHECKPOINT_VERSION = 4
"""Version 4 keys rounds by their start time. Version 3 adds ``generation``, ``trusted``,
``shards``, ``reconciliation`` and ``checksums``. Version 2 kept the applied batch ids per
round (``batch_rounds``); a version-1 checkpoint (unsigned batches, a flat ``seen`` list) is
read for its sums and counters, its ids dropped, since a redelivered unsigned batch fails
its signature anyway."""


class CheckpointError(CocoError):
    """A checkpoint that cannot be read, is damaged, or belongs to another spec or key."""


@dataclass
class Counters:
    """The service's counts, kept in the checkpoint so that they continue across restarts."""

    reports: int = 0
    batches: int = 0
    duplicates: int = 0
    rejected: dict[str, int] = field(default_factory=dict)
    """Batches rejected, by reason."""
    rejected_reports: dict[str, int] = field(default_factory=dict)
    """Reports in the rejected batches whose signature verified, by reason."""
    unacknowledged: dict[str, int] = field(default_factory=dict)
    """Batches left without a PUBACK (the broker redelivers them), by reason."""
    manifests_rejected: dict[str, int] = field(default_factory=dict)
    """Manifests rejected, by reason."""
    manifests_duplicate: int = 0
    """Manifests of a release already accepted (re-sent), ignored."""

    def copy(self) -> Counters:
        return Counters(
            reports=self.reports,
            batches=self.batches,
            duplicates=self.duplicates,
            rejected=dict(self.rejected),
            rejected_reports=dict(self.rejected_reports),
            unacknowledged=dict(self.unacknowledged),
            manifests_rejected=dict(self.manifests_rejected),
            manifests_duplicate=self.manifests_duplicate,
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "reports": self.reports,
            "batches": self.batches,
            "duplicates": self.duplicates,
            "rejected": dict(sorted(self.rejected.items())),
            "rejected_reports": dict(sorted(self.rejected_reports.items())),
            "unacknowledged": dict(sorted(self.unacknowledged.items())),
            "manifests_rejected": dict(sorted(self.manifests_rejected.items())),
            "manifests_duplicate": self.manifests_duplicate,
        }


@dataclass(frozen=True)
class LedgerRecord:
    """The privacy ledger file a checkpoint was written with: the ledger's generation and
    the SHA-256 (hex) of the file's bytes."""

    generation: int
    sha256: str

    def to_dict(self) -> dict[str, Any]:
        return {"generation": self.generation, "sha256": self.sha256}


@dataclass(frozen=True, kw_only=True)
class Checkpoint:
    """What a checkpoint holds
    (:meth:`aggregator.service.core.machine.AggregatorCore.content`), or a checked checkpoint file
    (:func:`~aggregator.service.checkpoint_files.load_checkpoint`, with its
    ``path``)."""

    version: int = CHECKPOINT_VERSION
    generation: int = 0
    """Counts the checkpoints written for this state (0 in files of version 1 and 2)."""
    fingerprint: str
    deployment: str | None = None
    delta: float
    trusted: str | None = None
    """What the sums were verified under: the batch key or the shard layouts
    (:mod:`aggregator.service.core.keys`; ``None`` in files of version 1 and 2)."""
    state: AggregateState
    batch_rounds: dict[int, list[bytes]]
    """Applied batch ids by round start (by round number before version 4; empty for a
    version-1 file)."""
    retention_rounds: int | None = None
    counters: Counters
    smallest_batch: int | None
    latest_batch: int | None
    batch_sizes: dict[int, int]
    """The old per-batch privacy records (version 2: every batch applied, by size; a
    checkpoint without them counts every batch as one of the smallest size, the largest
    per-batch epsilon, so the composition stays an upper bound). Version 3 carries them
    over only for a deployment upgraded from version 2; its privacy ledger has its own
    file (:mod:`aggregator.ledger.ledger_file`)."""
    last_batch_timestamp: float | None
    written_at: float | None = None
    shards: dict[str, dict[str, int | None]] = field(default_factory=dict)
    """Batches applied per shard label: ``batches``, ``reports``, ``smallest``, ``latest``."""
    reconciliation: dict[str, Any] | None = None
    """:meth:`aggregator.service.core.manifests.Reconciler.to_json` (``None`` in older files)."""
    ledger: LedgerRecord | None = None
    """The ledger file written with this generation (``None``: a file from before the field,
    or content not yet bound to its ledger file)."""
    newest_length: int | None = None
    """The length of the newest round applied (``None``: none yet, or a file before
    version 4): the horizon's unit without an announced round length."""
    forgotten: tuple[int, int] | None = None
    """``(first, high)`` of :class:`aggregator.service.core.memory.BatchMemory`: the starts
    whose batch ids were forgotten (``None``: none yet, or a file without it). A restart
    with a longer horizon never accepts those again: a batch whose id was forgotten (one
    the quarantine kept as ``stale_round``, replayed at start) would be applied twice."""
    series_seq: int | None = None
    """The sequence number of the newest series record written before this generation
    (``None``: no series, or a file from before the field)."""
    series_deltas: tuple[Delta, ...] = field(default=(), compare=False, repr=False)
    """Content only, never encoded: the series records to append before this generation
    (:meth:`aggregator.series.core.Series.take`, taken with the content)."""
    path: Path | None = None


def one_line(exc: BaseException) -> str:
    """``exc`` as one line of an error message."""
    if isinstance(exc, KeyError):
        return f"missing {exc}"
    return " ".join(str(exc).split())
