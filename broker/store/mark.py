"""The shuffler log's acknowledged end: ``effects.mark``, a small checked file beside the log.

The log alone cannot tell a torn write from damage at its end: a file cut at a record
boundary reads like a log whose last records were never written, and a damaged last record
like one a crash tore. The mark says where the log's trusted part ends. After every write to
the log returns, and before the caller lets anything it wrote be seen outside the process
(a PUBACK, a published batch), the log's new end is written here, with the number of
records before it and the reports they hold::

    "COCOMARK" | version u16 = 1 | entries u16 | 2 x entry | crc32 u32
    entry      salt u32 | length u64 | records u64 | reports u64 | released u64

``salt`` is the salt of the log file the entry describes (a compaction writes a new file
with a new salt), ``length`` its acknowledged end, ``records`` the records before it,
``reports`` the reports in its ``admitted`` and ``pooled`` records, ``released`` the reports
in the batches of its ``released`` and ``outboxed`` records. Two slots: during a
compaction the mark holds the entry of the log being replaced and of its replacement
(written and synced before the rename), so whichever file a crash leaves in place has its
entry. The file is 88 bytes, always rewritten whole at offset 0 (one ``pwrite``, within one
page and one sector); its crc tells a torn or damaged mark.
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Iterable, Sequence
from typing import NamedTuple

from broker.core.effects import Admitted, Effect, Outboxed, Pooled, Released, batch_count_of

__all__ = ["MARK_SIZE", "End", "decode_mark", "encode_mark", "held", "totals"]

MAGIC = b"COCOMARK"
VERSION = 1
_HEAD = struct.Struct("<8sHH")
_ENTRY = struct.Struct("<IQQQQ")
_CRC = struct.Struct("<I")
SLOTS = 2
_COUNTED = 30  # a batch's header, up to its record count
MARK_SIZE = _HEAD.size + SLOTS * _ENTRY.size + _CRC.size
_ONE = struct.Struct(f"<8sHHIQQQQ{_ENTRY.size}x")  # the head, one entry, an empty slot


class End(NamedTuple):
    """The acknowledged end of one log file (module docstring)."""

    salt: int
    length: int = 0
    records: int = 0
    reports: int = 0
    released: int = 0

    def plus(self, length: int, records: int, reports: int, released: int) -> End:
        return End(
            self.salt,
            self.length + length,
            self.records + records,
            self.reports + reports,
            self.released + released,
        )


def encode_mark(ends: Sequence[End]) -> bytes:
    """The mark file holding ``ends`` (one or two entries)."""
    if len(ends) == 1:  # after every write: one pack, one crc
        body = _ONE.pack(MAGIC, VERSION, 1, *ends[0])
        return body + _CRC.pack(zlib.crc32(body))
    if not 1 <= len(ends) <= SLOTS:
        raise ValueError(f"a mark holds 1 to {SLOTS} entries, not {len(ends)}")
    body = _HEAD.pack(MAGIC, VERSION, len(ends)) + b"".join(
        _ENTRY.pack(e.salt, e.length, e.records, e.reports, e.released) for e in ends
    )
    body += bytes(_ENTRY.size * (SLOTS - len(ends)))
    return body + _CRC.pack(zlib.crc32(body))


def decode_mark(data: bytes) -> tuple[End, ...] | None:
    """The entries of a mark file, or ``None`` if it is damaged (or not a mark)."""
    if len(data) != MARK_SIZE:
        return None
    body = data[: -_CRC.size]
    if zlib.crc32(body) != _CRC.unpack_from(data, len(body))[0]:
        return None
    magic, version, count = _HEAD.unpack_from(body)
    if magic != MAGIC or version != VERSION or not 1 <= count <= SLOTS:
        return None
    return tuple(End(*_ENTRY.unpack_from(body, _HEAD.size + i * _ENTRY.size)) for i in range(count))


def held(effect: Effect) -> tuple[int, int]:
    """``(reports, released)``: the reports an effect's record holds in pools (``admitted``,
    ``pooled``) and in batches (``released``, ``outboxed``; manifests hold none)."""
    if isinstance(effect, Admitted | Pooled):
        return len(effect.seeds) // 4, 0
    if isinstance(effect, Released | Outboxed):
        return 0, sum(batch_count_of(m) for m in effect.messages if len(m) >= _COUNTED)
    return 0, 0


def totals(effects: Iterable[Effect]) -> tuple[int, int, int]:
    """``(records, reports, released)`` of a sequence of effects (:func:`held`)."""
    records = reports = released = 0
    for effect in effects:
        records += 1
        pooled, batched = held(effect)
        reports += pooled
        released += batched
    return records, reports, released
