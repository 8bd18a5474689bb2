"""The privacy ledger's own file: checksummed, two generations, apart from the estimates.

The estimates' checkpoint can be reset (moved away, as docs/operations.md advises after a
change of spec or a damaged file) without forgetting what the devices spent: the ledger
(:class:`~aggregator.ledger.privacy_ledger.PrivacyLedger`) lives in a file of its own, by default
``<checkpoint>.ledger``. One UTF-8 JSON object::

    {"format": "coco-privacy-ledger", "version": 1,
     "ledger": PrivacyLedger.to_dict(), "sha256": "<64 hex digits>"}

``sha256`` is the SHA-256 of the canonical JSON of ``ledger`` (sorted keys, no spaces): any
change of the content, a flipped bit included, fails the check. :func:`save_ledger` writes
atomically (temporary file, ``fsync``, rename, ``fsync`` of the directory:
:func:`aggregator.durable.write_atomically`) after moving the current file to
``<file>.prev``, so the previous good generation is kept. :func:`load_ledger` verifies the
file and falls back to ``<file>.prev`` when the file is missing or damaged, logging at
WARNING what was lost (the generations between the two); a file that cannot be used is
refused with a one-line :class:`LedgerFileError` naming the file and the field.

Plain functions: the service decides when to call them (with its checkpoint, in a thread).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
from collections import Counter
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final

from aggregator.durable import write_atomically
from aggregator.ledger.privacy_ledger import ID_BYTES, MAX_ROUND, PrivacyLedger
from edge.errors import CocoError
from edge.spec import MechanismSpec

__all__ = [
    "FORMAT",
    "VERSION",
    "LedgerFileError",
    "decode_ledger",
    "encode_ledger",
    "ledger_path_for",
    "load_ledger",
    "previous_path",
    "save_ledger",
]

logger = logging.getLogger(__name__)

FORMAT: Final = "coco-privacy-ledger"
VERSION: Final = 1
_BIG: Final = 2**63


class LedgerFileError(CocoError):
    """A ledger file that cannot be used (one line: the file, and the field if one is
    wrong)."""


def ledger_path_for(checkpoint: Path) -> Path:
    """The default ledger file of a checkpoint: ``<checkpoint>.ledger``."""
    return checkpoint.with_name(checkpoint.name + ".ledger")


def previous_path(path: Path) -> Path:
    """Where the previous good generation of ``path`` is kept: ``<path>.prev``."""
    return path.with_name(path.name + ".prev")


def _canonical(value: object) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=True)


def encode_ledger(ledger: PrivacyLedger) -> str:
    """The file's text for ``ledger``."""
    content = ledger.to_dict()
    digest = hashlib.sha256(_canonical(content).encode("ascii")).hexdigest()
    document = {"format": FORMAT, "version": VERSION, "ledger": content, "sha256": digest}
    return _canonical(document) + "\n"


class _FieldError(ValueError):
    def __init__(self, name: str, problem: str) -> None:
        super().__init__(name, problem)
        self.name = name
        self.problem = problem


class _Reader:
    """Checked access to the fields of :meth:`PrivacyLedger.to_dict`."""

    def __init__(self, data: Mapping[str, Any]) -> None:
        self.data = data

    def get(self, name: str) -> Any:
        if name not in self.data:
            raise _FieldError(name, "is missing")
        return self.data[name]

    @staticmethod
    def integer(name: str, value: object, *, low: int = 0, high: int = MAX_ROUND) -> int:
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
            raise _FieldError(name, f"must be an integer in [{low}, {high}], got {value!r}")
        return value

    def optional(self, name: str, *, low: int = 0, high: int = _BIG) -> int | None:
        value = self.get(name)
        return None if value is None else self.integer(name, value, low=low, high=high)

    def counts(self, name: str) -> Counter[int]:
        raw = self.get(name)
        if not isinstance(raw, dict):
            raise _FieldError(name, "must be an object of counts")
        out: Counter[int] = Counter()
        for key, count in raw.items():
            if not (isinstance(key, str) and key.isdigit() and 1 <= int(key) < _BIG):
                raise _FieldError(f"{name}.{key}", "must be keyed by a size >= 1")
            out[int(key)] = self.integer(f"{name}.{key}", count, low=1, high=_BIG)
        return out

    def rows(self, name: str, shape: str, lengths: tuple[int, ...] = (4,)) -> list[list[Any]]:
        raw = self.get(name)
        if not isinstance(raw, list):
            raise _FieldError(name, "must be a list")
        for i, row in enumerate(raw):
            if not (isinstance(row, list) and len(row) in lengths and isinstance(row[1], str)):
                raise _FieldError(f"{name}[{i}]", f"must be {shape}")
        return raw

    @staticmethod
    def hex_id(name: str, value: object) -> bytes:
        try:
            if not isinstance(value, str) or len(value) != 2 * ID_BYTES:
                raise ValueError
            return bytes.fromhex(value)
        except ValueError:
            raise _FieldError(name, f"holds {value!r}, not a {2 * ID_BYTES}-hex-digit id") from None


def _sources(name: str, value: object) -> list[tuple[int, int]] | None:
    """A manifest row's sources (``None``: a row written without them)."""
    if value is None:
        return None
    if not isinstance(value, list) or not all(
        isinstance(item, list)
        and len(item) == 2
        and all(isinstance(v, int) and not isinstance(v, bool) for v in item)
        for item in value
    ):
        raise _FieldError(f"{name}.sources", "must be [[round, round_seconds], ...]")
    return [(int(r), int(length)) for r, length in value]


def _parse(spec: MechanismSpec, delta: float, data: Mapping[str, Any]) -> PrivacyLedger:
    read = _Reader(data)
    if read.get("fingerprint") != spec.fingerprint:
        raise _FieldError(
            "ledger.fingerprint",
            f"is {data['fingerprint']!r}, not the spec's {spec.fingerprint!r} (a ledger "
            "accounts one spec; keep this file for the old spec's record)",
        )
    ledger = PrivacyLedger(spec, delta=delta)
    ledger.restore_history(
        compacted=read.counts("compacted"),
        compacted_smallest=read.optional("compacted_smallest", low=1),
        compacted_through=read.optional("compacted_through", high=MAX_ROUND),
        late=read.counts("late"),
        per_batch=read.counts("per_batch"),
        per_batch_latest=read.optional("per_batch_latest", low=1),
    )
    shape = "[round, shard, release_id, [[batch_id, count], ...], [[round, seconds], ...]]"
    for i, row in enumerate(read.rows("manifests", shape, (4, 5))):
        name = f"manifests[{i}]"
        if not isinstance(row[3], list) or not all(
            isinstance(item, list) and len(item) == 2 for item in row[3]
        ):
            raise _FieldError(name, f"must be {shape}")
        listed = [
            (read.hex_id(name, b), read.integer(f"{name}.count", c, low=1)) for b, c in row[3]
        ]
        round_ = read.integer(f"{name}.round", row[0])
        release_id = read.hex_id(name, row[2])
        sources = _sources(name, row[4] if len(row) == 5 else None)
        try:
            outcome = ledger.record_manifest(
                round=round_, shard=row[1], release_id=release_id, batches=listed, sources=sources
            )
        except ValueError as exc:
            raise _FieldError(name, str(exc)) from None
        if outcome != "recorded":
            raise _FieldError(name, f"contradicts an earlier entry ({outcome})")
    for i, row in enumerate(read.rows("batches", "[round, shard, batch_id, size]")):
        name = f"batches[{i}]"
        round_ = read.integer(f"{name}.round", row[0])
        batch_id = read.hex_id(name, row[2])
        size = read.integer(f"{name}.size", row[3], low=1)
        try:
            outcome = ledger.record_batch(round=round_, shard=row[1], batch_id=batch_id, size=size)
        except ValueError as exc:
            raise _FieldError(name, str(exc)) from None
        if outcome not in ("recorded", "covered"):
            raise _FieldError(name, f"contradicts an earlier entry ({outcome})")
    ledger.generation = read.integer("generation", read.get("generation"), high=_BIG)
    return ledger


def decode_ledger(text: str, *, path: Path, spec: MechanismSpec, delta: float) -> PrivacyLedger:
    """The checked ledger of a file's ``text``; :class:`LedgerFileError` naming ``path``
    and the field otherwise."""
    try:
        document = json.loads(text)
    except (ValueError, RecursionError) as exc:
        reason = " ".join(str(exc).split())
        raise LedgerFileError(f"ledger file {path} is not valid JSON ({reason})") from None
    if not isinstance(document, dict):
        raise LedgerFileError(f"ledger file {path} is not a JSON object")

    def error(name: str, problem: str) -> LedgerFileError:
        return LedgerFileError(f"ledger file {path}: field {name!r} {problem}")

    if document.get("format") != FORMAT:
        raise error("format", f"must be {FORMAT!r}, got {document.get('format')!r}")
    if document.get("version") != VERSION or isinstance(document.get("version"), bool):
        raise error("version", f"must be {VERSION}, got {document.get('version')!r}")
    content = document.get("ledger")
    if not isinstance(content, dict):
        raise error("ledger", "must be an object")
    digest = document.get("sha256")
    if not isinstance(digest, str):
        raise error("sha256", "is missing")
    if hashlib.sha256(_canonical(content).encode("ascii")).hexdigest() != digest:
        raise error("sha256", "does not match the content: the file is damaged")
    try:
        return _parse(spec, delta, content)
    except _FieldError as exc:
        name = exc.name if exc.name.startswith("ledger.") else f"ledger.{exc.name}"
        raise error(name, exc.problem) from None


def _read(path: Path, spec: MechanismSpec, delta: float) -> PrivacyLedger:
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise LedgerFileError(f"ledger file {path} is not UTF-8 text ({exc.reason})") from None
    return decode_ledger(text, path=path, spec=spec, delta=delta)


def load_ledger(path: Path, *, spec: MechanismSpec, delta: float) -> PrivacyLedger | None:
    """The ledger saved at ``path``, or its previous generation if ``path`` is missing or
    damaged (logged at WARNING, with the generations lost); ``None`` if neither file
    exists. Raises :class:`LedgerFileError` (the problem with ``path``) if no generation
    can be used: the service must not start with a privacy record it cannot read."""
    previous = previous_path(path)
    problem: LedgerFileError | None = None
    try:
        return _read(path, spec, delta)
    except FileNotFoundError:
        pass
    except LedgerFileError as exc:
        problem = exc
    except OSError as exc:
        problem = LedgerFileError(f"cannot read ledger file {path}: {exc.strerror or exc}")
    try:
        fallback = _read(previous, spec, delta)
    except FileNotFoundError:
        if problem is not None:
            raise problem from None
        return None
    except (LedgerFileError, OSError) as exc:
        if problem is None:
            problem = LedgerFileError(f"ledger file {path} is missing")
        raise LedgerFileError(
            f"{problem}; the previous generation cannot be used either: {exc}"
        ) from None
    logger.warning(
        "%s; using the previous generation %s (ledger generation %d, %d participations): "
        "the records written after it are lost from the file and counted again only as "
        "their manifests and batches are delivered again",
        problem if problem is not None else f"ledger file {path} is missing",
        previous,
        fallback.generation,
        sum(fallback.rounds().values()),
    )
    return fallback


def save_ledger(path: Path, ledger: PrivacyLedger) -> None:
    """Write ``ledger`` to ``path`` atomically, keeping the file it replaces as
    ``<path>.prev`` (only if that file is itself a good ledger: a damaged file never
    replaces the last good generation)."""
    text = encode_ledger(ledger)
    if path.exists():
        try:
            _read(path, ledger.spec, ledger.delta)
        except (LedgerFileError, OSError) as exc:
            logger.warning("not keeping %s as the previous generation: %s", path, exc)
        else:
            os.replace(path, previous_path(path))
    write_atomically(path, text)
    with contextlib.suppress(OSError):  # make the rename of the previous one durable too
        fd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
