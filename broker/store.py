"""The shuffler's durable state: a write-ahead log of core effects, and its state directory.

A report whose PUBACK a device received is a promise: it is released exactly once or
counted as dropped with a reason. The shuffler keeps that promise across a crash by
writing every effect of :mod:`broker.core` (a report accepted, a pool released as sealed
batches, a batch acknowledged, a round closed...) to an append-only log *before* the effect
takes place outside the process: before the report's PUBACK goes to the broker, before a
batch is published. On start, :meth:`EffectLog.replay` feeds the log back through
:meth:`broker.core.ShufflerCore.apply` and the shuffler continues where it stopped, with its
pools, its duplicate tokens and its unacknowledged batches (re-sent with the same bytes and
``batch_id``, which the aggregator deduplicates).

Durability: each record is one ``write(2)`` to the log file, so it survives a crash of the
process (``kill -9``) as soon as the call returns. It survives a crash of the *machine*
only after ``fsync``: with ``fsync=True`` every record is synced (slow: a disk flush per
report); by default only compactions are. bench/bench_pipeline.py measures both.

Record format (all integers big-endian)::

    type u8 | length u32 | body (length bytes) | crc32(type | length | body) u32

A record cut short at the end of the file (a write the crash interrupted) is discarded
and the file truncated to the last whole record; a damaged record anywhere else raises
:class:`StoreError` naming the file and the offset. The log holds no device id: a sender is
only the 16-byte keyed token of :func:`token_of`, under a key that never leaves the state
directory.

The state directory (``--state-dir``) holds, all mode 0600::

    lock         flock'ed while a shuffler runs: a second one on the same directory refuses
    token.key    32 random bytes: the key of the duplicate tokens (persistent, so a replay
                 after a restart is still recognised as a duplicate)
    signing.key  the Ed25519 key that seals batches (edge/batch_auth.py); signing.pub beside
                 it holds the public key for the aggregator
    effects.log  the write-ahead log
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import logging
import os
import secrets
import struct
import zlib
from collections.abc import Iterable
from pathlib import Path

from broker.core import (
    Accepted,
    Acked,
    Carried,
    Closed,
    Dropped,
    Effect,
    Outboxed,
    Pooled,
    Released,
    Seen,
)
from edge.batch_auth import BatchSigner, load_or_create_signing_key
from edge.errors import CocoError

__all__ = ["EffectLog", "StateDir", "StoreError", "decode_effects", "encode_effect", "token_of"]

logger = logging.getLogger(__name__)

TOKEN_SIZE = 16
_KEY_SIZE = 32
_HEAD = struct.Struct(">BI")
_CRC = struct.Struct(">I")
_REPORT = struct.Struct(">I16sIH")  # round, token, seed, z
_SEEN = struct.Struct(">I16s")
_U32 = struct.Struct(">I")
_TWO_U32 = struct.Struct(">II")
_MAX_RECORD = 1 << 30

_ACCEPTED, _SEEN_T, _POOLED, _RELEASED, _OUTBOXED, _CARRIED, _DROPPED, _CLOSED, _ACKED = range(
    1, 10
)


class StoreError(CocoError):
    """The state directory or its log cannot be used (the message names the file)."""


def token_of(key: bytes, device: str) -> bytes:
    """The keyed token that stands for ``device`` in the duplicate state (BLAKE2b-128)."""
    return hashlib.blake2b(device.encode(), key=key, digest_size=TOKEN_SIZE).digest()


def _messages(messages: tuple[bytes, ...]) -> bytes:
    return _U32.pack(len(messages)) + b"".join(_U32.pack(len(m)) + m for m in messages)


def _read_messages(body: bytes, offset: int) -> tuple[bytes, ...]:
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


_ACCEPTED_HEAD = _HEAD.pack(_ACCEPTED, _REPORT.size)
_ACCEPTED_CRC = zlib.crc32(_ACCEPTED_HEAD)


def encode_accepted(effect: Accepted) -> bytes:
    """:func:`encode_effect` of an :class:`Accepted` (the per-report hot path)."""
    body = _REPORT.pack(effect.round, effect.token, effect.seed, effect.z)
    return _ACCEPTED_HEAD + body + _CRC.pack(zlib.crc32(body, _ACCEPTED_CRC))


def encode_effect(effect: Effect) -> bytes:
    """One log record."""
    match effect:
        case Accepted(round_, token, seed, z):
            kind, body = _ACCEPTED, _REPORT.pack(round_, token, seed, z)
        case Pooled(round_, token, seed, z):
            kind, body = _POOLED, _REPORT.pack(round_, token, seed, z)
        case Seen(round_, token):
            kind, body = _SEEN_T, _SEEN.pack(round_, token)
        case Released(round_, messages):
            kind, body = _RELEASED, _U32.pack(round_) + _messages(messages)
        case Outboxed(messages):
            kind, body = _OUTBOXED, _messages(messages)
        case Carried(source, target):
            kind, body = _CARRIED, _TWO_U32.pack(source, target)
        case Dropped(round_, reason):
            kind, body = _DROPPED, _U32.pack(round_) + reason.encode("ascii")
        case Closed(through):
            kind, body = _CLOSED, _U32.pack(through)
        case Acked(batch_id):
            kind, body = _ACKED, bytes(batch_id)
    head = _HEAD.pack(kind, len(body))
    return head + body + _CRC.pack(zlib.crc32(body, zlib.crc32(head)))


def _decode_body(kind: int, body: bytes) -> Effect:
    if kind in (_ACCEPTED, _POOLED):
        round_, token, seed, z = _REPORT.unpack(body)
        return (Accepted if kind == _ACCEPTED else Pooled)(round_, token, seed, z)
    if kind == _SEEN_T:
        round_, token = _SEEN.unpack(body)
        return Seen(round_, token)
    if kind == _RELEASED:
        return Released(_U32.unpack_from(body)[0], _read_messages(body, 4))
    if kind == _OUTBOXED:
        return Outboxed(_read_messages(body, 0))
    if kind == _CARRIED:
        return Carried(*_TWO_U32.unpack(body))
    if kind == _DROPPED:
        return Dropped(_U32.unpack_from(body)[0], body[4:].decode("ascii"))
    if kind == _CLOSED:
        return Closed(_U32.unpack(body)[0])
    if kind == _ACKED and len(body) == 16:
        return Acked(body)
    raise ValueError(f"unknown record type {kind}")


def decode_effects(data: bytes, *, name: str = "log") -> tuple[list[Effect], int]:
    """The effects in ``data`` and the length of its whole records (a record cut short at
    the end is left out); :class:`StoreError` for a damaged record before the end."""
    effects: list[Effect] = []
    offset, size = 0, len(data)
    while offset < size:
        if size - offset < _HEAD.size:
            break  # a header cut short: the tail of an interrupted write
        kind, length = _HEAD.unpack_from(data, offset)
        end = offset + _HEAD.size + length + _CRC.size
        if length > _MAX_RECORD:
            raise StoreError(f"{name}: record at offset {offset} claims {length} bytes")
        if end > size:
            break  # cut short at the end of the file
        body = data[offset + _HEAD.size : end - _CRC.size]
        (crc,) = _CRC.unpack_from(data, end - _CRC.size)
        if zlib.crc32(body, zlib.crc32(data[offset : offset + _HEAD.size])) != crc:
            raise StoreError(f"{name}: damaged record (bad checksum) at offset {offset}")
        try:
            effects.append(_decode_body(kind, body))
        except (ValueError, struct.error) as exc:
            raise StoreError(f"{name}: bad record at offset {offset}: {exc}") from None
        offset = end
    return effects, offset


class EffectLog:
    """The append-only log of one shuffler's effects (module docstring)."""

    def __init__(self, path: Path, *, fsync: bool = False) -> None:
        self.path = Path(path)
        self.fsync = fsync
        self._fd: int | None = None
        self._staged = bytearray()
        self.size = 0
        self.failure: OSError | None = None
        """The first write error: from then on nothing more is written (a record after a
        torn one would be unreadable) and every write raises, so nothing staged since can
        be acknowledged as written."""

    def replay(self) -> list[Effect]:
        """Every effect in the log, oldest first; truncates a record cut short at its end.
        Opens the log for appending."""
        try:
            data = self.path.read_bytes()
        except FileNotFoundError:
            data = b""
        except OSError as exc:
            raise StoreError(f"cannot read the shuffler log {self.path}: {exc}") from exc
        effects, whole = decode_effects(data, name=str(self.path))
        if whole < len(data):
            logger.warning(
                "shuffler log %s: discarding an interrupted record (%d bytes) at its end",
                self.path,
                len(data) - whole,
            )
            os.truncate(self.path, whole)
        self._open()
        self.size = whole
        return effects

    def _open(self) -> None:
        flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND | getattr(os, "O_NOFOLLOW", 0)
        try:
            self._fd = os.open(self.path, flags, 0o600)
        except OSError as exc:
            raise StoreError(f"cannot open the shuffler log {self.path}: {exc}") from exc

    def append(self, effect: Effect) -> None:
        """Write one record (one ``write(2)``, with anything staged before it; synced if
        ``fsync``)."""
        self.stage(effect)
        self.flush()

    def stage(self, effect: Effect) -> None:
        """Add one record to the next write (:meth:`flush`, or any write after this):
        nothing is on disk until then. The ingest path stages the reports of one socket
        read and writes them at once, before any of their PUBACKs."""
        self._check()
        self._staged += (
            encode_accepted(effect) if type(effect) is Accepted else encode_effect(effect)
        )

    def extend(self, effects: Iterable[Effect]) -> None:
        """Write several records (after anything staged) in one ``write(2)``."""
        self._check()
        self._staged += b"".join(encode_effect(effect) for effect in effects)
        self.flush()

    @property
    def staged(self) -> int:
        """Bytes staged and not yet written."""
        return len(self._staged)

    def flush(self) -> None:
        """Write what is staged (one ``write(2)``; synced if ``fsync``). On an error the
        staged records are dropped: the caller fails, and none of them was acknowledged."""
        self._check()
        if not self._staged:
            return
        data, self._staged = self._staged, bytearray()
        self.write(data)

    def write(self, data: bytes | bytearray) -> None:
        self._check()
        if self._fd is None:
            raise StoreError(f"the shuffler log {self.path} is not open")
        view = memoryview(data)
        try:
            while view:
                written = os.write(self._fd, view)
                view = view[written:]
            if self.fsync:
                os.fsync(self._fd)
        except OSError as exc:
            self.failure = exc
            raise
        self.size += len(data)

    def _check(self) -> None:
        if self.failure is not None:
            raise OSError(f"the shuffler log {self.path} failed earlier: {self.failure}")

    def compact(self, effects: Iterable[Effect]) -> None:
        """Replace the log by ``effects`` (a snapshot of the state), atomically: written to
        a temporary file, synced, then renamed over the log. Anything staged is written
        first (the snapshot includes it, and it must not follow the snapshot)."""
        self.flush()  # raises after a failed write: a log that failed is never replaced
        temporary = self.path.with_name(self.path.name + ".compact")
        data = b"".join(encode_effect(effect) for effect in effects)
        flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_NOFOLLOW", 0)
        fd = os.open(temporary, flags, 0o600)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(temporary, self.path)
        _fsync_directory(self.path.parent)
        self.close()
        self._open()
        self.size = len(data)

    def close(self) -> None:
        """Write what is staged (unless that fails: then it was never acknowledged) and
        close the log."""
        if self._fd is not None:
            if self.failure is None:
                with contextlib.suppress(OSError):
                    self.flush()
            os.close(self._fd)
            self._fd = None


def _fsync_directory(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class StateDir:
    """The shuffler's state directory, locked for as long as the object is open."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self._lock_fd: int | None = None

    def __enter__(self) -> StateDir:
        try:
            self.path.mkdir(parents=True, exist_ok=True, mode=0o700)
            fd = os.open(self.path / "lock", os.O_RDWR | os.O_CREAT, 0o600)
        except OSError as exc:
            raise StoreError(f"cannot use the state directory {self.path}: {exc}") from exc
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            raise StoreError(
                f"another shuffler is running on the state directory {self.path} "
                "(one shuffler per state directory and deployment)"
            ) from None
        self._lock_fd = fd
        return self

    def __exit__(self, *_: object) -> None:
        if self._lock_fd is not None:
            with contextlib.suppress(OSError):
                fcntl.flock(self._lock_fd, fcntl.LOCK_UN)
            os.close(self._lock_fd)
            self._lock_fd = None

    def token_key(self) -> bytes:
        """The persistent key of the duplicate tokens (created on first use)."""
        path = self.path / "token.key"
        try:
            key = path.read_bytes()
        except FileNotFoundError:
            key = secrets.token_bytes(_KEY_SIZE)
            _write_private(path, key)
            return key
        except OSError as exc:
            raise StoreError(f"cannot read {path}: {exc}") from exc
        if len(key) != _KEY_SIZE:
            raise StoreError(f"{path} must hold {_KEY_SIZE} bytes, got {len(key)}")
        return key

    def signer(self, deployment: str, key_file: Path | None = None) -> BatchSigner:
        """The batch signer (``key_file``, default ``signing.key`` here, created if absent);
        writes its public key to ``signing.pub`` beside the state."""
        key = load_or_create_signing_key(key_file or self.path / "signing.key")
        signer = BatchSigner(key, deployment)
        public = self.path / "signing.pub"
        text = signer.public_key_hex + "\n"
        with contextlib.suppress(FileNotFoundError):
            if public.read_text() == text:
                return signer
        temporary = public.with_name("signing.pub.tmp")
        temporary.write_text(text)
        os.replace(temporary, public)
        return signer

    def log(self, *, fsync: bool = False) -> EffectLog:
        return EffectLog(self.path / "effects.log", fsync=fsync)


def _write_private(path: Path, data: bytes) -> None:
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0)
    try:
        fd = os.open(path, flags, 0o600)
    except OSError as exc:
        raise StoreError(f"cannot create {path}: {exc}") from exc
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
