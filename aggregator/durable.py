"""Files replaced whole or not at all: the checkpoint, the privacy ledger's file and the
pinned keys.

:func:`write_atomically` writes a temporary file, ``fsync`` s it, renames it over the
target (``os.replace``) and ``fsync`` s the directory, so that after a crash the target
holds either the new text or the old one, never a mix. A write that fails (a full disk)
removes its temporary file and raises :class:`DiskWriteError`, which names the target in
one line. Standard library only: every package of the aggregator that keeps state on disk
may import it.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

__all__ = ["DiskWriteError", "write_atomically"]


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
    tmp = path.with_name(f".{path.name}.tmp")
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
