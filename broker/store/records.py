"""The shuffler log's file format (version 3): a checked header, then framed records.

::

    file header  "COCOSLOG" | version u16 = 3 | flags u16 = 0 | salt u32 | crc32 u32
    record       marker u32 = "COCR" | type u8 | length u32 | head crc u32 | body | body crc u32

All integers little-endian. ``head crc`` is the CRC-32 of ``marker | type | length``
started from the file's random ``salt``; ``body crc`` the CRC-32 of the body started from
the head crc. So damage is found wherever it is: a flipped bit in a length fails the head
crc (the length is never trusted before that), one in a body fails the body crc, and a
record can be recognised on its own, which is what tells damage from a torn tail
(:func:`scan`): after the last good record, the rest of the file is a torn tail only if no
valid record starts anywhere after it. The salt makes a record of another log file, or one
a device could smuggle into a pooled report's bytes, fail its crc.

A body is packed columns (one record holds every report of a socket read, a whole pool or a
round's tokens), so replaying a log is a few numpy calls per record, not a Python object
per report. Version 3 differs from version 2 only in its promise: a version-3 log has an
acknowledged end in ``effects.mark`` (:mod:`broker.store.mark`), a version-2 log has none
and is read by the rules it was written under (:mod:`broker.store.wal`). Version-1 logs (no
header) are still read (:mod:`broker.store.logv1`).
"""

from __future__ import annotations

import mmap
import secrets
import struct
import zlib
from collections.abc import Iterable
from dataclasses import dataclass, field

from broker.core.effects import (
    Acked,
    Admitted,
    Carried,
    Closed,
    Configured,
    Dropped,
    Effect,
    Outboxed,
    Pooled,
    Released,
    Seen,
    Sourced,
)
from broker.store.mark import held

__all__ = [
    "FILE_HEADER_SIZE",
    "MAGIC",
    "Problem",
    "Scan",
    "decode_record",
    "effect_at",
    "encode_effect",
    "encode_parts",
    "file_header",
    "read_header",
    "scan",
]

MAGIC = b"COCOSLOG"
VERSION = 3
VERSIONS = (2, 3)
_FILE = struct.Struct("<8sHHI")
_CRC = struct.Struct("<I")
FILE_HEADER_SIZE = _FILE.size + _CRC.size
MARKER = b"COCR"
_HEAD = struct.Struct("<4sBI")
HEAD_SIZE = _HEAD.size + _CRC.size
MAX_RECORD = 1 << 30
_U32 = struct.Struct("<I")
_TWO = struct.Struct("<II")
_THREE = struct.Struct("<III")
_U64 = struct.Struct("<Q")
Body = bytes | memoryview

(ADMITTED, SEEN, POOLED, RELEASED, OUTBOXED, CARRIED, DROPPED, CLOSED, ACKED, CONFIGURED) = range(
    1, 11
)
SOURCED = 11
TYPE_NAMES = {
    ADMITTED: "admitted",
    SEEN: "seen",
    POOLED: "pooled",
    RELEASED: "released",
    OUTBOXED: "outboxed",
    CARRIED: "carried",
    DROPPED: "dropped",
    CLOSED: "closed",
    ACKED: "acked",
    CONFIGURED: "configured",
    SOURCED: "sourced",
}


def file_header(salt: int | None = None, version: int = VERSION) -> tuple[bytes, int]:
    """A new file header and its salt (random unless given)."""
    salt = secrets.randbits(32) if salt is None else salt
    head = _FILE.pack(MAGIC, version, 0, salt)
    return head + _CRC.pack(zlib.crc32(head)), salt


def header_of(data: bytes | memoryview | mmap.mmap) -> tuple[int, int] | None:
    """``(version, salt)`` of a valid version-2 or -3 header at the start of ``data``."""
    if len(data) < FILE_HEADER_SIZE:
        return None
    magic, version, _flags, salt = _FILE.unpack_from(data)
    if magic != MAGIC or version not in VERSIONS:
        return None
    if zlib.crc32(bytes(data[: _FILE.size])) != _CRC.unpack_from(data, _FILE.size)[0]:
        return None
    return int(version), int(salt)


def read_header(data: bytes | memoryview) -> int | None:
    """The salt of a valid version-2 or -3 header at the start of ``data``, else ``None``."""
    header = header_of(data)
    return None if header is None else header[1]


def _messages(messages: tuple[bytes, ...]) -> bytes:
    return _U32.pack(len(messages)) + b"".join(_U32.pack(len(m)) + m for m in messages)


def _read_messages(body: Body, offset: int) -> tuple[bytes, ...]:
    (count,) = _U32.unpack_from(body, offset)
    offset += 4
    out = []
    for _ in range(count):
        (size,) = _U32.unpack_from(body, offset)
        offset += 4
        if offset + size > len(body):
            raise ValueError("a batch message runs past the record")
        out.append(bytes(body[offset : offset + size]))
        offset += size
    if offset != len(body):
        raise ValueError("trailing bytes after the batch messages")
    return tuple(out)


def _body_parts(effect: Effect) -> tuple[int, tuple[bytes, ...]]:
    """The record type of ``effect`` and its body, in parts (joined, they are the body): a
    pool's columns are parts of their own, never copied into one buffer."""
    match effect:
        case Admitted(round_, tokens, seeds, zs):
            return ADMITTED, (_TWO.pack(round_, len(seeds) // 4), tokens, seeds, zs)
        case Seen(round_, tokens):
            return SEEN, (_TWO.pack(round_, len(tokens) // 8), tokens)
        case Pooled(round_, carried, tokens, seeds, zs):
            return POOLED, (_THREE.pack(round_, carried, len(seeds) // 4), tokens, seeds, zs)
        case Released(round_, messages):
            return RELEASED, (_U32.pack(round_), _messages(messages))
        case Outboxed(messages):
            return OUTBOXED, (_messages(messages),)
        case Carried(source, target):
            return CARRIED, (_TWO.pack(source, target),)
        case Dropped(round_, reason):
            return DROPPED, (_U32.pack(round_), reason.encode("ascii"))
        case Closed(until):
            return CLOSED, (_U64.pack(until),)
        case Acked(batch_id):
            return ACKED, (bytes(batch_id),)
        case Configured(round_seconds, fingerprint):
            return CONFIGURED, (_TWO.pack(round_seconds, fingerprint),)
        case Sourced(round_, keys):
            return SOURCED, (_U32.pack(round_), keys)
    raise TypeError(f"not an effect: {effect!r}")  # pragma: no cover


def encode_parts(effect: Effect, salt: int) -> tuple[bytes, ...]:
    """One framed record of ``effect`` in a log whose header has ``salt``, in parts whose
    concatenation is :func:`encode_effect`'s bytes (a compaction writes a pool of a million
    reports without first copying it into one record)."""
    kind, body = _body_parts(effect)
    head = _HEAD.pack(MARKER, kind, sum(len(part) for part in body))
    head_crc = zlib.crc32(head, salt)
    body_crc = head_crc
    for part in body:
        body_crc = zlib.crc32(part, body_crc)
    return (head + _CRC.pack(head_crc), *body, _CRC.pack(body_crc))


def encode_effect(effect: Effect, salt: int) -> bytes:
    """One framed record of ``effect`` in a log whose header has ``salt``."""
    return b"".join(encode_parts(effect, salt))


def encode_effects(effects: Iterable[Effect], salt: int) -> bytes:
    return b"".join(encode_effect(effect, salt) for effect in effects)


def _columns(body: Body, offset: int, n: int, *, seeds: bool = True) -> tuple[bytes, ...]:
    width = 14 if seeds else 8
    if len(body) != offset + width * n:
        raise ValueError(f"{n} entries do not fill a body of {len(body)} bytes")
    tokens = bytes(body[offset : offset + 8 * n])
    if not seeds:
        return (tokens,)
    return tokens, bytes(body[offset + 8 * n : offset + 12 * n]), bytes(body[offset + 12 * n :])


def decode_record(kind: int, body: Body) -> Effect:
    """The effect of one record's body (``ValueError``/``struct.error`` if malformed): its
    fields are copies (``bytes``), never views of ``body``."""
    if kind == ADMITTED:
        round_, n = _TWO.unpack_from(body)
        return Admitted(round_, *_columns(body, 8, n))
    if kind == SEEN:
        round_, n = _TWO.unpack_from(body)
        return Seen(round_, *_columns(body, 8, n, seeds=False))
    if kind == POOLED:
        round_, carried, n = _THREE.unpack_from(body)
        if carried > n:
            raise ValueError("more carried entries than entries")
        return Pooled(round_, carried, *_columns(body, 12, n))
    if kind == RELEASED:
        return Released(_U32.unpack_from(body)[0], _read_messages(body, 4))
    if kind == OUTBOXED:
        return Outboxed(_read_messages(body, 0))
    if kind == CARRIED:
        return Carried(*_TWO.unpack(body))
    if kind == DROPPED:
        return Dropped(_U32.unpack_from(body)[0], bytes(body[4:]).decode("ascii"))
    if kind == CLOSED:
        return Closed(_U64.unpack(body)[0])
    if kind == ACKED and len(body) == 16:
        return Acked(bytes(body))
    if kind == CONFIGURED:
        return Configured(*_TWO.unpack(body))
    if kind == SOURCED and len(body) >= 4 and (len(body) - 4) % 8 == 0:
        return Sourced(_U32.unpack_from(body)[0], bytes(body[4:]))
    raise ValueError(f"unknown record type {kind}")


@dataclass(frozen=True)
class Problem:
    """Where a log stops being readable: ``offset`` of the first bad byte, ``reason``,
    ``kind``/``length`` from the record's head if that head is intact, and ``next_good``:
    the offset of the next valid record after it, or ``None`` (a torn tail)."""

    offset: int
    reason: str
    next_good: int | None
    kind: int | None = None
    length: int | None = None


@dataclass
class Scan:
    """Records read from ``start`` up to ``end`` (whole records), then the first problem."""

    effects: list[Effect]
    """The records' effects (empty when read with ``keep=False``)."""
    end: int
    records: int
    problem: Problem | None
    starts: list[int] = field(default_factory=list)
    """The offset of each record read."""
    reports: int = 0
    released: int = 0
    """The reports the records hold in pools and in batches (:func:`broker.store.mark.held`)."""


def _record_at(data: memoryview, offset: int, salt: int) -> tuple[int, int, memoryview] | str:
    """``(kind, end, body)`` of a valid record at ``offset`` (``body`` a view of ``data``),
    else why not."""
    size = len(data)
    if size - offset < HEAD_SIZE:
        return "cut short"
    marker, kind, length = _HEAD.unpack_from(data, offset)
    if marker != MARKER:
        return "no record marker"
    head_crc = zlib.crc32(data[offset : offset + _HEAD.size], salt)
    if _CRC.unpack_from(data, offset + _HEAD.size)[0] != head_crc:
        return "bad head checksum"
    if length > MAX_RECORD:
        return f"implausible length {length}"
    start = offset + HEAD_SIZE
    end = start + length + _CRC.size
    if end > size:
        return "cut short"
    body = data[start : start + length]
    if zlib.crc32(body, head_crc) != _CRC.unpack_from(data, start + length)[0]:
        return "bad body checksum"
    return kind, end, body


def head_at(data: bytes, offset: int, salt: int) -> tuple[int, int] | None:
    """``(kind, length)`` of an intact record head at ``offset`` (its body may be damaged
    or cut), else ``None``."""
    if len(data) - offset < HEAD_SIZE:
        return None
    marker, kind, length = _HEAD.unpack_from(data, offset)
    head_crc = zlib.crc32(data[offset : offset + _HEAD.size], salt)
    if marker != MARKER or _CRC.unpack_from(data, offset + _HEAD.size)[0] != head_crc:
        return None
    return (kind, length) if length <= MAX_RECORD else None


def next_valid(data: memoryview, start: int, salt: int) -> int | None:
    """The offset of the first valid record at or after ``start`` (a body that decodes
    included), else ``None``."""
    raw = data.obj if isinstance(data.obj, bytes | bytearray | mmap.mmap) else bytes(data)
    position = start
    while True:
        position = raw.find(MARKER, position)
        if position < 0:
            return None
        found = _record_at(data, position, salt)
        if not isinstance(found, str):
            kind, _, body = found
            try:
                decode_record(kind, body)
            except (ValueError, struct.error, UnicodeDecodeError):
                pass
            else:
                return position
        position += 1


def scan(
    data: bytes | bytearray | mmap.mmap,
    start: int,
    salt: int,
    stop: int | None = None,
    *,
    keep: bool = True,
) -> Scan:
    """Read records from ``start`` until the end (or the first record that ends at or after
    ``stop``) or the first problem (module docstring: the problem is a torn tail if no
    valid record follows it). With ``keep=False`` every record is still decoded (a body
    that does not decode is a problem) but its effect is not kept: a check of a whole log
    that holds one record's effect at a time (:func:`effect_at` reads them again)."""
    view = memoryview(data)
    effects: list[Effect] = []
    starts: list[int] = []
    offset, size, records = start, len(data), 0
    reports = released = 0
    stop = size if stop is None else min(stop, size)
    while offset < stop:
        found = _record_at(view, offset, salt)
        kind: int | None = None
        length: int | None = None
        if isinstance(found, str):
            reason = found
            if size - offset >= _HEAD.size + _CRC.size and reason in (
                "bad body checksum",
                "cut short",
            ):
                _, kind, length = _HEAD.unpack_from(view, offset)
        else:
            kind, end, body = found
            try:
                effect = decode_record(kind, body)
            except (ValueError, struct.error, UnicodeDecodeError) as exc:
                reason = f"bad {TYPE_NAMES.get(kind, f'type-{kind}')} record: {exc}"
            else:
                if keep:
                    effects.append(effect)
                pooled, batched = held(effect)
                reports += pooled
                released += batched
                starts.append(offset)
                offset = end
                records += 1
                continue
        problem = Problem(offset, reason, next_valid(view, offset + 1, salt), kind, length)
        return Scan(effects, offset, records, problem, starts, reports, released)
    return Scan(effects, offset, records, None, starts, reports, released)


def effect_at(data: memoryview, offset: int, salt: int) -> Effect:
    """The effect of the record at ``offset`` of ``data``, one :func:`scan` found valid
    (``ValueError`` if it is not, which only a file changed since can make)."""
    found = _record_at(data, offset, salt)
    if isinstance(found, str):
        raise ValueError(f"no valid record at offset {offset}: {found}")
    kind, _, body = found
    return decode_record(kind, body)


def record_spans(data: bytes, salt: int) -> list[tuple[int, int, int]]:
    """``(offset, kind, end)`` of each whole record from the header on, up to the first
    problem (tools and tests: where to look in a log)."""
    view = memoryview(data)
    spans = []
    offset = FILE_HEADER_SIZE
    while offset < len(data):
        found = _record_at(view, offset, salt)
        if isinstance(found, str):
            break
        kind, end, _ = found
        spans.append((offset, kind, end))
        offset = end
    return spans


_SALT_BASIS: list[int] = []


def _salt_basis() -> list[int]:
    """``crc32(head, 1 << i) ^ crc32(head, 0)`` for each bit ``i`` of a salt: the CRC of a
    fixed-length input is affine in its starting value, so these 32 columns give the head
    crc of any salt (the same for every 9-byte head)."""
    if not _SALT_BASIS:
        zero = bytes(_HEAD.size)
        base = zlib.crc32(zero, 0)
        _SALT_BASIS.extend(zlib.crc32(zero, 1 << i) ^ base for i in range(32))
    return _SALT_BASIS


def salt_of(head: bytes, head_crc: int) -> int | None:
    """The salt under which ``head`` (9 bytes) has the crc ``head_crc``: solved over GF(2)
    from :func:`_salt_basis` (``None`` if no salt gives it)."""
    target = head_crc ^ zlib.crc32(head, 0)
    rows = [(column, 1 << i) for i, column in enumerate(_salt_basis())]
    salt = 0
    for bit in range(32):  # Gaussian elimination on the columns, pivoting on each bit
        pivot = next((k for k, (column, _) in enumerate(rows) if column >> bit & 1), None)
        if pivot is None:
            continue
        column, which = rows.pop(pivot)
        rows = [(c ^ column, w ^ which) if c >> bit & 1 else (c, w) for c, w in rows]
        if target >> bit & 1:
            target ^= column
            salt ^= which
    return salt if target == 0 else None


def find_salt(data: bytes, start: int = FILE_HEADER_SIZE) -> int | None:
    """The salt of a log whose header is damaged, from its records alone: the body crc of a
    record starts from its stored head crc (no salt needed to check it), and the salt that
    gives that head crc is unique (:func:`salt_of`). The first record at or after
    ``start`` whose body checks and decodes, and whose solved salt reads it, gives it."""
    view = memoryview(data)
    position = start
    while True:
        position = data.find(MARKER, position)
        if position < 0 or len(data) - position < HEAD_SIZE:
            return None
        head = bytes(view[position : position + _HEAD.size])
        (head_crc,) = _CRC.unpack_from(data, position + _HEAD.size)
        _, kind, length = _HEAD.unpack(head)
        end = position + HEAD_SIZE + length + _CRC.size
        if length <= MAX_RECORD and end <= len(data):
            body = bytes(view[position + HEAD_SIZE : end - _CRC.size])
            if zlib.crc32(body, head_crc) == _CRC.unpack_from(data, end - _CRC.size)[0]:
                salt = salt_of(head, head_crc)
                if salt is not None and not isinstance(_record_at(view, position, salt), str):
                    try:
                        decode_record(kind, body)
                    except (ValueError, struct.error, UnicodeDecodeError):
                        pass
                    else:
                        return salt
        position += 1
