"""The aggregator's checkpoint files: written, kept, recovered and locked.

What a checkpoint holds and how its text is checked is :mod:`aggregator.service.core.checkpoint` (no
I/O); this module puts it on disk.

Generations
-----------
:func:`write_checkpoint` keeps the previous generation: the newest file is renamed to
``<checkpoint>.previous`` before the new one takes its name (temporary file, ``fsync``,
``os.replace``, ``fsync`` of the directory: :func:`aggregator.durable.write_atomically`).
:func:`recover_checkpoint` resumes from the newest file, and from the previous generation
when the newest is missing or damaged (the damaged file is kept as
``<checkpoint>.damaged`` for inspection); the service sends the PUBACKs of generation
``N``'s batches only once ``N + 1`` is durable
(:class:`aggregator.service.core.acks.AckGenerations`), so the broker still holds, unacknowledged,
every batch the previous generation lacks, and redelivers it. Both damaged: a one-line error naming
both files. :func:`lock_checkpoint` takes the single-writer lock, an exclusive ``flock`` on
``<checkpoint>.lock``.

One generation on disk (:class:`GenerationWriter`, the checkpoint's thread)
----------------------------------------------------------------------------
Three files change together: the per-round series (records appended), the privacy ledger
(``<checkpoint>.ledger``, its last good generation kept as ``.prev``) and the checkpoint
(its last generation kept as ``.previous``). In this order:

1. the series' records are appended and the ledger's and checkpoint's new texts written to
   temporary files; the three are ``fsync`` ed together (one group commit, not three);
2. the ledger's renames (the current file to ``.prev``, the new one in its place), then an
   ``fsync`` of the directory;
3. the checkpoint's renames (the current file to ``.previous``, the new one in its place),
   then an ``fsync`` of the directory: the generation is durable, its PUBACKs may go.

Why a crash anywhere leaves files that agree: no rename exposes a byte that is not
already durable (step 1 precedes every rename), and the ledger's renames are durable
before the checkpoint's rename is made (POSIX orders renames only across an ``fsync`` of
their directory), so the ledger is never behind the checkpoint, and every series record
the checkpoint names is on disk. A crash between steps 2 and 3 leaves the ledger one write
ahead, which the start accepts (:mod:`aggregator.service.core.binding`); what the
checkpoint lacks is redelivered and found in the ledger already (``duplicate``).

``.prev`` keeps a *good* generation: the file it replaces becomes ``.prev`` only if the
service can vouch for it. It can for the file it wrote last, or verified at start, while
that file is unchanged on disk (same device, inode, size and modification time), and it
need not read it: reading back what was written seconds ago returns the page cache, not
the disk, and checks only the encoder. A file it cannot vouch for (replaced behind its
back) is hashed and compared with the digest of what it wrote; only if that differs is it
decoded and checked in full, and kept as ``.prev`` only if it is a good ledger.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import hashlib
import logging
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aggregator.durable import DiskWriteError, stage, sync_directory, sync_files, write_atomically
from aggregator.ledger.ledger_file import (
    Bound,
    LedgerFileError,
    LoadedLedger,
    encode_ledger_content,
    file_digest,
    ledger_path_for,
)
from aggregator.ledger.ledger_file import previous_path as ledger_previous_path
from aggregator.service.core.binding import LedgerFile
from aggregator.service.core.checkpoint import Checkpoint, CheckpointError, LedgerRecord, one_line
from aggregator.service.core.checkpoint_codec import decode_checkpoint, encode_checkpoint
from aggregator.service.series_file import SeriesFile, SeriesWrite
from edge.errors import CocoError

logger = logging.getLogger("aggregator.service")

PREVIOUS_SUFFIX = ".previous"
DAMAGED_SUFFIX = ".damaged"


class CheckpointLockedError(CocoError):
    """Another aggregator holds the checkpoint's lock: one writer per deployment."""


def previous_path(path: Path) -> Path:
    """``<checkpoint>.previous``: the generation before the newest."""
    return path.with_name(path.name + PREVIOUS_SUFFIX)


def damaged_path(path: Path) -> Path:
    """``<checkpoint>.damaged``: a newest file found damaged, kept for inspection."""
    return path.with_name(path.name + DAMAGED_SUFFIX)


def load_checkpoint(path: Path) -> Checkpoint:
    """The checked checkpoint at ``path`` (this one file: :func:`recover_checkpoint` falls
    back to the previous generation); :class:`CheckpointError` (one line, naming the file
    and, for a bad field, the field) otherwise."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise CheckpointError(f"cannot read checkpoint {path}: {one_line(exc)}") from exc
    return decode_checkpoint(text, path)


@dataclass(frozen=True)
class Recovery:
    """What :func:`recover_checkpoint` found: the checkpoint to resume (``None``: start
    from zero) and, when it fell back to the previous generation, why (one line)."""

    checkpoint: Checkpoint | None
    fallback: str | None = None


def recover_checkpoint(path: Path, *, move_damaged: bool = True) -> Recovery:
    """The newest good generation of the checkpoint at ``path`` (module docs,
    *Generations*): the newest file, else the previous one (with ``move_damaged``, the
    damaged newest file is moved to ``<checkpoint>.damaged``, so that the next checkpoint
    does not rotate it into ``.previous``); :class:`CheckpointError` when neither is good
    but one exists."""
    previous = previous_path(path)
    try:
        newest_problem = None
        if path.exists():
            return Recovery(load_checkpoint(path))
    except CheckpointError as exc:
        newest_problem = str(exc)
    if not previous.exists():
        if newest_problem is not None:
            raise CheckpointError(f"{newest_problem} (and there is no {previous.name})")
        return Recovery(None)
    try:
        checkpoint = load_checkpoint(previous)
    except CheckpointError as exc:
        if newest_problem is None:
            raise
        raise CheckpointError(f"{newest_problem}; and {exc}") from None
    if newest_problem is None:
        return Recovery(checkpoint, f"{path} is missing; resuming from {previous.name}")
    moved = ""
    if move_damaged:
        os.replace(path, damaged_path(path))
        moved = f"; moved it to {damaged_path(path).name}"
    return Recovery(
        checkpoint,
        f"{newest_problem}{moved}; resuming from the previous generation "
        f"{checkpoint.generation} ({previous.name})",
    )


def ledger_seen(loaded: LoadedLedger) -> LedgerFile:
    """The ledger file found at start, as :func:`aggregator.service.core.binding.check_binding`
    takes it."""
    bound = loaded.bound
    return LedgerFile(
        path=loaded.path,
        generation=loaded.ledger.generation,
        digest=loaded.digest,
        deployment=None if bound is None else bound.deployment,
        checkpoint_generation=None if bound is None else bound.generation,
    )


def write_checkpoint(path: Path, checkpoint: Checkpoint) -> None:
    """Write ``checkpoint`` as the newest generation, the one it replaces kept as
    ``<checkpoint>.previous`` (module docs, *Generations*); durable when it returns."""
    write_atomically(path, encode_checkpoint(checkpoint), previous=previous_path(path))


def lock_checkpoint(lock: Path, checkpoint: Path) -> int:
    """Hold an exclusive ``flock`` on ``lock`` (its descriptor); :class:`CheckpointLockedError`
    if another process holds it."""
    lock.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(lock, os.O_RDWR | os.O_CREAT | getattr(os, "O_CLOEXEC", 0), 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = ""
        with contextlib.suppress(OSError, ValueError):
            holder = f" (pid {int(os.pread(fd, 32, 0).decode().strip())})"
        os.close(fd)
        raise CheckpointLockedError(
            f"checkpoint {checkpoint} is in use by another aggregator{holder}, locked "
            f"through {lock}; run one aggregator per deployment"
        ) from None
    except OSError as exc:
        os.close(fd)
        raise CheckpointLockedError(f"cannot lock {lock}: {one_line(exc)}") from exc
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    except OSError as exc:  # a full disk: the start stops here, naming the file
        os.close(fd)
        raise DiskWriteError(exc.errno, exc.strerror, str(lock)) from None
    return fd


Identity = tuple[int, int, int, int]


def identity(path: Path) -> Identity | None:
    """A file as it is on disk (device, inode, size, modification time in ns); ``None``
    when it is missing."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


@dataclass(frozen=True)
class OnDisk:
    """A ledger file the service can vouch for: where it is, as it was on disk, and the
    SHA-256 of its bytes."""

    path: Path
    identity: Identity | None
    digest: str


def verified(loaded: LoadedLedger) -> OnDisk:
    """The ledger file read and checked at start, as :class:`GenerationWriter` vouches for
    it."""
    return OnDisk(loaded.path, identity(loaded.path), loaded.digest)


@dataclass(frozen=True)
class LedgerWrite:
    """The ledger's part of a generation, taken on the event loop: its
    :meth:`~aggregator.ledger.privacy_ledger.PrivacyLedger.to_dict` (fresh lists and dicts),
    its generation and the checkpoint it is written with; encoded in the thread."""

    content: Mapping[str, Any]
    generation: int
    bound: Bound


def install_checkpoint(staged: Path, path: Path) -> None:
    """Step 3 of a generation (module docs): the newest checkpoint to ``.previous``, the
    ``staged`` (durable) one in its place, durable when it returns."""
    try:
        if path.exists():
            os.replace(path, previous_path(path))
        os.replace(staged, path)
    except BaseException:
        with contextlib.suppress(OSError):
            staged.unlink()
        raise
    sync_directory(path.parent)


class GenerationWriter:
    """Writes one generation's files (module docs, *One generation on disk*); used by one
    thread at a time (the checkpoint's, under the generations' lock)."""

    def __init__(self, path: Path, check_ledger: Callable[[str, Path], None]) -> None:
        self.path = path
        self.ledger_path = ledger_path_for(path)
        self.check_ledger = check_ledger
        """Decodes and checks a ledger file's text (:class:`LedgerFileError` if it is not
        a good ledger of this service's spec)."""
        self.ledger_on_disk: OnDisk | None = None
        """The ledger file the service wrote last, or verified at start."""

    def write(
        self,
        content: Checkpoint,
        ledger: LedgerWrite,
        series: tuple[SeriesFile, SeriesWrite] | None = None,
    ) -> None:
        """Write ``content`` as the newest generation with ``ledger`` and ``series``'s
        records: durable when it returns; :class:`~aggregator.durable.DiskWriteError`
        (naming the file) or another ``OSError`` when not (the series' records stay
        pending, the ledger may be one write ahead)."""
        text = encode_ledger_content(ledger.content, ledger.bound)
        record = LedgerRecord(ledger.generation, file_digest(text))
        checkpoint_text = encode_checkpoint(dataclasses.replace(content, ledger=record))
        staged: list[Path] = []
        try:
            synced: list[tuple[Path, Path]] = []
            if series is not None:
                series[0].append(series[1], sync=False)
                synced.append((series[0].path, series[0].path))
            staged.append(stage(self.ledger_path, text))
            synced.append((staged[-1], self.ledger_path))
            staged.append(stage(self.path, checkpoint_text))
            synced.append((staged[-1], self.path))
            sync_files(synced)
            ledger_tmp, checkpoint_tmp = staged
            if self.ledger_path.exists() and self._vouched(self.ledger_path):
                os.replace(self.ledger_path, ledger_previous_path(self.ledger_path))
            os.replace(ledger_tmp, self.ledger_path)
            staged.remove(ledger_tmp)
            written = identity(self.ledger_path)
            self.ledger_on_disk = OnDisk(self.ledger_path, written, record.sha256)
            sync_directory(self.path.parent)  # the ledger durable before the checkpoint
            staged.remove(checkpoint_tmp)
            install_checkpoint(checkpoint_tmp, self.path)
        except BaseException:
            for tmp in staged:
                with contextlib.suppress(OSError):
                    tmp.unlink()
            if series is not None:
                series[0].abandon()
            raise
        if series is not None:
            series[0].commit()

    def _vouched(self, path: Path) -> bool:
        """Whether the ledger file at ``path`` may become ``.prev`` (module docs)."""
        known = self.ledger_on_disk
        if known is not None and known.path == path and identity(path) == known.identity:
            return True
        try:
            data = path.read_bytes()
            if known is not None and hashlib.sha256(data).hexdigest() == known.digest:
                return True
            self.check_ledger(data.decode("utf-8"), path)
        except (LedgerFileError, OSError, UnicodeDecodeError) as exc:
            logger.warning("not keeping %s as the previous generation: %s", path, exc)
            return False
        return True
