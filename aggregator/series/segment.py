"""The series file's bytes: its header, its records and the part a checkpoint committed.

Pure code (bytes in, values out); the file itself is :mod:`aggregator.service.series_file`.

Layout
------
A header, then records, appended in the order of their sequence numbers::

    header  = magic "\\x89COCOSER" | version u16 | d u32 | base_seq u64 | base_records u64
              | deployment (u16 length, UTF-8) | fingerprint (u16 length, ASCII)
              | checksum (16 bytes)
    record  = length u32 | body | checksum (16 bytes)
    body    = seq u64 | coarse u8 | round i64 | start i64 | end i64 | n u64 | batches u64
              | smallest u64 (0: none) | rounds u64 | sum_u int64[d] | sum_v int64[d]

Integers are little-endian; a checksum is the first 16 bytes of the SHA-256 of everything
before it in its header or record (the checkpoint's choice,
:mod:`aggregator.service.core.checkpoint`). A record is ``85 + 16 d`` bytes. A compacted file
begins with ``base_records`` records that hold everything up to sequence number ``base_seq``
(both 0 for a file never compacted); they may skip numbers up to it
(:func:`~aggregator.series.core.compact_records` keeps the largest of each merged row's).

What a checkpoint committed
---------------------------
The checkpoint records the sequence number ``upto`` of the newest record written before it
(:mod:`aggregator.series.core`, *Persistence*). :func:`committed_prefix` reads the records
in order until the file covers ``upto`` (and at least the compacted ones); every byte after
that was written after the checkpoint (a crash before the next one, or a checkpoint rolled
back to its previous generation) and is cut off: those batches were never acknowledged and
come back by redelivery. A record that is damaged (its checksum), cut short, out of order or missing
before ``upto`` is covered, a foreign header, or a file compacted past ``upto`` is refused
with a :class:`SegmentError` naming the offset: the file no longer holds what the checkpoint
says it does.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from aggregator.series.core import Delta, compact_records

__all__ = [
    "MAGIC",
    "Committed",
    "Header",
    "SegmentError",
    "committed_prefix",
    "compacted",
    "decode_header",
    "decode_record",
    "encode_header",
    "encode_record",
    "record_size",
]

MAGIC = b"\x89COCOSER"
VERSION = 1
CHECKSUM_BYTES = 16
_HEAD = struct.Struct("<8sHIQQ")
_LENGTH = struct.Struct("<I")
_FIELDS = struct.Struct("<QBqqqQQQQ")
_STRING = struct.Struct("<H")
_MAX_D = 1 << 20


class SegmentError(ValueError):
    """Bytes that are not what they should be: ``offset`` (in the file) and the problem;
    ``torn`` when the bytes end inside a header or record (a write cut short)."""

    def __init__(self, offset: int, problem: str, *, torn: bool = False) -> None:
        super().__init__(f"{problem} at offset {offset}")
        self.offset = offset
        self.problem = problem
        self.torn = torn


@dataclass(frozen=True)
class Header:
    """Whose rows the file holds: the deployment, the spec's fingerprint and ``d``; and
    what a compaction folded into the first ``base_records`` records: everything up to
    ``base_seq`` (0: never compacted)."""

    deployment: str
    fingerprint: str
    d: int
    base_seq: int = 0
    base_records: int = 0


def _checksum(data: bytes | memoryview) -> bytes:
    return hashlib.sha256(data).digest()[:CHECKSUM_BYTES]


def encode_header(header: Header) -> bytes:
    deployment = header.deployment.encode()
    fingerprint = header.fingerprint.encode("ascii")
    head = b"".join(
        [
            _HEAD.pack(MAGIC, VERSION, header.d, header.base_seq, header.base_records),
            _STRING.pack(len(deployment)),
            deployment,
            _STRING.pack(len(fingerprint)),
            fingerprint,
        ]
    )
    return head + _checksum(head)


def _string(data: bytes, offset: int) -> tuple[bytes, int]:
    if len(data) < offset + _STRING.size:
        raise SegmentError(0, "the header is cut short", torn=True)
    (length,) = _STRING.unpack_from(data, offset)
    end = offset + _STRING.size + length
    if len(data) < end:
        raise SegmentError(0, "the header is cut short", torn=True)
    return data[offset + _STRING.size : end], end


def decode_header(data: bytes) -> tuple[Header, int]:
    """The header at the start of ``data`` and where the records begin."""
    if len(data) < _HEAD.size:
        if MAGIC.startswith(data[: len(MAGIC)]):
            raise SegmentError(0, "the header is cut short", torn=True)
        raise SegmentError(0, "is not a series file (no series header)")
    magic, version, d, base_seq, base_records = _HEAD.unpack_from(data, 0)
    if magic != MAGIC:
        raise SegmentError(0, "is not a series file (no series header)")
    deployment, offset = _string(data, _HEAD.size)
    fingerprint, offset = _string(data, offset)
    end = offset + CHECKSUM_BYTES
    if len(data) < end:
        raise SegmentError(0, "the header is cut short", torn=True)
    if data[offset:end] != _checksum(data[:offset]):
        raise SegmentError(0, "the header does not match its checksum")
    if version != VERSION:
        raise SegmentError(0, f"is version {version}, not {VERSION}")
    if not 1 <= d <= _MAX_D:
        raise SegmentError(0, f"the header's dimension {d} is out of range")
    try:
        header = Header(deployment.decode(), fingerprint.decode("ascii"), d, base_seq, base_records)
    except UnicodeDecodeError:
        raise SegmentError(0, "the header's names are not text") from None
    return header, end


def record_size(d: int) -> int:
    """The bytes of one record of ``d`` dimensions, length and checksum included."""
    return _LENGTH.size + _FIELDS.size + 16 * d + CHECKSUM_BYTES


def encode_record(delta: Delta) -> bytes:
    d = int(delta.sum_u.shape[0])
    body = b"".join(
        [
            _FIELDS.pack(
                delta.seq,
                1 if delta.coarse else 0,
                delta.round,
                delta.start,
                delta.end,
                delta.n,
                delta.batches,
                0 if delta.smallest is None else delta.smallest,
                delta.rounds,
            ),
            np.ascontiguousarray(delta.sum_u, dtype="<i8").tobytes(),
            np.ascontiguousarray(delta.sum_v, dtype="<i8").tobytes(),
        ]
    )
    framed = _LENGTH.pack(len(body)) + body
    assert len(framed) + CHECKSUM_BYTES == record_size(d)
    return framed + _checksum(framed)


def decode_record(data: bytes, offset: int, d: int) -> tuple[Delta, int]:
    """The record at ``offset`` of ``data`` (of ``d`` dimensions) and where the next begins."""
    size = record_size(d)
    if len(data) < offset + _LENGTH.size:
        raise SegmentError(offset, "a record is cut short", torn=True)
    (length,) = _LENGTH.unpack_from(data, offset)
    if length != size - _LENGTH.size - CHECKSUM_BYTES:
        if len(data) < offset + size:
            raise SegmentError(offset, "a record is cut short", torn=True)
        raise SegmentError(offset, f"a record's length is {length}, not that of d = {d}")
    end = offset + size
    if len(data) < end:
        raise SegmentError(offset, "a record is cut short", torn=True)
    view = memoryview(data)
    if bytes(view[end - CHECKSUM_BYTES : end]) != _checksum(view[offset : end - CHECKSUM_BYTES]):
        raise SegmentError(offset, "a record does not match its checksum")
    body = offset + _LENGTH.size
    seq, coarse, round_, start, stop, n, batches, smallest, rounds = _FIELDS.unpack_from(data, body)
    sums = np.frombuffer(data, dtype="<i8", count=2 * d, offset=body + _FIELDS.size)
    sums = sums.astype(np.int64)
    if coarse not in (0, 1) or stop <= start or (rounds < 1 and not coarse):
        raise SegmentError(offset, f"record {seq} is not a row (checksum valid: a writer's fault)")
    delta = Delta(
        seq=seq,
        coarse=bool(coarse),
        round=round_,
        start=start,
        end=stop,
        n=n,
        sum_u=sums[:d].copy(),
        sum_v=sums[d:].copy(),
        batches=batches,
        smallest=smallest or None,
        rounds=rounds,
    )
    return delta, end


@dataclass(frozen=True)
class Committed:
    """What :func:`committed_prefix` found."""

    header: Header
    deltas: list[Delta]
    """The committed records, in file order (to :meth:`~aggregator.series.core.Series.replay`)."""
    keep: int
    """The bytes to keep: the header and the committed records."""
    dropped: int
    """The bytes after them (written after the checkpoint): to cut off."""


def committed_prefix(data: bytes, *, expect: Header, upto: int) -> Committed:
    """The records of ``data`` up to the checkpoint's sequence number ``upto`` (module
    docs); ``expect`` names the deployment, fingerprint and ``d`` the file must be for (its
    ``base_seq`` and ``base_records`` are not compared). :class:`SegmentError` when the file
    does not hold them."""
    header, offset = decode_header(data)
    for name, want in (("deployment", expect.deployment), ("spec", expect.fingerprint)):
        got = header.deployment if name == "deployment" else header.fingerprint
        if got != want:
            raise SegmentError(0, f"belongs to {name} {got!r}, not {want!r}")
    if header.d != expect.d:
        raise SegmentError(0, f"has d = {header.d}, not {expect.d}")
    if header.base_seq > upto:
        raise SegmentError(
            0, f"was compacted up to sequence {header.base_seq}, past the checkpoint's {upto}"
        )
    covered = header.base_seq
    last = 0
    deltas: list[Delta] = []
    while len(deltas) < header.base_records or covered < upto:
        if offset >= len(data):
            if len(deltas) < header.base_records:
                problem = f"ends after {len(deltas)} of its {header.base_records} compacted records"
            else:
                problem = f"ends at sequence {covered}, before the checkpoint's {upto}"
            raise SegmentError(offset, f"{problem} (a truncated or older copy of the file)")
        delta, end = decode_record(data, offset, header.d)
        if delta.seq <= last:
            raise SegmentError(offset, f"record {delta.seq} comes after record {last}")
        if delta.seq > upto:
            raise SegmentError(
                offset, f"record {delta.seq} skips past the checkpoint's sequence {upto}"
            )
        deltas.append(delta)
        last = delta.seq
        covered = max(covered, delta.seq)
        offset = end
    return Committed(header, deltas, keep=offset, dropped=len(data) - offset)


def compacted(
    deltas: Iterable[Delta], *, rolled_before: float, step: int | None, dropped_before: float
) -> list[Delta]:
    """:func:`~aggregator.series.core.compact_records`, without the coarse rows that ended at
    or before ``dropped_before`` (past the coarse retention: dropped from memory too, so a
    file that kept them would never shrink)."""
    return [
        delta
        for delta in compact_records(deltas, rolled_before=rolled_before, step=step)
        if not (delta.coarse and delta.end <= dropped_before)
    ]
