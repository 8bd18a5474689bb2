"""The quarantine on disk: ``<checkpoint>.quarantine``, beside the checkpoint.

What is kept and why is :mod:`aggregator.service.core.quarantine` (no I/O); this module writes
and reads it. The file is written with a checkpoint generation, *before* the checkpoint (and
so before any PUBACK of a batch it keeps: :class:`~aggregator.service.core.acks.AckGenerations`),
and only when what it holds changed; atomically (temporary file, ``fsync``, rename). A crash
cannot lose a kept batch: either the file holds it, or the batch was never acknowledged and the
broker redelivers it.

One JSON document a line: a header, then one line per entry::

    {"version": 1, "deployment": "plant-7", "entries": 2, "dropped": 0, "discarded": 0,
     "checksum": "<64 hex>"}
    {"kind": "batch", "shard": null, "reason": "untrusted_key", "at": 1.7e9,
     "applied": false, "payload": "<base64>", "checksum": "<64 hex>"}

``applied``: a replay applied it, and fewer than two checkpoint generations hold that yet
(it is replayed again after a restart, as a duplicate if the checkpoint holds it).

Each ``checksum`` is the SHA-256 of the other fields of its line as compact JSON with sorted
keys. A damaged header refuses the file (one line naming it: move it away to start without
it); a damaged or missing entry line is dropped and counted (:attr:`LoadedQuarantine.damaged`),
never applied. Every payload is signed besides: a replay applies only what verifies.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aggregator.durable import write_atomically
from aggregator.service.core.quarantine import KEPT_REASONS, Entry, Quarantine
from edge.errors import CocoError

__all__ = [
    "LoadedQuarantine",
    "QuarantineFileError",
    "decode_quarantine",
    "encode_quarantine",
    "quarantine_path",
    "read_quarantine",
    "replay_request_path",
    "write_quarantine",
]

QUARANTINE_VERSION = 1


class QuarantineFileError(CocoError):
    """A quarantine file whose header cannot be read or is damaged."""


def quarantine_path(checkpoint: Path) -> Path:
    """``<checkpoint>.quarantine``."""
    return checkpoint.with_name(checkpoint.name + ".quarantine")


def replay_request_path(checkpoint: Path) -> Path:
    """``<checkpoint>.quarantine.replay``: ``coco aggregator rejected replay`` creates it, the
    running service replays and removes it."""
    return checkpoint.with_name(checkpoint.name + ".quarantine.replay")


def _checksum(document: dict[str, Any]) -> str:
    text = json.dumps(document, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()


def _line(document: dict[str, Any]) -> str:
    return json.dumps({**document, "checksum": _checksum(document)}, sort_keys=True) + "\n"


def encode_quarantine(quarantine: Quarantine, deployment: str) -> str:
    """The file's text for what ``quarantine`` persists."""
    entries = quarantine.persisted()
    header = {
        "version": QUARANTINE_VERSION,
        "deployment": deployment,
        "entries": len(entries),
        "dropped": quarantine.dropped,
        "discarded": quarantine.discarded,
    }
    lines = [_line(header)]
    for entry, applied in entries:
        lines.append(
            _line(
                {
                    "applied": applied,
                    "kind": entry.kind,
                    "shard": entry.shard,
                    "reason": entry.reason,
                    "at": entry.at,
                    "payload": base64.b64encode(entry.payload).decode(),
                }
            )
        )
    return "".join(lines)


@dataclass(frozen=True)
class LoadedQuarantine:
    """What a file held: its entries kept and those applied (awaiting two checkpoint
    generations), the counts of its header, and how many entry lines were damaged or missing
    (dropped)."""

    entries: list[Entry]
    dropped: int
    discarded: int
    damaged: int
    applied: list[Entry]

    @property
    def every(self) -> list[Entry]:
        """Everything to restore (and replay): the applied ones first."""
        return self.applied + self.entries


def _checked(line: str) -> dict[str, Any] | None:
    try:
        document = json.loads(line)
    except ValueError:
        return None
    if not isinstance(document, dict):
        return None
    checksum = document.pop("checksum", None)
    return document if checksum == _checksum(document) else None


def _entry(document: dict[str, Any]) -> Entry | None:
    kind, shard, reason, at = (document.get(k) for k in ("kind", "shard", "reason", "at"))
    if kind not in ("batch", "manifest") or reason not in KEPT_REASONS:
        return None
    if not (shard is None or isinstance(shard, str)) or not isinstance(at, int | float):
        return None
    try:
        payload = base64.b64decode(str(document.get("payload")), validate=True)
    except (binascii.Error, ValueError):
        return None
    return Entry(kind=kind, shard=shard, reason=reason, at=float(at), payload=payload)


def decode_quarantine(text: str, path: Path, deployment: str | None) -> LoadedQuarantine:
    """The checked content of ``text`` (module docs); :class:`QuarantineFileError` for a
    damaged header or another deployment's file (``deployment``: ``None`` to read any)."""
    lines = [line for line in text.split("\n") if line]
    header = _checked(lines[0]) if lines else None
    if header is None or header.get("version") != QUARANTINE_VERSION:
        raise QuarantineFileError(
            f"quarantine file {path}: its header is damaged (checksum or version); move it "
            "away to start without the batches it kept"
        )
    if deployment is not None and header.get("deployment") != deployment:
        raise QuarantineFileError(
            f"quarantine file {path} is deployment {header.get('deployment')!r}'s, not "
            f"{deployment!r}; move it away"
        )
    entries: list[Entry] = []
    applied: list[Entry] = []
    for line in lines[1:]:
        document = _checked(line)
        entry = None if document is None else _entry(document)
        if document is not None and entry is not None:
            (applied if document.get("applied") is True else entries).append(entry)
    listed = header.get("entries")  # checksummed: the count the file was written with
    damaged = max(0, (listed if isinstance(listed, int) else 0) - len(entries) - len(applied))

    def count(name: str) -> int:
        value = header.get(name)
        return value if isinstance(value, int) and value >= 0 else 0

    return LoadedQuarantine(entries, count("dropped"), count("discarded"), damaged, applied)


def read_quarantine(checkpoint: Path, deployment: str | None) -> LoadedQuarantine | None:
    """The quarantine file beside ``checkpoint``; ``None`` if there is none."""
    path = quarantine_path(checkpoint)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError) as exc:
        raise QuarantineFileError(f"cannot read quarantine file {path}: {exc}") from None
    return decode_quarantine(text, path, deployment)


def write_quarantine(checkpoint: Path, text: str) -> None:
    """Write the file beside ``checkpoint`` atomically (:func:`encode_quarantine`'s text)."""
    write_atomically(quarantine_path(checkpoint), text)
