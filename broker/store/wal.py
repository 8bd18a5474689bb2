"""The shuffler's durable state: a write-ahead log of core effects, and its state directory.

A report whose PUBACK a device received is a promise: it is released exactly once or
counted as dropped with a reason. The shuffler keeps that promise across a crash by
writing every effect of :mod:`broker.core` (reports admitted, a pool released as sealed
batches, a batch acknowledged, rounds closed...) to an append-only log *before* the effect
takes place outside the process: before the reports' PUBACKs go to the broker, before a
batch is published. On start, :meth:`EffectLog.replay` feeds the log back through
:meth:`broker.core.machine.ShufflerCore.apply` and the shuffler continues where it stopped, with its
pools, its duplicate tokens and its unacknowledged batches (re-sent with the same bytes and
``batch_id``, which the aggregator deduplicates).

Durability: each write is one ``write(2)`` to the log file, so it survives a crash of the
process (``kill -9``) as soon as the call returns. It survives a crash of the *machine*
only after ``fsync``: with ``fsync=True`` every write is synced; by default only
compactions are. bench/bench_pipeline.py measures both.

Format and damage (:mod:`broker.store.records`): a checked file header, then framed records with
a marker and separate checksums over each record's head and body. Only the last record can
be torn by a crash: a record cut short (or garbled) at the end, with no valid record after
it, is discarded and the file truncated to the last whole record, with a WARNING. Anything
else that does not read, a damaged length or body with intact records after it, is
*damage*: :class:`LogDamagedError` names the file and the offset and the shuffler refuses to
start; ``coco shuffler repair`` (:mod:`broker.store.repair`) salvages every intact record.
A version-1 log (no header) is read through :mod:`broker.store.logv1` and rewritten.

A failed write (a full disk) writes nothing: the file is cut back to its last whole record
(``ftruncate``), and the error is :class:`LogFullError` when the disk is full (the caller may
retry later) or sticky otherwise (nothing more is written: see :attr:`EffectLog.failure`). A
compaction that does not fit leaves the log as it was (:class:`LogFullError` too). Every
error names the file that could not be written, in one line (a start on a full disk ends
with it); a key file that cannot be written whole is removed, not left short.

The log holds no device id: a sender is only the 8-byte keyed token of :func:`token_of`,
under a key that never leaves the state directory.

The state directory (``--state-dir``) holds, all mode 0600::

    lock         flock'ed while a shuffler runs: a second one on the same directory refuses
    token.key    32 random bytes: the key of the duplicate tokens (persistent, so a replay
                 after a restart is still recognised as a duplicate)
    signing.pub  the public key of the batch signing key in use (for the aggregator)
    effects.log  the write-ahead log
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import logging
import os
import secrets
from collections.abc import Iterable
from pathlib import Path

from broker.core.effects import Effect
from broker.store.logv1 import V1Error, decode_v1
from broker.store.records import (
    FILE_HEADER_SIZE,
    MAGIC,
    MARKER,
    TYPE_NAMES,
    Problem,
    encode_effect,
    encode_effects,
    file_header,
    read_header,
    scan,
)
from edge.errors import CocoError

__all__ = [
    "EffectLog",
    "LogDamagedError",
    "LogFullError",
    "StateDir",
    "StoreError",
    "token_of",
]

logger = logging.getLogger("broker.store")  # a fixed name: broker/__init__.py, "Loggers"

_KEY_SIZE = 32
_FULL = (errno.ENOSPC, errno.EDQUOT)


class StoreError(CocoError):
    """The state directory or its log cannot be used (the message names the file)."""


class LogDamagedError(StoreError):
    """The log is damaged before its end (not a torn tail): refuse, repair."""

    def __init__(self, path: Path, problem: Problem) -> None:
        kind = "" if problem.kind is None else f" ({TYPE_NAMES.get(problem.kind, '?')} record)"
        super().__init__(
            f"shuffler log {path} is damaged at offset {problem.offset}{kind}: "
            f"{problem.reason}, and intact records follow at offset {problem.next_good}; "
            f"refusing to start (run: coco shuffler repair --state-dir {path.parent})"
        )
        self.problem = problem


class LogFullError(OSError):
    """A write failed because the disk is full; nothing of it is in the log. Its
    ``filename`` is the file that could not be written: one line, ``cannot write <file>:
    <reason>``."""

    def __str__(self) -> str:
        return f"cannot write {self.filename}: {self.strerror}"


def token_of(key: bytes, device: str) -> int:
    """The keyed token that stands for ``device`` in the duplicate state: the first 8 bytes
    (little-endian u64) of its keyed BLAKE2b-128 (broker/core/state.py: why 8 bytes suffice)."""
    digest = hashlib.blake2b(device.encode(), key=key, digest_size=16).digest()
    return int.from_bytes(digest[:8], "little")


def looks_like_v1(data: bytes) -> bool:
    """Whether ``data`` (no valid version-2 header) is a version-1 log: it starts with a
    record type 1-9. Anything that resembles a version-2 header (most of its magic, or a
    record marker where the first record starts) is a damaged one, never read as a
    version-1 log (which would find nothing in it and truncate it)."""
    resembles = sum(a == b for a, b in zip(data[: len(MAGIC)], MAGIC, strict=False)) >= 4
    marker = data[FILE_HEADER_SIZE : FILE_HEADER_SIZE + len(MARKER)] == MARKER
    return not resembles and not marker and len(data) >= 5 and 1 <= data[0] <= 9


def read_log(path: Path, round_seconds: int) -> tuple[list[Effect], int, int | None, int]:
    """``(effects, whole, salt, size)``: the effects of the log at ``path`` and the length
    of its whole records (``salt`` None: version 1 or empty). :class:`LogDamagedError` for
    damage before the end; a torn tail is left out of ``whole``."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return [], 0, None, 0
    except OSError as exc:
        raise StoreError(f"cannot read the shuffler log {path}: {exc}") from exc
    if not data:
        return [], 0, None, 0
    salt = read_header(data)
    if salt is None:
        if len(data) < FILE_HEADER_SIZE and MAGIC.startswith(data[: len(MAGIC)]):
            return [], 0, None, len(data)  # a header cut short: nothing was written
        if not looks_like_v1(data):
            raise StoreError(
                f"shuffler log {path}: damaged file header; refusing to start "
                f"(run: coco shuffler repair --state-dir {path.parent})"
            )
        try:
            effects, whole = decode_v1(data, round_seconds, name=str(path))
        except V1Error as exc:
            raise StoreError(
                f"{exc}: neither a readable version-1 log nor a version-2 one; refusing to "
                f"start (run: coco shuffler repair --state-dir {path.parent})"
            ) from None
        logger.info("shuffler log %s: version 1, read and rewritten as version 2", path)
        return effects, whole, None, len(data)
    result = scan(data, FILE_HEADER_SIZE, salt)
    problem = result.problem
    if problem is not None and problem.next_good is not None:
        raise LogDamagedError(path, problem)
    return result.effects, result.end, salt, len(data)


class EffectLog:
    """The append-only log of one shuffler's effects (module docstring)."""

    def __init__(self, path: Path, *, fsync: bool = False, round_seconds: int = 60) -> None:
        self.path = Path(path)
        self.fsync = fsync
        self.round_seconds = round_seconds
        """Only to read a version-1 log, whose closed rounds are round numbers."""
        self._fd: int | None = None
        self._salt = 0
        self._staged = bytearray()
        self.size = 0
        self.version = 2
        self.failure: OSError | None = None
        """The first write error that could not be undone: from then on nothing more is
        written and every write raises, so nothing staged since can be acknowledged."""

    def replay(self) -> list[Effect]:
        """Every effect in the log, oldest first; truncates a torn tail (with a WARNING);
        raises :class:`LogDamagedError` for damage before the end. Opens the log for appending
        (a version-1 log is rewritten at the next :meth:`compact`)."""
        effects, whole, salt, size = read_log(self.path, self.round_seconds)
        if whole < size:
            logger.warning(
                "shuffler log %s: discarding a torn record (%d bytes) at its end, offset %d",
                self.path,
                size - whole,
                whole,
            )
            os.truncate(self.path, whole)
        if salt is None and whole:  # version 1: appends go to a fresh version-2 file
            self.version = 1
            self.compact(effects)
            return effects
        self._open()
        if salt is None:  # empty
            header, self._salt = file_header()
            self.write(header)
        else:
            self._salt = salt
            self.size = whole
        return effects

    def _open(self) -> None:
        flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND | getattr(os, "O_NOFOLLOW", 0)
        try:
            self._fd = os.open(self.path, flags, 0o600)
        except OSError as exc:
            raise StoreError(f"cannot open the shuffler log {self.path}: {exc}") from exc
        self.size = os.fstat(self._fd).st_size

    def append(self, effect: Effect) -> None:
        """Write one record (one ``write(2)``, with anything staged before it)."""
        self.stage(effect)
        self.flush()

    def stage(self, effect: Effect) -> None:
        """Add one record to the next write (:meth:`flush`): nothing is on disk until then."""
        self._check()
        self._staged += encode_effect(effect, self._salt)

    def extend(self, effects: Iterable[Effect]) -> None:
        """Write several records (after anything staged) in one ``write(2)``."""
        self._check()
        self._staged += encode_effects(effects, self._salt)
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
        """Append ``data`` whole, or nothing: after an error the file is cut back to its
        size before the write (:class:`LogFullError` when the disk is full; any other error,
        or a failed cut, is sticky)."""
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
            try:
                os.ftruncate(self._fd, self.size)  # no torn record in the middle of the log
            except OSError:
                self.failure = exc
                raise exc from None
            if exc.errno in _FULL:
                raise LogFullError(exc.errno, exc.strerror, str(self.path)) from exc
            self.failure = exc
            raise
        self.size += len(data)

    def _check(self) -> None:
        if self.failure is not None:
            raise OSError(f"the shuffler log {self.path} failed earlier: {self.failure}")

    def compact(self, effects: Iterable[Effect]) -> bool:
        """Replace the log by ``effects`` (a snapshot of the state), atomically: written to
        a temporary file, synced, then renamed over the log. Anything staged is written
        first. A snapshot larger than the log it would replace is not written (compaction
        never grows the log): returns whether it replaced the log."""
        self.flush()  # raises after a failed write: a log that failed is never replaced
        header, salt = file_header()
        data = header + encode_effects(effects, salt)
        if self.version == 2 and self._fd is not None and len(data) >= self.size:
            return False
        temporary = self.path.with_name(self.path.name + ".compact")
        flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_NOFOLLOW", 0)
        fd = os.open(temporary, flags, 0o600)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            os.fsync(fd)
        except OSError as exc:
            os.close(fd)
            with contextlib.suppress(OSError):
                temporary.unlink()
            if exc.errno in _FULL:  # the log is as it was: compact later
                raise LogFullError(exc.errno, exc.strerror, str(temporary)) from exc
            raise
        os.close(fd)
        os.replace(temporary, self.path)
        _fsync_directory(self.path.parent)
        self.close()
        self._open()
        self._salt = salt
        self.version = 2
        self.size = len(data)
        return True

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

    def owner_id(self) -> str:
        """This state directory's persistent id (``owner.id``, created once): the owner in
        a shard lease, so a restart on the same directory takes its shard over at once."""
        path = self.path / "owner.id"
        try:
            text = path.read_text().strip()
        except FileNotFoundError:
            text = secrets.token_hex(16)
            _write_private(path, (text + "\n").encode())
            return text
        except OSError as exc:
            raise StoreError(f"cannot read {path}: {exc}") from exc
        if len(text) != 32 or any(c not in "0123456789abcdef" for c in text):
            raise StoreError(f"{path} must hold 32 lowercase hex digits")
        return text

    def publish_public_key(self, public_key_hex: str) -> None:
        """Write ``signing.pub`` (the key that verifies this shuffler's batches)."""
        public = self.path / "signing.pub"
        text = public_key_hex + "\n"
        with contextlib.suppress(FileNotFoundError):
            if public.read_text() == text:
                return
        temporary = public.with_name("signing.pub.tmp")
        try:
            temporary.write_text(text)
        except OSError as exc:
            with contextlib.suppress(OSError):
                temporary.unlink()
            raise StoreError(f"cannot write {public}: {exc.strerror or exc}") from exc
        os.replace(temporary, public)

    def session_seen(self) -> bool:
        """Whether the broker ever held an ingest session for this state directory
        (``session``, written by :meth:`note_session`): a new session after one is a loss."""
        return (self.path / "session").is_file()

    def note_session(self) -> None:
        """Remember that the broker held (or now holds) an ingest session for this state
        directory (once; :class:`StoreError` if it cannot be written)."""
        if not self.session_seen():
            _write_private(self.path / "session", b"the broker held an ingest session\n")

    def log(self, *, fsync: bool = False, round_seconds: int = 60) -> EffectLog:
        return EffectLog(self.path / "effects.log", fsync=fsync, round_seconds=round_seconds)


def _write_private(path: Path, data: bytes) -> None:
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0)
    try:
        fd = os.open(path, flags, 0o600)
    except OSError as exc:
        raise StoreError(f"cannot create {path}: {exc}") from exc
    try:
        if os.write(fd, data) != len(data):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        os.fsync(fd)
    except OSError as exc:
        # not left empty or short: the next start would refuse the file, space or not
        os.close(fd)
        with contextlib.suppress(OSError):
            path.unlink()
        raise StoreError(f"cannot write {path}: {exc.strerror or exc}") from exc
    os.close(fd)
