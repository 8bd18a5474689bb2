"""Reading the shuffler log back: what is trusted, what is a torn last write, what is damage.

:func:`read_log` reads the log at start (:meth:`broker.store.wal.EffectLog.recover`)
against its acknowledged end (:mod:`broker.store.mark`); :mod:`broker.store.wal`'s
docstring says why its classification is right.

Memory: the log is mapped (``mmap``), not read into the heap, and checked whole before
anything is replayed, keeping no effect; :class:`LogRecords` then decodes one record at a
time as the replay asks for it. So a restart holds the core's state, the mapped file and
one record, never every record's effect beside the state being built from them: a
recovered shuffler keeps about what the live one holds resident (1.1-1.2 times, against
2.4 when the whole log and its decoded effects sat in the heap: ``bench_shuffler_state.py``,
case ``recover``). The mapping is only read below the end of the records found valid; the
file is cut (a torn tail) only after that end, and no other process writes it (the state
directory is locked).
"""

from __future__ import annotations

import logging
import mmap
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from broker.core.effects import Effect
from broker.store.logv1 import V1Error, decode_v1
from broker.store.mark import End, decode_mark
from broker.store.records import (
    FILE_HEADER_SIZE,
    MAGIC,
    MARKER,
    TYPE_NAMES,
    Problem,
    effect_at,
    header_of,
    scan,
)
from edge.errors import CocoError

__all__ = [
    "LogDamagedError",
    "LogRecords",
    "Recovered",
    "StoreError",
    "looks_like_v1",
    "mark_path",
    "read_log",
    "read_mark",
]

logger = logging.getLogger("broker.store")  # a fixed name: broker/__init__.py, "Loggers"


class StoreError(CocoError):
    """The state directory or its log cannot be used (the message names the file)."""


class LogDamagedError(StoreError):
    """The log is damaged before its end, or cut below its acknowledged end (not a torn
    tail): refuse, repair."""

    def __init__(self, path: Path, problem: Problem, acknowledged: int | None = None) -> None:
        kind = "" if problem.kind is None else f" ({TYPE_NAMES.get(problem.kind, '?')} record)"
        if problem.next_good is not None:
            after = f"and intact records follow at offset {problem.next_good}"
        else:
            after = f"below its acknowledged end {acknowledged} ({path.with_suffix('.mark').name})"
        super().__init__(
            f"shuffler log {path} is damaged at offset {problem.offset}{kind}: "
            f"{problem.reason}, {after}; "
            f"refusing to start (run: coco shuffler repair --state-dir {path.parent})"
        )
        self.problem = problem
        self.acknowledged = acknowledged


def looks_like_v1(data: bytes | mmap.mmap) -> bool:
    """Whether ``data`` (no valid version-2 header) is a version-1 log: it starts with a
    record type 1-9. Anything that resembles a version-2 header (most of its magic, or a
    record marker where the first record starts) is a damaged one, never read as a
    version-1 log (which would find nothing in it and truncate it)."""
    resembles = sum(a == b for a, b in zip(data[: len(MAGIC)], MAGIC, strict=False)) >= 4
    marker = data[FILE_HEADER_SIZE : FILE_HEADER_SIZE + len(MARKER)] == MARKER
    return not resembles and not marker and len(data) >= 5 and 1 <= data[0] <= 9


def mark_path(log: Path) -> Path:
    """The acknowledged end of ``log`` (:mod:`broker.store.mark`): ``effects.mark``."""
    return log.with_suffix(".mark")


def read_mark(log: Path) -> tuple[End, ...] | None:
    """The entries of ``log``'s mark (``None``: there is none); :class:`StoreError` if it
    is damaged."""
    path = mark_path(log)
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise StoreError(f"cannot read {path}: {exc}") from exc
    ends = decode_mark(data)
    if ends is None:
        raise StoreError(
            f"{path} is damaged: the end of the shuffler log {log.name} cannot be trusted; "
            f"refusing to start (run: coco shuffler repair --state-dir {log.parent})"
        )
    return ends


@dataclass(frozen=True)
class LogRecords:
    """The effects of the records at ``starts`` of ``data`` (a log a :func:`scan` found
    valid there), decoded one at a time as they are iterated: a replay holds one record's
    effect at a time, not the whole log's. Iterable more than once."""

    data: bytes | mmap.mmap
    salt: int
    starts: tuple[int, ...]

    def __len__(self) -> int:
        return len(self.starts)

    def __iter__(self) -> Iterator[Effect]:
        view = memoryview(self.data)
        try:
            for start in self.starts:
                yield effect_at(view, start, self.salt)
        finally:
            view.release()


@dataclass
class Recovered:
    """What :func:`read_log` read: ``effects`` of the first ``whole`` bytes (the rest is a
    torn, never acknowledged last write), ``end`` their counts, ``version`` (1, 2 or 3;
    0: an empty log)."""

    effects: list[Effect] | LogRecords
    whole: int
    size: int
    version: int
    end: End


def _refuse(path: Path, what: str) -> StoreError:
    return StoreError(
        f"shuffler log {path}: {what}; refusing to start "
        f"(run: coco shuffler repair --state-dir {path.parent})"
    )


def read_log(path: Path, round_seconds: int) -> Recovered:
    """The effects of the log at ``path`` (module docstring, "What a torn write can look
    like"): :class:`LogDamagedError` or :class:`StoreError` for damage; a torn last write
    is left out of ``whole``."""
    ends = read_mark(path)
    try:
        data = _mapped(path)
    except OSError as exc:
        raise StoreError(f"cannot read the shuffler log {path}: {exc}") from exc
    header = header_of(data)
    if header is None:
        return _read_headerless(path, data, ends, round_seconds)
    version, salt = header
    if version == 2:  # no acknowledged end: a problem with nothing valid after it is torn
        result = scan(data, FILE_HEADER_SIZE, salt, keep=False)
        if result.problem is not None and result.problem.next_good is not None:
            raise LogDamagedError(path, result.problem)
        records = LogRecords(data, salt, tuple(result.starts))
        return Recovered(records, result.end, len(data), 2, End(salt))
    if ends is None:
        raise _refuse(path, f"its acknowledged end ({mark_path(path).name}) is missing")
    end = next((e for e in ends if e.salt == salt), None)
    if end is None:
        raise _refuse(path, f"not the log its {mark_path(path).name} describes (another salt)")
    return _read_v3(path, data, end)


def _mapped(path: Path) -> bytes | mmap.mmap:
    """The log's bytes, mapped read-only (its pages are the page cache's, given back when
    the last reference goes); ``b""`` for a missing or empty file."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    except FileNotFoundError:
        return b""
    try:
        if os.fstat(fd).st_size == 0:
            return b""
        return mmap.mmap(fd, 0, access=mmap.ACCESS_READ)
    finally:
        os.close(fd)


def _read_headerless(
    path: Path, data: bytes | mmap.mmap, ends: tuple[End, ...] | None, round_seconds: int
) -> Recovered:
    """A log without a valid header: version 1 (with a mark only if a crash interrupted
    its upgrade, before the rename), empty or cut in its header (nothing acknowledged), or
    damaged."""
    if not looks_like_v1(data):
        if ends is not None and any(e.records for e in ends):
            if len(data) < FILE_HEADER_SIZE:
                held = f"{ends[0].records} records acknowledged"
                size = f"{len(data)} bytes" if data else "empty or missing"
                raise _refuse(path, f"cut in its file header ({size}), but {held}")
            raise _refuse(path, "damaged file header")
        if len(data) < FILE_HEADER_SIZE and MAGIC.startswith(data[: len(MAGIC)]):
            return Recovered([], 0, len(data), 0, End(0))  # nothing was ever written
        raise _refuse(path, "damaged file header")
    try:
        effects, whole = decode_v1(bytes(data), round_seconds, name=str(path))
    except V1Error as exc:
        raise StoreError(
            f"{exc}: neither a readable version-1 log nor a version-2 one; refusing to "
            f"start (run: coco shuffler repair --state-dir {path.parent})"
        ) from None
    logger.info("shuffler log %s: version 1, read and rewritten as version 3", path)
    return Recovered(effects, whole, len(data), 1, End(0))


def _read_v3(path: Path, data: bytes | mmap.mmap, end: End) -> Recovered:
    """A version-3 log against its acknowledged ``end``: every byte before it must read
    (else damage, named), only what follows it may be torn."""
    acknowledged = max(end.length, FILE_HEADER_SIZE)
    head = scan(data, FILE_HEADER_SIZE, end.salt, stop=acknowledged, keep=False)
    if head.problem is not None:
        raise LogDamagedError(path, head.problem, end.length)
    if head.end < acknowledged and end.length:
        cut = Problem(head.end, f"the file ends there, {end.length - head.end} bytes short", None)
        raise LogDamagedError(path, cut, end.length)
    if (head.end != acknowledged and end.length) or head.records != end.records:
        what = f"{head.records} records end at offset {head.end}"
        raise _refuse(path, f"{what}; acknowledged: {end.records} records, {end.length} bytes")
    # the last write, never acknowledged: torn if any
    tail = scan(data, head.end, end.salt, keep=False)
    records = LogRecords(data, end.salt, (*head.starts, *tail.starts))
    reports, released = head.reports + tail.reports, head.released + tail.released
    counted = End(end.salt, tail.end, len(records), reports, released)
    return Recovered(records, tail.end, len(data), 3, counted)
