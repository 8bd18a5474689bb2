"""The per-round series on disk: ``<checkpoint>.series``, appended before each checkpoint.

The bytes are :mod:`aggregator.series.segment` (a checked header, then checksummed records);
what a record is, :mod:`aggregator.series.core` (*Persistence*). This module is the file.

Writing (the checkpoint's thread, :mod:`aggregator.service.generations`)
--------------------------------------------------------------------------
Before each checkpoint generation :meth:`SeriesFile.append` cuts the file back to its
committed length (a failed attempt may have left bytes), appends every record not yet
committed and ``fsync`` s it; then the privacy ledger and the checkpoint, which records the
newest record's sequence number, are written as before. Once the checkpoint is durable,
:meth:`SeriesFile.commit` makes the new length the committed one. When the file holds many
more records than the series has rows (more than ``2 rows + 256``), :meth:`SeriesFile.compact`
rewrites it (temporary file, ``fsync``, rename, ``fsync`` of the directory) with one record
per row for everything the *previous* generation committed, and the newest generation's
records after them as they were: a start that falls back to the previous generation cuts
them off again.

Recovery (:func:`recover_series`)
---------------------------------
After the checkpoint is chosen, the file's records up to the checkpoint's sequence number
are replayed into an empty series and everything after them is cut off (written after that
checkpoint: its batches come back by redelivery). A damaged record before that point, a file
that ends before it, a missing file while the checkpoint says records were written, or a
file of another deployment or spec: the start is refused with one line naming the file, the
offset and what to do. ``--new-series`` then keeps the file as ``<checkpoint>.series.old``
and starts the series anew (the cumulative estimates are unaffected: they are in the
checkpoint). A checkpoint without a series (older than the field, or run without a round
length) starts an empty series, and a file found beside it is kept as ``.series.old``.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from pathlib import Path

from aggregator.durable import DiskWriteError, write_atomically
from aggregator.series.core import Delta, Series
from aggregator.series.segment import (
    Header,
    SegmentError,
    committed_prefix,
    compacted,
    decode_header,
    decode_record,
    encode_header,
    encode_record,
)
from aggregator.service.core.checkpoint import Checkpoint
from edge.errors import CocoError

__all__ = [
    "OLD_SUFFIX",
    "SERIES_SUFFIX",
    "SeriesFile",
    "SeriesFileError",
    "SeriesWrite",
    "load_series",
    "recover_series",
    "series_path_for",
]

SERIES_SUFFIX = ".series"
OLD_SUFFIX = ".old"
COMPACT_SLACK = 256
"""Records beyond twice the rows that a file holds before it is compacted."""


class SeriesFileError(CocoError):
    """A series file that does not hold what the checkpoint says it does (one line)."""


def series_path_for(checkpoint: Path) -> Path:
    """``<checkpoint>.series``."""
    return checkpoint.with_name(checkpoint.name + SERIES_SUFFIX)


def old_path(path: Path) -> Path:
    """``<checkpoint>.series.old``: a series file set aside to start anew."""
    return path.with_name(path.name + OLD_SUFFIX)


@dataclass(frozen=True)
class SeriesWrite:
    """What one checkpoint generation appends, taken on the event loop with its content."""

    deltas: tuple[Delta, ...]
    seq: int
    rows: int
    """Rows of the series (the compaction's measure)."""
    rolled_before: float
    step: int | None
    dropped_before: float
    """Coarse rows that ended at or before this are gone from memory."""


@dataclass
class SeriesFile:
    """The writer's side of one series file; used by one thread at a time (the
    checkpoint's, under the generations' lock)."""

    path: Path
    header: Header
    length: int
    """The committed length: the header and the records of the newest durable checkpoint."""
    records: int
    """Records in the committed length."""
    committed_seqs: list[int] = field(default_factory=list)
    """The sequence numbers of the last two durable checkpoints of this run."""
    _pending: tuple[int, int, int] | None = None
    """(length, records, seq) after the last append, until its checkpoint is durable."""

    def append(self, write: SeriesWrite, *, sync: bool = True) -> None:
        """Cut the file to its committed length, append ``write``'s records, ``fsync``
        (``sync=False``: the caller ``fsync`` s the file, with the checkpoint's others):
        :class:`~aggregator.durable.DiskWriteError` (one line) when it cannot."""
        data = b"".join(encode_record(delta) for delta in write.deltas)
        try:
            if not self.path.exists():  # a first write, or a file moved away meanwhile
                write_atomically(self.path, encode_header(self.header))
            with open(self.path, "r+b") as fh:
                fh.truncate(self.length)
                fh.seek(self.length)
                fh.write(data)
                fh.flush()
                if sync:
                    os.fsync(fh.fileno())
        except OSError as exc:
            if isinstance(exc, DiskWriteError):
                raise
            raise DiskWriteError(exc.errno, exc.strerror, str(self.path)) from exc
        self._pending = (self.length + len(data), self.records + len(write.deltas), write.seq)

    def commit(self) -> None:
        """The checkpoint after the last :meth:`append` is durable."""
        if self._pending is None:
            return
        self.length, self.records, seq = self._pending
        self._pending = None
        self.committed_seqs = [*self.committed_seqs, seq][-2:]

    def abandon(self) -> None:
        """The checkpoint after the last :meth:`append` failed: its records stay pending
        (the next append cuts them off and writes them again)."""
        self._pending = None

    def due(self, rows: int) -> bool:
        """Whether the file holds enough more records than rows to be compacted, and two
        generations were committed (what the previous one holds can be merged)."""
        return len(self.committed_seqs) == 2 and self.records > 2 * rows + COMPACT_SLACK

    def compact(self, write: SeriesWrite) -> None:
        """Rewrite the file: the records the previous generation committed merged, one per
        row (rounds past the retention rolled into their steps), then the newest
        generation's as they are (module docs)."""
        base = self.committed_seqs[0]
        with open(self.path, "rb") as fh:
            data = fh.read(self.length)
        header, offset = decode_header(data)
        older: list[Delta] = []
        newer: list[Delta] = []
        while offset < len(data):
            delta, offset = decode_record(data, offset, header.d)
            (older if delta.seq <= base else newer).append(delta)
        merged = compacted(
            older,
            rolled_before=write.rolled_before,
            step=write.step,
            dropped_before=write.dropped_before,
        )
        new_header = Header(
            header.deployment, header.fingerprint, header.d, max(base, header.base_seq), len(merged)
        )
        body = b"".join([encode_header(new_header), *(encode_record(d) for d in merged + newer)])
        write_atomically(self.path, body)
        self.header = new_header
        self.length = len(body)
        self.records = len(merged) + len(newer)


def _refusal(path: Path, checkpoint: Checkpoint, problem: str) -> SeriesFileError:
    return SeriesFileError(
        f"series file {path} {problem}; the checkpoint {checkpoint.path} (generation "
        f"{checkpoint.generation}) records series sequence {checkpoint.series_seq}: start with "
        f"--new-series to keep the file as {old_path(path).name} and start the per-round "
        "series anew (the cumulative estimates are unaffected)"
    )


@dataclass(frozen=True)
class Recovered:
    """What :func:`recover_series` did: the file to write on, and what to log (lines)."""

    file: SeriesFile
    notes: tuple[str, ...] = ()


def _set_aside(path: Path, why: str) -> str:
    os.replace(path, old_path(path))
    return f"series file {path} {why}: kept as {old_path(path).name}; the series starts anew"


def recover_series(
    checkpoint_path: Path,
    checkpoint: Checkpoint | None,
    series: Series,
    *,
    deployment: str,
    anew: bool = False,
) -> Recovered:
    """Replay into ``series`` (empty) the records of the series file beside
    ``checkpoint_path`` that ``checkpoint`` committed, cut off the rest (module docs,
    *Recovery*), and return the file to write on; :class:`SeriesFileError` (one line) when
    the file does not hold them. ``anew``: set the file aside and start empty."""
    path = series_path_for(checkpoint_path)
    spec = series.spec
    upto = None if checkpoint is None else checkpoint.series_seq
    notes: list[str] = []
    if anew or upto is None:
        if path.exists():
            why = "set aside (--new-series)" if anew else "has no checkpoint recording it"
            notes.append(_set_aside(path, why))
        base = upto or 0
        series.seq = base
        header = Header(deployment, spec.fingerprint, spec.d, base)
        write_atomically(path, encode_header(header))
        return Recovered(SeriesFile(path, header, len(encode_header(header)), 0), tuple(notes))
    assert checkpoint is not None
    expect = Header(deployment, spec.fingerprint, spec.d)
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        if upto > 0:
            raise _refusal(path, checkpoint, "is missing") from None
        data = b""
    except OSError as exc:
        raise SeriesFileError(f"cannot read series file {path}: {exc.strerror}") from None
    if upto == 0 and (not data or _torn_or_damaged_header(data)):
        # nothing committed yet: a header cut short by a crash is rewritten
        write_atomically(path, encode_header(expect))
        return Recovered(SeriesFile(path, expect, len(encode_header(expect)), 0))
    try:
        found = committed_prefix(data, expect=expect, upto=upto)
    except SegmentError as exc:
        raise _refusal(path, checkpoint, f"is not usable: {exc}") from None
    series.replay(found.deltas)
    series.seq = max(series.seq, upto)
    if found.dropped:
        with open(path, "r+b") as fh:
            fh.truncate(found.keep)
            os.fsync(fh.fileno())
        notes.append(
            f"series file {path}: cut {found.dropped} bytes written after checkpoint "
            f"generation {checkpoint.generation} (sequence {upto}); the broker redelivers "
            "their batches"
        )
    file = SeriesFile(path, found.header, found.keep, len(found.deltas))
    return Recovered(file, tuple(notes))


def _torn_or_damaged_header(data: bytes) -> bool:
    try:
        decode_header(data)
    except SegmentError as exc:
        return exc.torn or "checksum" in exc.problem
    return False


def load_series(
    checkpoint_path: Path,
    *,
    round_seconds: int | None = None,
    retention: float = math.inf,
    step: int | None = 3600,
    coarse_retention: float = 0.0,
) -> Series:
    """The series a service would resume from the checkpoint at ``checkpoint_path`` (its
    newest good generation) and the series file beside it, read only (nothing cut, moved or
    written): ``coco aggregator series --checkpoint``. ``round_seconds`` only labels the
    result (default: the newest round row's length). :class:`SeriesFileError` or
    :class:`~aggregator.service.core.checkpoint.CheckpointError` (one line)."""
    from aggregator.service.checkpoint_files import recover_checkpoint  # noqa: PLC0415

    checkpoint = recover_checkpoint(checkpoint_path, move_damaged=False).checkpoint
    path = series_path_for(checkpoint_path)
    if checkpoint is None:
        raise SeriesFileError(f"no checkpoint at {checkpoint_path}")
    if checkpoint.series_seq is None:
        raise SeriesFileError(f"checkpoint {checkpoint.path} records no series")
    spec = checkpoint.state.spec
    deployment = checkpoint.deployment or ""
    try:
        data = path.read_bytes()
    except OSError as exc:
        if checkpoint.series_seq == 0:
            data = b""
        else:
            raise SeriesFileError(f"cannot read series file {path}: {exc.strerror}") from None
    deltas: list[Delta] = []
    if data:
        try:
            deltas = committed_prefix(
                data,
                expect=Header(deployment, spec.fingerprint, spec.d),
                upto=checkpoint.series_seq,
            ).deltas
        except SegmentError as exc:
            raise _refusal(path, checkpoint, f"is not usable: {exc}") from None
    length = round_seconds or next((d.end - d.start for d in reversed(deltas) if not d.coarse), 1)
    series = Series(
        spec,
        round_seconds=length,
        retention=retention,
        step=step,
        coarse_retention=coarse_retention,
    )
    series.replay(deltas)
    return series
