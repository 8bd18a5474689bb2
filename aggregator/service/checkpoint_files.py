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
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from dataclasses import dataclass
from pathlib import Path

from aggregator.durable import DiskWriteError, write_atomically
from aggregator.ledger.ledger_file import LoadedLedger
from aggregator.service.core.binding import LedgerFile
from aggregator.service.core.checkpoint import (
    Checkpoint,
    CheckpointError,
    decode_checkpoint,
    encode_checkpoint,
    one_line,
)
from edge.errors import CocoError

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
