"""Files replaced whole or not at all: the checkpoint, the privacy ledger's file and the
pinned keys.

:func:`write_atomically` writes a temporary file, ``fsync`` s it, renames it over the
target (``os.replace``) and ``fsync`` s the directory, so that after a crash the target
holds either the new text or the old one, never a mix. A write that fails (a full disk)
removes its temporary file and raises :class:`DiskWriteError`, which names the target in
one line. Standard library only: every package of the aggregator that keeps state on disk
may import it.

A writer of several files that must reach the disk together (the checkpoint's thread:
:mod:`aggregator.service.generations`) uses the parts: :func:`stage` each file's temporary
copy, :func:`sync_files` them all at once (one ``fsync`` per file, issued together, so the
file system can commit them as one group), then the renames (``os.replace``) in the order
the crash argument needs, each group made durable by :func:`sync_directory`.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

__all__ = [
    "DiskWriteError",
    "stage",
    "staged_path",
    "sync_directory",
    "sync_files",
    "write_atomically",
]


class DiskWriteError(OSError):
    """A file that could not be written (``filename``; ``errno`` as the failed call's, e.g.
    ``ENOSPC``): one line, ``cannot write <file>: <reason>``."""

    def __str__(self) -> str:
        return f"cannot write {self.filename}: {self.strerror}"


def write_atomically(path: Path, text: str | bytes, *, previous: Path | None = None) -> None:
    """``path`` holds ``text`` (or bytes) or what it held before, whatever happens; with
    ``previous`` the file it replaces (if any) is moved there first. :class:`DiskWriteError`
    when the new text cannot be written (nothing is left of it: the space is free for a
    retry)."""
    tmp = staged_path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(tmp, "wb") as fh:
            fh.write(text if isinstance(text, bytes) else text.encode())
            fh.flush()
            os.fsync(fh.fileno())
    except OSError as exc:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise DiskWriteError(exc.errno, exc.strerror, str(path)) from exc
    if previous is not None and path.exists():
        os.replace(path, previous)
    os.replace(tmp, path)
    with contextlib.suppress(OSError):  # make the renames durable where directories open
        fd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def staged_path(path: Path) -> Path:
    """The temporary file :func:`write_atomically` and :func:`stage` write ``path`` to."""
    return path.with_name(f".{path.name}.tmp")


def stage(path: Path, text: str | bytes) -> Path:
    """Write ``text`` to ``path``'s temporary file, not yet ``fsync`` ed nor renamed (the
    caller syncs it with :func:`sync_files` and renames it); :class:`DiskWriteError` naming
    ``path`` when it cannot (the temporary file removed)."""
    tmp = staged_path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(tmp, "wb") as fh:
            fh.write(text if isinstance(text, bytes) else text.encode())
    except OSError as exc:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise DiskWriteError(exc.errno, exc.strerror, str(path)) from exc
    return tmp


def _fsync_path(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def sync_files(files: Sequence[tuple[Path, Path]]) -> None:
    """``fsync`` every ``(file, target)`` at once (each in its own thread: the file system
    commits them together instead of one after the other); durable when it returns, else
    :class:`DiskWriteError` naming the first ``target`` that failed."""
    if len(files) == 1:
        jobs = [(files[0][1], _try_fsync(files[0][0]))]
    else:
        with ThreadPoolExecutor(len(files), thread_name_prefix="coco-fsync") as pool:
            futures = [(target, pool.submit(_try_fsync, file)) for file, target in files]
            jobs = [(target, future.result()) for target, future in futures]
    for target, exc in jobs:
        if exc is not None:
            raise DiskWriteError(exc.errno, exc.strerror, str(target)) from exc


def _try_fsync(path: Path) -> OSError | None:
    try:
        _fsync_path(path)
    except OSError as exc:
        return exc
    return None


def sync_directory(directory: Path) -> None:
    """``fsync`` a directory, so that the renames in it so far are durable (where
    directories can be opened; elsewhere a no-op)."""
    with contextlib.suppress(OSError):
        _fsync_path(directory)
