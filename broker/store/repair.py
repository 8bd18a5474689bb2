"""``coco shuffler repair``: salvage a damaged shuffler log.

The shuffler refuses to start on a log damaged before its acknowledged end
(:class:`broker.store.LogDamagedError`), because reading on would silently lose acknowledged
reports or apply garbage. The repair keeps what can be trusted and says what could not be:

1. it locks the state directory (a running shuffler is never repaired under its feet) and
   copies the damaged log to ``effects.log.damaged-<unix time>``;
2. it finds the log's salt (its header's; a damaged header's from the first intact record,
   :func:`broker.store.records.find_salt`), reads every intact record, before each damaged
   stretch and after it (each record carries a marker and its own checksums, so reading
   resumes at the next valid record), and skips each damaged stretch;
3. it counts what it dropped against the acknowledged end (``effects.mark``): the records
   and the reports (in pools, and in released batches) of the acknowledged part that it
   could not keep, exactly, whatever the damage hid, since the mark counts them. Without a
   mark that matches the log (a version-2 log, a mark lost or damaged) nothing says how
   many records a cut took from the end, so every count is ``"unknown"``, never 0 (each
   damaged stretch still lists the kinds of the records whose heads survived);
4. it tells which acknowledged reports are lost for good (``reports_lost``: in a dropped
   ``admitted`` or ``pooled`` record, and released by no salvaged batch after it), where
   every dropped record is known by its head, else ``"unknown"``; and it flags a release
   whose record was lost (an acknowledgement of a batch it never saw);
5. it replays the salvaged records and writes their snapshot as the new log, with its mark.

The report is one JSON document (``coco shuffler repair`` prints it), the same numbers as
the log lines at WARNING.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path

from broker.core.effects import (
    Acked,
    Carried,
    Configured,
    Dropped,
    Effect,
    Outboxed,
    Pooled,
    Released,
    batch_count_of,
    batch_id_of,
    is_manifest,
)
from broker.core.machine import CoreConfig, ShufflerCore
from broker.store.logv1 import V1Error, decode_v1
from broker.store.mark import End, held
from broker.store.reading import StoreError, looks_like_v1, read_mark
from broker.store.records import (
    ADMITTED,
    CARRIED,
    CONFIGURED,
    DROPPED,
    FILE_HEADER_SIZE,
    HEAD_SIZE,
    OUTBOXED,
    POOLED,
    RELEASED,
    TYPE_NAMES,
    find_salt,
    head_at,
    header_of,
    scan,
)
from broker.store.wal import EffectLog, StateDir

__all__ = ["UNKNOWN", "RepairReport", "repair"]

logger = logging.getLogger("broker.repair")  # a fixed name: broker/__init__.py, "Loggers"
UNKNOWN = "unknown"
Count = int | str  # a count, or UNKNOWN
_BATCH_HEADER = 30  # edge.codec's batch header, up to its record count
_MOVES = (RELEASED, DROPPED, CARRIED, CONFIGURED, OUTBOXED)  # kinds that move pooled reports


@dataclass
class RepairReport:
    """What a repair kept and dropped (counts are exact, or ``"unknown"``)."""

    log: str
    copy: str | None = None
    acknowledged_end: str = "checked"
    """``checked``: counted against the log's mark; else why the end cannot be trusted."""
    records_kept: int = 0
    damaged_stretches: list[dict[str, object]] = field(default_factory=list)
    bytes_dropped: int = 0
    records_dropped: Count = 0
    """Acknowledged records not kept."""
    reports_dropped: Count = 0
    """Acknowledged reports in the dropped ``admitted``/``pooled`` records."""
    released_reports_dropped: Count = 0
    """Reports in the batches of dropped ``released``/``outboxed`` records: their pool may
    be released a second time, or an unacknowledged batch not sent again."""
    reports_lost: Count = 0
    """Of ``reports_dropped``, those no salvaged batch released afterwards and whose pool
    nothing later released or dropped: acknowledged reports that will never be released."""
    lost_releases: int = 0
    """Acknowledgements of batches whose release record was lost: each such pool may be
    released twice (check the aggregator's duplicates and ``coco_shuffler`` metrics)."""
    unacknowledged_bytes_dropped: int = 0
    """Bytes after the acknowledged end that did not read (a torn last write)."""
    pooled_after: int = 0
    outbox_after: int = 0

    def as_dict(self) -> dict[str, object]:
        return asdict(self)


@dataclass
class _Dropped:
    """A damaged record known by its intact head."""

    offset: int
    kind: int
    length: int


def _walk(data: bytes, start: int, stop: int, salt: int) -> list[_Dropped] | None:
    """The records of a damaged stretch ``[start, stop)`` by their heads, if every head in
    it survived and they tile it exactly (a last record cut by the file's end included)."""
    found: list[_Dropped] = []
    offset = start
    while offset < stop:
        head = head_at(data, offset, salt)
        if head is None:
            return None
        found.append(_Dropped(offset, *head))
        offset += HEAD_SIZE + head[1] + 4
    return found if offset == stop or (offset > stop == len(data)) else None


def _body(data: bytes, record: _Dropped) -> bytes:
    return data[record.offset + HEAD_SIZE : record.offset + HEAD_SIZE + record.length]


def _pairs(data: bytes, record: _Dropped) -> list[tuple[int, int]] | None:
    """``(seed, z)`` of a dropped ``admitted``/``pooled`` record's reports, from its body
    as it is (``None`` if its size does not add up), and its round."""
    body = _body(data, record)
    head = 8 if record.kind == ADMITTED else 12
    n = (record.length - head) // 14
    if len(body) != record.length or head + 14 * n != record.length:
        return None
    seeds, zs = body[head + 8 * n : head + 12 * n], body[head + 12 * n :]
    return [
        (
            int.from_bytes(seeds[4 * i : 4 * i + 4], "little"),
            int.from_bytes(zs[2 * i : 2 * i + 2], "little"),
        )
        for i in range(n)
    ]


def _batch_pairs(effect: Effect) -> Counter[tuple[int, int]]:
    """``(seed, z)`` of every report in a released or outboxed record's batches."""
    out: Counter[tuple[int, int]] = Counter()
    if isinstance(effect, Released | Outboxed):
        for message in effect.messages:
            if len(message) < _BATCH_HEADER or is_manifest(message):
                continue
            count = batch_count_of(message)  # records follow the header; the seal follows them
            records = message[_BATCH_HEADER : _BATCH_HEADER + 6 * count]
            for i in range(0, len(records) - 5, 6):
                seed = int.from_bytes(records[i : i + 4], "big")
                out[seed, int.from_bytes(records[i + 4 : i + 6], "big")] += 1
    return out


def _round_of(effect: Effect) -> int | None:
    return getattr(effect, "round", None)


def _fate(later: list[Effect], round_: int) -> str:
    """What the salvaged effects after a dropped record do to ``round_``'s pool:
    ``released``, ``dropped``, ``pooled`` (nothing: still waiting at the end) or
    ``unknown`` (renumbered, or rebuilt by a snapshot)."""
    for effect in later:
        if isinstance(effect, Carried) and effect.source == round_:
            round_ = effect.target
        elif isinstance(effect, Released) and effect.round == round_:
            return "released"
        elif isinstance(effect, Dropped) and effect.round == round_:
            return "dropped"
        elif isinstance(effect, Configured) or (
            isinstance(effect, Pooled) and effect.round == round_
        ):
            return "unknown"
    return "pooled"


class _Salvage:
    """Every intact record of a version-2/-3 log, and each damaged stretch."""

    def __init__(self, data: bytes, salt: int) -> None:
        self.kept: list[tuple[int, Effect]] = []
        self.stretches: list[tuple[int, int, str]] = []  # start, stop, reason
        offset = FILE_HEADER_SIZE
        while offset < len(data):
            result = scan(data, offset, salt)
            self.kept += zip(result.starts, result.effects, strict=True)
            problem = result.problem
            if problem is None:
                break
            stop = problem.next_good if problem.next_good is not None else len(data)
            self.stretches.append((problem.offset, stop, problem.reason))
            offset = stop


def _lost(data: bytes, salvage: _Salvage, dropped: list[_Dropped]) -> Count:
    """``reports_lost`` (the module docstring's step 4), given every dropped record."""
    known_rounds = {r for _, e in salvage.kept if (r := _round_of(e)) is not None}
    lost = 0
    for record in dropped:
        if record.kind not in (ADMITTED, POOLED):
            continue
        pairs = _pairs(data, record)
        body = _body(data, record)
        if pairs is None or len(body) < 4:
            return UNKNOWN
        later = [e for offset, e in salvage.kept if offset > record.offset]
        released: Counter[tuple[int, int]] = Counter()
        for effect in later:
            released += _batch_pairs(effect)
        if not Counter(pairs) - released:
            continue  # a salvaged batch released every one of them
        round_ = int.from_bytes(body[:4], "little")
        fate = _fate(later, round_) if round_ in known_rounds else "unknown"
        if fate == "dropped":
            continue  # dropped (and counted) with their pool, damage or not
        if fate != "pooled":
            return UNKNOWN  # (a damaged round or seed, or a pool renumbered since)
        if any(d.kind in _MOVES and d.offset > record.offset for d in dropped):
            return UNKNOWN  # a dropped record after it may have released them
        lost += len(pairs)
    return lost


def _count(data: bytes, salt: int, end: End | None, report: RepairReport) -> list[Effect]:
    """Salvage ``data`` and fill in ``report``'s counts (module docstring, steps 2-4)."""
    salvage = _Salvage(data, salt)
    limit = end.length if end is not None else len(data)
    walks: list[list[_Dropped] | None] = []
    for start, stop, reason in salvage.stretches:
        walk = _walk(data, start, stop, salt)
        stretch: dict[str, object] = {
            "offset": start,
            "bytes": stop - start,
            "reason": reason,
            "acknowledged": start < limit,
        }
        if walk is not None:
            stretch["records"] = [TYPE_NAMES.get(d.kind, f"type-{d.kind}") for d in walk]
        report.damaged_stretches.append(stretch)
        if start < limit:
            report.bytes_dropped += min(stop, limit) - start
            walks.append(walk)
        report.unacknowledged_bytes_dropped += max(0, stop - max(start, limit))
    if end is not None and len(data) < end.length:
        missing = end.length - len(data)
        report.damaged_stretches.append(
            {"offset": len(data), "bytes": missing, "reason": "cut", "acknowledged": True}
        )
        report.bytes_dropped += missing
        walks.append(None)  # the records past the cut are gone, heads and all
    below = [e for offset, e in salvage.kept if offset < limit]
    report.records_kept = len(salvage.kept)
    dropped = [d for walk in walks if walk is not None for d in walk if d.offset < limit]
    identified = all(walk is not None for walk in walks)
    if end is not None:
        kept_reports = sum(held(e)[0] for e in below)
        kept_released = sum(held(e)[1] for e in below)
        report.records_dropped = end.records - len(below)
        report.reports_dropped = end.reports - kept_reports
        report.released_reports_dropped = end.released - kept_released
        identified = identified and len(dropped) == report.records_dropped
    else:
        report.records_dropped = report.reports_dropped = UNKNOWN
        report.released_reports_dropped = UNKNOWN
        identified = False
    if report.reports_dropped == 0:
        report.reports_lost = 0
    elif not identified:
        report.reports_lost = UNKNOWN
    else:
        report.reports_lost = _lost(data, salvage, dropped)
    return [e for _, e in salvage.kept]


def _no_log(state_dir: Path) -> StoreError:
    return StoreError(
        f"{state_dir} holds no shuffler log (effects.log): not a shuffler state directory; "
        "nothing to repair"
    )


def _salvage_file(
    data: bytes, path: Path, config: CoreConfig, report: RepairReport
) -> list[Effect]:
    """The salvaged effects of the log's bytes (any version), with ``report`` filled in."""
    ends: tuple[End, ...] | None = None
    try:
        ends = read_mark(path)
    except StoreError:
        report.acknowledged_end = "unknown: effects.mark is damaged"
    else:
        if ends is None:
            report.acknowledged_end = "unknown: no effects.mark"
    header = header_of(data)
    if header is None and ends is None and looks_like_v1(data):
        try:  # version 1: what reads before the damage
            effects, whole = decode_v1(data, config.round_seconds, name=str(path))
        except V1Error:
            effects, whole = [], 0
        report.acknowledged_end = "unknown: a version-1 log"
        report.records_kept = len(effects)
        report.bytes_dropped = len(data) - whole
        report.records_dropped = UNKNOWN if whole < len(data) else 0
        report.reports_dropped = report.records_dropped
        report.released_reports_dropped = report.records_dropped
        report.reports_lost = report.records_dropped
        return effects
    if header is not None:
        version, salt = header
    else:
        version, found = 3, find_salt(data)
        if found is None:  # not one intact record: nothing to keep
            report.bytes_dropped = len(data)
            report.records_dropped = report.reports_dropped = UNKNOWN
            report.released_reports_dropped = report.reports_lost = UNKNOWN
            counts = {(e.records, e.reports, e.released) for e in ends or ()}
            if len(counts) == 1:  # whichever file it was, every record it held is gone
                ((records, reports, released),) = counts
                report.records_dropped, report.reports_dropped = records, reports
                report.released_reports_dropped = released
                report.reports_lost = 0 if reports == 0 else UNKNOWN
            return []
        salt = found
    end = None
    if version == 2:
        report.acknowledged_end = "unknown: a version-2 log"
    elif ends is not None:
        end = next((e for e in ends if e.salt == salt), None)
        if end is None:
            report.acknowledged_end = "unknown: effects.mark describes another log file"
    return _count(data, salt, end, report)


def repair(state_dir: Path, config: CoreConfig) -> RepairReport:
    """Salvage ``state_dir``'s log in place (module docstring).

    A directory that does not exist or holds no log is refused before anything is created
    in it (a mistyped ``--state-dir`` must not gain a lock file and a clean report)."""
    if not state_dir.is_dir():
        raise StoreError(f"{state_dir} is not a directory: not a shuffler state directory")
    if not (state_dir / "effects.log").is_file():
        raise _no_log(state_dir)
    with StateDir(state_dir) as state:
        path = state.path / "effects.log"
        report = RepairReport(log=str(path))
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            raise _no_log(state_dir) from None
        copy = path.with_name(f"effects.log.damaged-{int(time.time())}")
        shutil.copy2(path, copy)
        os.chmod(copy, 0o600)
        report.copy = str(copy)
        effects = _salvage_file(data, path, config, report)
        core = ShufflerCore(config)
        known: set[bytes] = set()  # batch ids released or outboxed in the salvaged records
        for effect in effects:
            if isinstance(effect, Released | Outboxed):
                known.update(batch_id_of(m) for m in effect.messages)
            if isinstance(effect, Acked) and effect.batch_id not in known:
                report.lost_releases += 1
            core.apply(effect)
        with contextlib.suppress(FileNotFoundError):  # the new log gets a new mark
            (state.path / "effects.mark").unlink()
        log = EffectLog(path, round_seconds=config.round_seconds)
        log.version = 1  # whatever the file holds: replace it
        log.compact(core.snapshot())
        log.close()
        report.pooled_after = core.buffered
        report.outbox_after = core.outbox_reports
    for stretch in report.damaged_stretches:
        logger.warning("shuffler log %s: dropped %s", path, stretch)
    return report
