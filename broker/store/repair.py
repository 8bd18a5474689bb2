"""``coco shuffler repair``: salvage a damaged shuffler log.

The shuffler refuses to start on a log damaged before its end (:class:`broker.store.
LogDamagedError`), because reading on would silently lose acknowledged reports or apply
garbage. The repair keeps what can be trusted and says what could not be:

1. it locks the state directory (a running shuffler is never repaired under its feet) and
   copies the damaged log to ``effects.log.damaged-<unix time>``;
2. it reads every intact record, before the damage and after it (each record carries a
   marker and its own checksums, so reading resumes at the next valid record), and skips
   each damaged stretch, counting its records (where their heads are intact) and bytes;
3. it tells, where the framing allows, which reports were lost: the reports of a damaged
   ``admitted`` or ``pooled`` record whose head survived; and it flags a release whose
   record was lost (an acknowledgement of a batch it never saw), since that pool may then
   be released again;
4. it replays the salvaged records and writes their snapshot as the new log.

The report is one JSON document (``coco shuffler repair`` prints it), the same numbers as
the log lines at WARNING.
"""

from __future__ import annotations

import logging
import os
import shutil
import struct
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path

from broker.core.effects import Acked, Effect, Outboxed, Released, batch_id_of, is_manifest
from broker.core.machine import CoreConfig, ShufflerCore
from broker.store.logv1 import V1Error, decode_v1
from broker.store.records import (
    ADMITTED,
    FILE_HEADER_SIZE,
    HEAD_SIZE,
    POOLED,
    TYPE_NAMES,
    read_header,
    scan,
)
from broker.store.wal import EffectLog, StateDir, StoreError, looks_like_v1

__all__ = ["RepairReport", "repair"]

logger = logging.getLogger("broker.repair")  # a fixed name: broker/__init__.py, "Loggers"
_U32 = struct.Struct("<I")


@dataclass
class RepairReport:
    """What a repair kept and dropped."""

    log: str
    copy: str | None = None
    records_kept: int = 0
    damaged_stretches: list[dict[str, object]] = field(default_factory=list)
    bytes_dropped: int = 0
    records_dropped: int | None = 0
    """Records known lost (``None``: a damaged head hid how many)."""
    reports_in_damaged_records: int = 0
    """Reports in damaged records whose head told their kind and size."""
    reports_lost: int = 0
    """Of those, the ones no salvaged batch released afterwards (matched by seed and z,
    read from the damaged body as it is): acknowledged reports that will never be
    released. An upper bound: a flipped bit in a seed or z hides its match."""
    lost_releases: int = 0
    """Acknowledgements of batches whose release record was lost: each such pool may be
    released twice (check the aggregator's duplicates and ``coco_shuffler`` metrics)."""
    pooled_after: int = 0
    outbox_after: int = 0

    def as_dict(self) -> dict[str, object]:
        return asdict(self)


def _guess_salt(data: bytes) -> int | None:
    """The salt of a damaged header: the stored one, or one bit away from it, whichever
    makes the first record's checksums hold."""
    if len(data) < FILE_HEADER_SIZE:
        return None
    stored = int(_U32.unpack_from(data, 12)[0])
    for salt in (stored, *(stored ^ (1 << bit) for bit in range(32))):
        result = scan(data[: FILE_HEADER_SIZE + (1 << 20)], FILE_HEADER_SIZE, salt)
        if result.records:
            return salt
    return None


def _reports_in(kind: int | None, length: int | None) -> int:
    if kind == ADMITTED and length is not None and length >= 8:
        return (length - 8) // 14
    if kind == POOLED and length is not None and length >= 12:
        return (length - 12) // 14
    return 0


def _damaged_reports(
    data: bytes, offset: int, kind: int | None, length: int | None
) -> list[tuple[int, int]]:
    """``(seed, z)`` of the reports a damaged ``admitted``/``pooled`` record held, read
    from its body as it is (best effort: empty when its size does not add up)."""
    if length is None or kind not in (ADMITTED, POOLED):
        return []
    body = data[offset + HEAD_SIZE : offset + HEAD_SIZE + length]
    head = 8 if kind == ADMITTED else 12
    n = (length - head) // 14
    if len(body) != length or head + 14 * n != length:
        return []
    seeds = body[head + 8 * n : head + 12 * n]
    zs = body[head + 12 * n :]
    return [
        (
            int.from_bytes(seeds[4 * i : 4 * i + 4], "little"),
            int.from_bytes(zs[2 * i : 2 * i + 2], "little"),
        )
        for i in range(n)
    ]


def _released(effects: list[Effect]) -> Counter[tuple[int, int]]:
    """``(seed, z)`` of every report in the salvaged records' batches."""
    out: Counter[tuple[int, int]] = Counter()
    for effect in effects:
        if isinstance(effect, Released | Outboxed):
            for message in effect.messages:
                if is_manifest(message) or len(message) < 30 + 64:
                    continue
                records = message[30:-64]
                for i in range(0, len(records) - 5, 6):
                    seed = int.from_bytes(records[i : i + 4], "big")
                    out[seed, int.from_bytes(records[i + 4 : i + 6], "big")] += 1
    return out


def salvage(data: bytes, salt: int, report: RepairReport) -> list[Effect]:
    """Every intact record of a version-2 log, skipping damaged stretches (counted)."""
    effects: list[Effect] = []
    damaged: list[tuple[int, int]] = []
    offset = FILE_HEADER_SIZE
    while offset < len(data):
        result = scan(data, offset, salt)
        effects += result.effects
        report.records_kept += result.records
        problem = result.problem
        if problem is None:
            break
        end = problem.next_good if problem.next_good is not None else len(data)
        stretch: dict[str, object] = {
            "offset": problem.offset,
            "bytes": end - problem.offset,
            "reason": problem.reason,
            "torn_tail": problem.next_good is None,
        }
        if problem.kind is not None:
            stretch["record"] = TYPE_NAMES.get(problem.kind, f"type-{problem.kind}")
            held = _reports_in(problem.kind, problem.length)
            stretch["reports"] = held
            report.reports_in_damaged_records += held
            damaged.extend(_damaged_reports(data, problem.offset, problem.kind, problem.length))
            if report.records_dropped is not None:
                report.records_dropped += 1
        else:
            report.records_dropped = None  # a damaged head: how many records, unknown
        report.damaged_stretches.append(stretch)
        report.bytes_dropped += end - problem.offset
        if problem.next_good is None:
            break
        offset = problem.next_good
    unread = report.reports_in_damaged_records - len(damaged)
    unmatched = Counter(damaged) - _released(effects)
    report.reports_lost = unread + sum(unmatched.values())
    return effects


def _no_log(state_dir: Path) -> StoreError:
    return StoreError(
        f"{state_dir} holds no shuffler log (effects.log): not a shuffler state directory; "
        "nothing to repair"
    )


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
        salt = read_header(data)
        if salt is None and looks_like_v1(data):
            try:  # version 1: what reads before the damage
                effects, whole = decode_v1(data, config.round_seconds, name=str(path))
            except V1Error:
                effects, whole = [], 0
            report.records_kept = len(effects)
            report.bytes_dropped = len(data) - whole
            report.records_dropped = None if whole < len(data) else 0
        else:
            salt = salt if salt is not None else _guess_salt(data)
            if salt is None:
                report.bytes_dropped = len(data)
                report.records_dropped = None
                effects = []
            else:
                effects = salvage(data, salt, report)
        core = ShufflerCore(config)
        known: set[bytes] = set()  # batch ids released or outboxed in the salvaged records
        for effect in effects:
            if isinstance(effect, Released | Outboxed):
                known.update(batch_id_of(m) for m in effect.messages)
            if isinstance(effect, Acked) and effect.batch_id not in known:
                report.lost_releases += 1
            core.apply(effect)
        log = EffectLog(path, round_seconds=config.round_seconds)
        log.version = 1  # whatever the file holds: replace it
        log.compact(core.snapshot())
        log.close()
        report.pooled_after = core.buffered
        report.outbox_after = core.outbox_reports
    for stretch in report.damaged_stretches:
        logger.warning("shuffler log %s: dropped %s", path, stretch)
    return report
