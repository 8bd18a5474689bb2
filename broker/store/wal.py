"""The shuffler's durable state: a write-ahead log of core effects, and its state directory.

A report whose PUBACK a device received is a promise: it is released exactly once or
counted as dropped with a reason. The shuffler keeps that promise across a crash by
writing every effect of :mod:`broker.core` (reports admitted, a pool released as sealed
batches, a batch acknowledged, rounds closed...) to an append-only log *before* the effect
takes place outside the process: before the reports' PUBACKs go to the broker, before a
batch is published. On start, :meth:`EffectLog.recover` feeds the log back through
:meth:`broker.core.machine.ShufflerCore.apply` and the shuffler continues where it stopped, with its
pools, its duplicate tokens and its unacknowledged batches (re-sent with the same bytes and
``batch_id``, which the aggregator deduplicates).

Durability: each write is one ``write(2)`` to the log file, so it survives a crash of the
process (``kill -9``) as soon as the call returns. It survives a crash of the *machine*
only after ``fsync``: with ``fsync=True`` every write is synced; by default only
compactions are. bench/bench_pipeline.py measures both.

Format and damage (:mod:`broker.store.records`): a checked file header, then framed records with
a marker and separate checksums over each record's head and body, so a record that does not
read is found wherever it is. What the checksums cannot tell is *where the log should end*:
a file cut at a record boundary reads like a log whose last records were never written, and
a damaged last record like one a crash tore. The acknowledged end (``effects.mark``,
:mod:`broker.store.mark`) says it.

What a torn write can look like, and why the start tells it from damage:

1. The log has one writer (the state directory is ``flock``'ed) and is opened
   ``O_APPEND``. Every write is one call of :meth:`EffectLog.write` with whole records (a
   socket read's reports, a tick's effects): ``write(2)`` until all of it is in (a short
   write goes on), and after an error the file is cut back to where it was. So at any
   moment the file is: the header, the records of every write that returned, then a prefix
   (possibly empty, possibly all) of at most one write, the one in progress.
2. When a write has returned (and been synced, with ``fsync``), its new end, with the
   records and reports before it, is written to the mark (one ``pwrite`` of 88 bytes at
   offset 0), and only then does :meth:`EffectLog.write` return. Nothing leaves the process
   before that: a report's PUBACK, a batch's publish and an acknowledgement's effects all
   come after the call that logged them. Hence the invariant: **every byte anything outside
   the process may rely on lies below the mark's length** ``L``.
3. A crash of the process (``kill -9``, out of memory) stops it at any instruction, but both
   files live in the page cache: the log then holds its bytes up to ``L`` exactly as written,
   and after ``L`` a prefix of one write (the one in progress, or the one whose mark was not
   yet written). It cannot hold less than ``L``, a different byte below ``L``, or two writes
   after it.
4. So on start (:func:`broker.store.reading.read_log`) anything wrong before ``L`` is not a
   crash: a record that does not read, a file that ends before ``L``, records that do not
   end exactly at ``L``, or a count of records other than the mark's. It is refused
   (:class:`LogDamagedError`, naming the file and the offset of the first bad record; a bad
   header is named as such), never discarded: discarding it would lose acknowledged reports
   or, a ``released`` record lost, release a pool again under a new batch id. After ``L``
   only the last write can be: its whole records are kept and everything from its first
   bad byte on is discarded with a WARNING. That loses nothing promised, since none of it
   was made visible, and even when valid records follow the bad byte (which a crash cannot
   produce, a disk can) the log kept is a prefix of what was written, never one with a
   hole.
5. A crash of the machine: with ``fsync`` the log is synced before its mark is written, so
   the mark is never ahead of the durable log (the mark itself is not synced at each write:
   after a power loss it may be behind, and the check weaker for the last writes, never
   wrong). Without ``fsync`` the kernel may have written back the mark and not all of the
   log, or zeros where it had not written the data: the start then refuses, since
   acknowledged records were lost (``coco shuffler repair`` says how many); that loss is
   what ``fsync`` is for, and it is no longer silent.
6. A compaction writes the new file and syncs it, writes and syncs a mark holding the ends of
   both files, renames the new file over the log, syncs the directory, then writes the
   mark with the new end alone. Each entry names its file by the random salt in that
   file's header, so whichever file a crash leaves in place, the mark has its end.
7. The mark itself is checked (crc): a damaged, torn or missing mark beside a version-3 log
   means the end cannot be trusted, and the start refuses; ``repair`` counts what it can
   without it (``"unknown"`` otherwise) and writes a new one.

Older logs: a version-2 log (before the mark) is read by the rule it was written under (a
problem with no valid record after it is a torn tail) and rewritten at once as version 3
with its mark; a version-1 log (no header) is read through :mod:`broker.store.logv1` and
rewritten the same way. The cost of the mark is one ``pwrite`` per write (one per socket
read of the ingest connection, not per report): ``bench/bench_shuffler_state.py``'s
``ingest`` case measures it.

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
    effects.mark its acknowledged end (:mod:`broker.store.mark`)
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
from broker.store.mark import MARK_SIZE, End, encode_mark, held
from broker.store.reading import LogDamagedError, StoreError, mark_path, read_log
from broker.store.records import encode_effect, encode_parts, file_header

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


class EffectLog:
    """The append-only log of one shuffler's effects (module docstring)."""

    def __init__(self, path: Path, *, fsync: bool = False, round_seconds: int = 60) -> None:
        self.path = Path(path)
        self.fsync = fsync
        self.round_seconds = round_seconds
        """Only to read a version-1 log, whose closed rounds are round numbers."""
        self._fd: int | None = None
        self._mark_fd: int | None = None
        self._end = End(0)
        self._staged = bytearray()
        self._counts = [0, 0, 0]  # records, reports, released staged
        self.size = 0
        self.version = 3
        self.failure: OSError | None = None
        """The first write error that could not be undone: from then on nothing more is
        written and every write raises, so nothing staged since can be acknowledged."""

    @property
    def end(self) -> End:
        """The acknowledged end: what :attr:`mark_path` says after every write."""
        return self._end

    @property
    def mark_path(self) -> Path:
        return mark_path(self.path)

    def replay(self) -> list[Effect]:
        """Every effect in the log, oldest first, as a list (tools and tests: a shuffler
        starts with :meth:`recover`, which holds one record's effect at a time)."""
        return list(self.recover())

    def recover(self) -> Iterable[Effect]:
        """Every effect in the log, oldest first, each decoded as it is iterated (the log is
        checked whole before this returns, :mod:`broker.store.reading`); truncates a torn
        last write (with a WARNING); raises :class:`LogDamagedError` or
        :class:`StoreError` for damage. Opens the log for appending (a version-1 or -2 log
        is rewritten at once)."""
        got = read_log(self.path, self.round_seconds)
        if got.whole < got.size:
            logger.warning(
                "shuffler log %s: discarding a torn last write (%d bytes, never acknowledged) "
                "at its end, offset %d",
                self.path,
                got.size - got.whole,
                got.whole,
            )
            os.truncate(self.path, got.whole)
        if got.version in (1, 2):  # appends go to a fresh version-3 file with its mark
            self.version = got.version
            self.compact(got.effects)
            return got.effects
        self._open()
        if got.version == 0:  # empty: the mark first, so a header it does not cover is torn
            header, salt = file_header()
            os.ftruncate(self._fd_checked(), 0)
            self.size = 0
            self._end = End(salt)
            self._write_mark([self._end], sync=True)
            self.write(header)
        else:
            self._end = got.end
            self.size = got.whole
            self._write_mark([self._end])
        return got.effects

    def _fd_checked(self) -> int:
        if self._fd is None:
            raise StoreError(f"the shuffler log {self.path} is not open")
        return self._fd

    def _open(self) -> None:
        flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND | getattr(os, "O_NOFOLLOW", 0)
        try:
            self._fd = os.open(self.path, flags, 0o600)
            if self._mark_fd is None:
                mark_flags = os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0)
                self._mark_fd = os.open(self.mark_path, mark_flags, 0o600)
        except OSError as exc:
            raise StoreError(f"cannot open the shuffler log {self.path}: {exc}") from exc
        self.size = os.fstat(self._fd).st_size

    def _write_mark(self, ends: list[End], *, sync: bool = False) -> None:
        """Rewrite the mark whole (one ``pwrite`` at offset 0 of a file of fixed size)."""
        if self._mark_fd is None:
            raise StoreError(f"the shuffler log {self.path} is not open")
        data = encode_mark(ends)
        if os.pwrite(self._mark_fd, data, 0) != MARK_SIZE:
            raise OSError(errno.EIO, f"short write to {self.mark_path}")
        if sync:
            os.fsync(self._mark_fd)

    def append(self, effect: Effect) -> None:
        """Write one record (one ``write(2)``, with anything staged before it)."""
        self.stage(effect)
        self.flush()

    def stage(self, effect: Effect) -> None:
        """Add one record to the next write (:meth:`flush`): nothing is on disk until then."""
        self._check()
        self._staged += encode_effect(effect, self._end.salt)
        reports, released = held(effect)
        counts = self._counts
        counts[0] += 1
        counts[1] += reports
        counts[2] += released

    def extend(self, effects: Iterable[Effect]) -> None:
        """Write several records (after anything staged) in one ``write(2)``."""
        for effect in effects:
            self.stage(effect)
        self.flush()

    @property
    def staged(self) -> int:
        """Bytes staged and not yet written."""
        return len(self._staged)

    def flush(self) -> None:
        """Write what is staged (one ``write(2)``; synced if ``fsync``), then its mark. On
        an error the staged records are dropped: the caller fails, and none of them was
        acknowledged."""
        self._check()
        if not self._staged:
            return
        data, self._staged = self._staged, bytearray()
        counts, self._counts = self._counts, [0, 0, 0]
        self.write(data, counts)

    def write(self, data: bytes | bytearray, counts: list[int] | None = None) -> None:
        """Append ``data`` whole (holding ``counts``: records, reports, released), then its
        acknowledged end to the mark, or nothing: after an error the file is cut back to
        its size before the write (:class:`LogFullError` when the disk is full; any other
        error, or a failed cut, is sticky)."""
        self._check()
        fd = self._fd_checked()
        view = memoryview(data)
        end = self._end.plus(len(data), *(counts or (0, 0, 0)))
        try:
            while view:
                written = os.write(fd, view)
                view = view[written:]
            if self.fsync:
                os.fsync(fd)
            self._write_mark([end])
        except OSError as exc:
            try:
                os.ftruncate(fd, self.size)  # no torn record in the middle of the log
                self._write_mark([self._end])
            except OSError:
                self.failure = exc
                raise exc from None
            if exc.errno in _FULL:
                raise LogFullError(exc.errno, exc.strerror, str(self.path)) from exc
            self.failure = exc
            raise
        self.size += len(data)
        self._end = end

    def _check(self) -> None:
        if self.failure is not None:
            raise OSError(f"the shuffler log {self.path} failed earlier: {self.failure}")

    def compact(self, effects: Iterable[Effect]) -> bool:
        """Replace the log by ``effects`` (a snapshot of the state), atomically: written to
        a temporary file and synced; the mark then holds the ends of both files (synced),
        the file is renamed over the log, and the mark holds the new one's. Anything staged
        is written first. A snapshot larger than the log it would replace is not written
        (compaction never grows the log): returns whether it replaced the log."""
        self.flush()  # raises after a failed write: a log that failed is never replaced
        temporary = self.path.with_name(self.path.name + ".compact")
        flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_NOFOLLOW", 0)
        fd = os.open(temporary, flags, 0o600)
        limit = self.size if self.version == 3 and self._fd is not None else None
        try:
            new = _write_snapshot(fd, effects, limit)
            if new is None:  # as large as the log already: left as it is
                closing, fd = fd, -1  # closed once, whatever the unlink does
                os.close(closing)
                temporary.unlink()
                return False
            os.fsync(fd)
            if self._mark_fd is None:
                mark_flags = os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0)
                self._mark_fd = os.open(self.mark_path, mark_flags, 0o600)
            both = [self._end, new] if self.version == 3 and self._fd is not None else [new]
            self._write_mark(both, sync=True)
        except BaseException as exc:
            if fd >= 0:
                with contextlib.suppress(OSError):
                    os.close(fd)
            with contextlib.suppress(OSError):
                temporary.unlink()
            if isinstance(exc, OSError) and exc.errno in _FULL:  # the log is as it was
                raise LogFullError(exc.errno, exc.strerror, str(temporary)) from exc
            raise
        os.close(fd)
        os.replace(temporary, self.path)
        _fsync_directory(self.path.parent)
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        self._open()
        self._end = new
        self._write_mark([new])
        self.version = 3
        self.size = new.length
        return True

    def __del__(self) -> None:
        """A log dropped without :meth:`close` (a reader that only replayed it) gives its
        descriptors back; nothing more is written (what was staged was never acknowledged,
        as after a crash)."""
        for name in ("_fd", "_mark_fd"):
            fd = getattr(self, name, None)
            if fd is not None:
                setattr(self, name, None)
                with contextlib.suppress(OSError):
                    os.close(fd)

    def close(self) -> None:
        """Write what is staged (unless that fails: then it was never acknowledged) and
        close the log and its mark."""
        if self._fd is not None:
            if self.failure is None:
                with contextlib.suppress(OSError):
                    self.flush()
            os.close(self._fd)
            self._fd = None
        if self._mark_fd is not None:
            os.close(self._mark_fd)
            self._mark_fd = None


_CHUNK = 1 << 16


def _write_all(fd: int, data: bytes | bytearray | memoryview) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def _write_snapshot(fd: int, effects: Iterable[Effect], limit: int | None) -> End | None:
    """Write a new log of ``effects`` to ``fd``, one record at a time (a compaction holds
    one pool's record at a time, never the whole log in memory), and return its end;
    ``None`` as soon as it reaches ``limit`` bytes (it would not be smaller)."""
    header, salt = file_header()
    small = bytearray(header)
    length = records = reports = released = 0
    for effect in effects:
        for part in encode_parts(effect, salt):
            if len(part) < _CHUNK:
                small += part
            else:
                _write_all(fd, small)
                length += len(small)
                small.clear()
                _write_all(fd, part)
                length += len(part)
            if limit is not None and length + len(small) >= limit:
                return None
            if len(small) >= _CHUNK:
                _write_all(fd, small)
                length += len(small)
                small.clear()
        records += 1
        pooled, batched = held(effect)
        reports += pooled
        released += batched
    if limit is not None and length + len(small) >= limit:
        return None
    _write_all(fd, small)
    length += len(small)
    return End(salt, length, records, reports, released)


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
