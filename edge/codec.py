"""The binary wire format: reports (device -> ingress, version 1), shuffled batches and
release manifests (shuffler -> aggregator, version 2; version 1 still decoded).

Like :mod:`edge.device` this module runs unchanged on CPython 3.11+ and MicroPython: it
imports nothing, encodes with ``int.to_bytes`` after an explicit range check (so a value
out of range raises instead of being truncated), and decodes with ``int.from_bytes``.
All integers are unsigned and big-endian (network order).

Report, exactly ``REPORT_SIZE = 16`` bytes::

    offset  size  field
    0       1     version      u8   = 1
    1       1     kind         u8   = 1 (report)
    2       4     fingerprint  u32  MechanismSpec.fingerprint_int
    6       4     round        u32
    10      4     seed         u32  the report's hash seed
    14      2     z            u16  the randomiser's output, in [0, t)

Shuffled batch, exactly ``BATCH_HEADER_SIZE + RECORD_SIZE * count + 4 = 34 + 6 count``
bytes (version 2; a version-1 batch is the same without its last 4 bytes, ``30 + 6 count``)::

    offset      size  field
    0           1     version       u8   = 2 (1: no round_seconds)
    1           1     kind          u8   = 2 (batch)
    2           4     fingerprint   u32
    6           4     round         u32
    10          16    batch_id      random bytes from the shuffler's CSPRNG (deduplication)
    26          4     count         u32
    30          6 i   record i:     seed u32 | z u16, in the shuffled order
    30 + 6 n    4     round_seconds u32  the length of ``round``, in [1, 86400] (version 2)

A round is a time: round ``r`` of length ``L`` is Unix time ``[r L, (r + 1) L)``. Version 2
carries ``L``, so that a receiver tells apart rounds counted before and after a change of
``round_seconds``; it is the last field, so every other offset is version 1's (the batch id
at 10, the count at 26). A version-1 batch or manifest is read under the round length the
receiver knows (the announced one).

Release manifest (shuffler -> aggregator: which batches one release made, and the rounds
its reports were sent in), exactly ``30 + 20 nbatches + 4 + 12 nsources + 4`` bytes
(version 2; version 1 without the last 4 bytes)::

    offset       size  field
    0            1     version      u8   = 2 (1: no round_seconds)
    1            1     kind         u8   = 3 (manifest)
    2            4     fingerprint  u32
    6            4     round        u32  the round number its batches bear
    10           16    release_id   random bytes from the shuffler's CSPRNG
    26           4     nbatches     u32
    30 + 20 i    20    batch i:     batch_id (16 bytes) | count u32, in release order
    B            4     nsources     u32  (B = 30 + 20 nbatches)
    B + 4 + 12 j 12    source j:    round u32 | round_seconds u32 | count u32
    E            4     round_seconds u32  the length of ``round`` (version 2)

(``E = B + 4 + 12 nsources``.)

A *source* is a round the release's reports were sent in (the round in the reports), with
the round length it was counted in, and how many of the release's reports it holds: a pool
carried into a later round keeps its reports' own rounds here. The counts of the sources
add up to those of the batches. ``round = 0xFFFFFFFF`` with ``round_seconds = 0`` stands
for reports whose round is unknown (a state recovered from an older log).

Decoding checks, in this order, and raises :class:`CodecError` with the first failure:
fewer than 2 bytes (``"bad_length"``), version (``"bad_version"``), kind (``"bad_kind"``),
the length (``"bad_length"``: a report that is not 16 bytes, a batch shorter than its
header) and, for a batch, that the length is exactly ``30 + 6 count`` (version 1) or
``34 + 6 count`` (version 2) (``"bad_count"``; for a manifest ``30 + 20 nbatches + 4 + 12
nsources``, plus 4 in version 2), then a version-2 ``round_seconds`` outside ``[1, 86400]``
(``"bad_field"``), then, for a manifest, that its sources' counts add up to its batches'
(``"bad_count"``).
Version and kind come first so that a message of another version or kind is counted as
such whatever its length. The codec does not know ``t``: checking ``z < t`` and the
fingerprint against the current spec is the receiver's job.

Encoding raises :class:`CodecError` with ``"bad_field"`` for a field that is not an ``int``
(``bool`` included) or is out of its range, or a ``batch_id`` that is not 16 bytes, and
``"bad_count"`` when ``seeds`` and ``zs`` differ in length.
"""

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Sequence

    Buffer = bytes | bytearray | memoryview

VERSION = 1
"""The version of a report (and of the oldest batches and manifests)."""
BATCH_VERSION = 2
"""The version of the batches and manifests encoded with a ``round_seconds``."""
TRAILER_SIZE = 4
"""The ``round_seconds`` u32 that ends a version-2 batch or manifest."""
MAX_ROUND_SECONDS = 86_400
KIND_REPORT = 1
KIND_BATCH = 2
KIND_MANIFEST = 3
REPORT_SIZE = 16
BATCH_ID_SIZE = 16
BATCH_HEADER_SIZE = 30
RECORD_SIZE = 6
COUNT_OFFSET = 26
MANIFEST_HEADER_SIZE = 30
MANIFEST_ENTRY_SIZE = 20
MANIFEST_SOURCE_SIZE = 12
U16_MAX = 0xFFFF
U32_MAX = 0xFFFFFFFF
UNKNOWN_SOURCE = (U32_MAX, 0)
"""``(round, round_seconds)`` of a manifest source whose round is not known."""
REASONS = ("bad_length", "bad_version", "bad_kind", "bad_count", "bad_field")


class CodecError(ValueError):
    """A message that is not valid wire format (or fields that cannot be encoded).

    ``reason`` is one of :data:`REASONS`, a bounded label for rejection counters.
    """

    def __init__(self, message: str, reason: str) -> None:
        super().__init__(message)
        self.reason = reason


def _check_uint(name: str, value: int, maximum: int) -> None:
    # isinstance(True, int) is False on MicroPython but True on CPython: test bool first.
    if isinstance(value, bool) or not isinstance(value, int):
        raise CodecError(f"{name} must be an int, got {value!r}", "bad_field")
    if value < 0 or value > maximum:
        raise CodecError(f"{name} must be in [0, {maximum}], got {value}", "bad_field")


def _u32(value: int) -> bytes:
    return value.to_bytes(4, "big")


def _read_u32(payload: "Buffer", offset: int) -> int:
    return int.from_bytes(payload[offset : offset + 4], "big")


def _read_u16(payload: "Buffer", offset: int) -> int:
    return int.from_bytes(payload[offset : offset + 2], "big")


def _check_prefix(payload: "Buffer", kind: int) -> int:
    """The length of the version's trailer (0, or :data:`TRAILER_SIZE` for version 2)."""
    if len(payload) < 2:
        raise CodecError(f"message of {len(payload)} bytes has no version and kind", "bad_length")
    if payload[0] != VERSION and (kind == KIND_REPORT or payload[0] != BATCH_VERSION):
        raise CodecError(f"wire version {payload[0]} is not supported", "bad_version")
    if payload[1] != kind:
        raise CodecError(f"message kind {payload[1]} is not {kind}", "bad_kind")
    return TRAILER_SIZE if payload[0] == BATCH_VERSION else 0


def _check_length(round_seconds: int) -> None:
    _check_uint("round_seconds", round_seconds, MAX_ROUND_SECONDS)
    if round_seconds == 0:
        raise CodecError("round_seconds must be in [1, 86400], got 0", "bad_field")


def encode_trailer(round_seconds: int) -> bytes:
    """What ends a batch or manifest of ``round_seconds`` (0: none, version 1)."""
    if round_seconds == 0 and not isinstance(round_seconds, bool):
        return b""
    _check_length(round_seconds)
    return _u32(round_seconds)


def round_seconds_of(payload: "Buffer") -> int:
    """The ``round_seconds`` of a batch or manifest already decoded (0 for version 1)."""
    if payload[0] != BATCH_VERSION:
        return 0
    return _read_u32(payload, len(payload) - TRAILER_SIZE)


def encode_report(fingerprint: int, round_: int, seed: int, z: int) -> bytes:
    """The 16-byte report ``version | kind | fingerprint | round | seed | z``."""
    _check_uint("fingerprint", fingerprint, U32_MAX)
    _check_uint("round", round_, U32_MAX)
    _check_uint("seed", seed, U32_MAX)
    _check_uint("z", z, U16_MAX)
    return (
        bytes([VERSION, KIND_REPORT])
        + _u32(fingerprint)
        + _u32(round_)
        + _u32(seed)
        + z.to_bytes(2, "big")
    )


def decode_report(payload: "Buffer") -> "tuple[int, int, int, int, int]":
    """``(version, fingerprint, round_, seed, z)`` of a report; :class:`CodecError` if invalid."""
    _check_prefix(payload, KIND_REPORT)
    if len(payload) != REPORT_SIZE:
        raise CodecError(f"a report is {REPORT_SIZE} bytes, got {len(payload)}", "bad_length")
    return (
        payload[0],
        _read_u32(payload, 2),
        _read_u32(payload, 6),
        _read_u32(payload, 10),
        _read_u16(payload, 14),
    )


def encode_batch_header(
    fingerprint: int, round_: int, batch_id: bytes, count: int, round_seconds: int = 0
) -> bytes:
    """The 30-byte header of a batch of ``count`` records (for encoders of the records):
    version 2 with a ``round_seconds``, whose :func:`encode_trailer` must then follow the
    records; version 1 without (0)."""
    version = VERSION if round_seconds == 0 else BATCH_VERSION
    encode_trailer(round_seconds)  # CodecError if out of range
    _check_uint("fingerprint", fingerprint, U32_MAX)
    _check_uint("round", round_, U32_MAX)
    if not isinstance(batch_id, (bytes, bytearray)) or len(batch_id) != BATCH_ID_SIZE:
        raise CodecError(f"batch_id must be {BATCH_ID_SIZE} bytes, got {batch_id!r}", "bad_field")
    if isinstance(count, bool) or not isinstance(count, int) or count < 0 or count > U32_MAX:
        raise CodecError(f"count must be in [0, {U32_MAX}], got {count!r}", "bad_count")
    return (
        bytes([version, KIND_BATCH])
        + _u32(fingerprint)
        + _u32(round_)
        + bytes(batch_id)
        + _u32(count)
    )


def decode_batch_header(payload: "Buffer") -> "tuple[int, int, bytes, int]":
    """``(fingerprint, round_, batch_id, count)`` of a batch whose length is fully checked.

    After this returns, record ``i`` is the 6 bytes at ``BATCH_HEADER_SIZE + 6 i``.
    """
    trailer = _check_prefix(payload, KIND_BATCH)
    n = len(payload)
    if n < BATCH_HEADER_SIZE:
        raise CodecError(
            f"a batch has a {BATCH_HEADER_SIZE}-byte header, got {n} bytes", "bad_length"
        )
    count = _read_u32(payload, COUNT_OFFSET)
    if n != BATCH_HEADER_SIZE + RECORD_SIZE * count + trailer:
        raise CodecError(
            f"a batch of {count} records is "
            f"{BATCH_HEADER_SIZE + RECORD_SIZE * count + trailer} bytes, got {n}",
            "bad_count",
        )
    if trailer:
        _check_length(_read_u32(payload, n - trailer))
    return (
        _read_u32(payload, 2),
        _read_u32(payload, 6),
        bytes(payload[10 : 10 + BATCH_ID_SIZE]),
        count,
    )


def encode_batch(
    fingerprint: int,
    round_: int,
    batch_id: bytes,
    seeds: "Sequence[int]",
    zs: "Sequence[int]",
    *,
    round_seconds: int = 0,
) -> bytes:
    """A batch of the records ``(seeds[i], zs[i])`` in the given (shuffled) order, of a
    round of ``round_seconds`` (version 2; 0: version 1)."""
    if len(seeds) != len(zs):
        raise CodecError(f"{len(seeds)} seeds but {len(zs)} z values", "bad_count")
    out = bytearray(encode_batch_header(fingerprint, round_, batch_id, len(seeds), round_seconds))
    for i in range(len(seeds)):
        _check_uint("seed", seeds[i], U32_MAX)
        _check_uint("z", zs[i], U16_MAX)
        out += _u32(seeds[i])
        out += zs[i].to_bytes(2, "big")
    out += encode_trailer(round_seconds)
    return bytes(out)


def decode_batch(payload: "Buffer") -> "tuple[int, int, bytes, list[int], list[int]]":
    """``(fingerprint, round_, batch_id, seeds, zs)`` of a batch; :class:`CodecError` if invalid."""
    fingerprint, round_, batch_id, count = decode_batch_header(payload)
    seeds = []
    zs = []
    offset = BATCH_HEADER_SIZE
    for _ in range(count):
        seeds.append(_read_u32(payload, offset))
        zs.append(_read_u16(payload, offset + 4))
        offset += RECORD_SIZE
    return fingerprint, round_, batch_id, seeds, zs


def encode_manifest(
    fingerprint: int,
    round_: int,
    release_id: bytes,
    entries: "Sequence[tuple[bytes, int]]",
    sources: "Sequence[tuple[int, int, int]]",
    *,
    round_seconds: int = 0,
) -> bytes:
    """The manifest of one release: its batches ``(batch_id, count)`` in release order and
    its sources ``(round, round_seconds, count)``, whose counts add up to the batches'; of
    a round of ``round_seconds`` (version 2; 0: version 1)."""
    trailer = encode_trailer(round_seconds)
    _check_uint("fingerprint", fingerprint, U32_MAX)
    _check_uint("round", round_, U32_MAX)
    if not isinstance(release_id, (bytes, bytearray)) or len(release_id) != BATCH_ID_SIZE:
        raise CodecError(
            f"release_id must be {BATCH_ID_SIZE} bytes, got {release_id!r}", "bad_field"
        )
    _check_uint("nbatches", len(entries), U32_MAX)
    _check_uint("nsources", len(sources), U32_MAX)
    out = bytearray([BATCH_VERSION if trailer else VERSION, KIND_MANIFEST])
    out += _u32(fingerprint) + _u32(round_) + bytes(release_id) + _u32(len(entries))
    total = 0
    for batch_id, count in entries:
        if not isinstance(batch_id, (bytes, bytearray)) or len(batch_id) != BATCH_ID_SIZE:
            raise CodecError(
                f"batch_id must be {BATCH_ID_SIZE} bytes, got {batch_id!r}", "bad_field"
            )
        _check_uint("count", count, U32_MAX)
        total += count
        out += bytes(batch_id) + _u32(count)
    out += _u32(len(sources))
    for source_round, length, count in sources:
        _check_uint("source round", source_round, U32_MAX)
        _check_uint("round_seconds", length, U32_MAX)
        _check_uint("count", count, U32_MAX)
        total -= count
        out += _u32(source_round) + _u32(length) + _u32(count)
    if total != 0:
        raise CodecError("the sources' counts do not add up to the batches'", "bad_count")
    return bytes(out + trailer)


def decode_manifest(
    payload: "Buffer",
) -> "tuple[int, int, bytes, list[tuple[bytes, int]], list[tuple[int, int, int]]]":
    """``(fingerprint, round_, release_id, [(batch_id, count), ...], [(round,
    round_seconds, count), ...])`` of a manifest; :class:`CodecError` if invalid."""
    trailer = _check_prefix(payload, KIND_MANIFEST)
    n = len(payload) - trailer
    if n < MANIFEST_HEADER_SIZE:
        raise CodecError(
            f"a manifest has a {MANIFEST_HEADER_SIZE}-byte header, got {n + trailer} bytes",
            "bad_length",
        )
    nbatches = _read_u32(payload, COUNT_OFFSET)
    offset = MANIFEST_HEADER_SIZE + MANIFEST_ENTRY_SIZE * nbatches
    if n < offset + 4:
        raise CodecError(
            f"a manifest of {nbatches} batches is at least {offset + 4 + trailer} bytes, "
            f"got {n + trailer}",
            "bad_count",
        )
    nsources = _read_u32(payload, offset)
    if n != offset + 4 + MANIFEST_SOURCE_SIZE * nsources:
        raise CodecError(
            f"a manifest of {nbatches} batches and {nsources} sources is "
            f"{offset + 4 + MANIFEST_SOURCE_SIZE * nsources + trailer} bytes, got {n + trailer}",
            "bad_count",
        )
    if trailer:
        _check_length(_read_u32(payload, n))
    entries = []
    total = 0
    at = MANIFEST_HEADER_SIZE
    for _ in range(nbatches):
        count = _read_u32(payload, at + 16)
        entries.append((bytes(payload[at : at + BATCH_ID_SIZE]), count))
        total += count
        at += MANIFEST_ENTRY_SIZE
    sources = []
    at = offset + 4
    for _ in range(nsources):
        count = _read_u32(payload, at + 8)
        sources.append((_read_u32(payload, at), _read_u32(payload, at + 4), count))
        total -= count
        at += MANIFEST_SOURCE_SIZE
    if total != 0:
        raise CodecError("the sources' counts do not add up to the batches'", "bad_count")
    return (
        _read_u32(payload, 2),
        _read_u32(payload, 6),
        bytes(payload[10 : 10 + BATCH_ID_SIZE]),
        entries,
        sources,
    )
