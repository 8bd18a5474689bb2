"""Reading a version-1 shuffler log (before the file header and bulk records).

A version-1 log is a bare sequence of ``type u8 | length u32 | body | crc32 u32``
(big-endian) records, one per report, with 16-byte tokens and the closed rounds as a round
number. It is read once, converted to version-2 effects, and the startup compaction
rewrites it in version 2. Conversions:

* a token is the first 8 bytes of the 16-byte one (the version-2 token is exactly that
  prefix of the same keyed BLAKE2b), so duplicates recorded before the upgrade are still
  recognised after it;
* per-report records of one round in a row become one bulk record (their order kept);
* ``Closed(through)`` becomes ``Closed((through + 1) * round_seconds)``: the upgrade
  assumes the ``round_seconds`` the log was written under is the configured one (change
  ``round_seconds`` in a later restart, not in the one that upgrades).

A version-1 log can only say "torn tail" or "damaged" for its last record, not tell the two
apart: damage anywhere is refused with the file and the offset, as version 1 did.
"""

from __future__ import annotations

import struct
import zlib

from broker.core.effects import (
    Acked,
    Admitted,
    Carried,
    Closed,
    Dropped,
    Effect,
    Outboxed,
    Pooled,
    Released,
    Seen,
)

__all__ = ["decode_v1"]

_HEAD = struct.Struct(">BI")
_CRC = struct.Struct(">I")
_REPORT = struct.Struct(">I16sIH")
_SEEN = struct.Struct(">I16s")
_U32 = struct.Struct(">I")
_TWO = struct.Struct(">II")
_MAX_RECORD = 1 << 30
_ACCEPTED, _SEEN_T, _POOLED, _RELEASED, _OUTBOXED, _CARRIED, _DROPPED, _CLOSED, _ACKED = range(
    1, 10
)


class V1Error(ValueError):
    """A damaged version-1 record (the message names the offset)."""


def _messages(body: bytes, offset: int) -> tuple[bytes, ...]:
    (count,) = _U32.unpack_from(body, offset)
    offset += 4
    out = []
    for _ in range(count):
        (size,) = _U32.unpack_from(body, offset)
        offset += 4
        out.append(body[offset : offset + size])
        offset += size
    if offset != len(body):
        raise ValueError("trailing bytes after the batch messages")
    return tuple(out)


class _Grouper:
    """Per-report records of one round in a row, gathered into one bulk effect."""

    def __init__(self, round_seconds: int) -> None:
        self.round_seconds = round_seconds
        self.out: list[Effect] = []
        self._kind = 0
        self._round = -1
        self._columns: list[bytearray] = []

    def report(self, kind: int, round_: int, token: bytes, seed: int = 0, z: int = 0) -> None:
        if (kind, round_) != (self._kind, self._round):
            self.flush()
            self._kind, self._round = kind, round_
            self._columns = [bytearray(), bytearray(), bytearray()]
        tokens, seeds, zs = self._columns
        tokens += token[:8]
        seeds += seed.to_bytes(4, "little")
        zs += z.to_bytes(2, "little")

    def flush(self) -> None:
        if not self._kind:
            return
        tokens, seeds, zs = (bytes(c) for c in self._columns)
        if self._kind == _ACCEPTED:
            self.out.append(Admitted(self._round, tokens, seeds, zs))
        elif self._kind == _POOLED:  # pooled entries carry no duplicate token of their own
            self.out.append(Pooled(self._round, len(seeds) // 4, tokens, seeds, zs))
        else:
            self.out.append(Seen(self._round, tokens))
        self._kind = 0

    def other(self, effect: Effect) -> None:
        self.flush()
        self.out.append(effect)


def decode_v1(data: bytes, round_seconds: int, *, name: str) -> tuple[list[Effect], int]:
    """The version-2 effects of a version-1 log and the length of its whole records (a
    record cut short at the end is left out); :class:`V1Error` for damage before that."""
    group = _Grouper(round_seconds)
    offset, size = 0, len(data)
    while offset < size:
        if size - offset < _HEAD.size:
            break
        kind, length = _HEAD.unpack_from(data, offset)
        end = offset + _HEAD.size + length + _CRC.size
        if length > _MAX_RECORD:
            raise V1Error(f"{name}: record at offset {offset} claims {length} bytes")
        if end > size:
            break
        body = data[offset + _HEAD.size : end - _CRC.size]
        (crc,) = _CRC.unpack_from(data, end - _CRC.size)
        if zlib.crc32(body, zlib.crc32(data[offset : offset + _HEAD.size])) != crc:
            raise V1Error(f"{name}: damaged record (bad checksum) at offset {offset}")
        try:
            _convert(group, kind, body)
        except (ValueError, struct.error) as exc:
            raise V1Error(f"{name}: bad record at offset {offset}: {exc}") from None
        offset = end
    group.flush()
    return group.out, offset


def _convert(group: _Grouper, kind: int, body: bytes) -> None:
    if kind in (_ACCEPTED, _POOLED):
        round_, token, seed, z = _REPORT.unpack(body)
        group.report(kind, round_, token, seed, z)
    elif kind == _SEEN_T:
        round_, token = _SEEN.unpack(body)
        group.report(kind, round_, token)
    elif kind == _RELEASED:
        group.other(Released(_U32.unpack_from(body)[0], _messages(body, 4)))
    elif kind == _OUTBOXED:
        group.other(Outboxed(_messages(body, 0)))
    elif kind == _CARRIED:
        group.other(Carried(*_TWO.unpack(body)))
    elif kind == _DROPPED:
        group.other(Dropped(_U32.unpack_from(body)[0], body[4:].decode("ascii")))
    elif kind == _CLOSED:
        group.other(Closed((_U32.unpack(body)[0] + 1) * group.round_seconds))
    elif kind == _ACKED and len(body) == 16:
        group.other(Acked(body))
    else:
        raise ValueError(f"unknown record type {kind}")
