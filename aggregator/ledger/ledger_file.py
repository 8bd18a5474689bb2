"""The privacy ledger's own file: checksummed, two generations, apart from the estimates.

The estimates' checkpoint can be reset (moved away, as docs/operations.md advises after a
change of spec or a damaged file) without forgetting what the devices spent: the ledger
(:class:`~aggregator.ledger.privacy_ledger.PrivacyLedger`) lives in a file of its own, by default
``<checkpoint>.ledger``. One UTF-8 JSON object::

    {"format": "coco-privacy-ledger", "version": 2,
     "checkpoint": {"deployment": "<deployment>", "generation": 17},
     "ledger": PrivacyLedger.to_dict(), "sha256": "<64 hex digits>"}

``sha256`` is the SHA-256 of the canonical JSON (sorted keys, no spaces) of ``checkpoint``
and ``ledger`` together (version 1, written before ``checkpoint`` existed: of ``ledger``
alone): any change of the content, a flipped bit included, fails the check.

Binding to the checkpoint
-------------------------
``checkpoint`` names the deployment and the checkpoint generation this ledger was written
with (``null`` for a ledger saved without a checkpoint); the checkpoint in turn records the
ledger generation and the SHA-256 of this file's bytes (:func:`file_digest`). The service
checks the two against each other at start (:mod:`aggregator.service.core.binding`), so
that a ledger deleted, put back from an older copy, or of another deployment is refused
instead of silently under-reporting ``epsilon_total``. :func:`save_ledger` writes
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
import dataclasses
import hashlib
import json
import logging
import os
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from aggregator.durable import write_atomically
from aggregator.ledger.privacy_ledger import ID_BYTES, MAX_ROUND, PrivacyLedger
from aggregator.ledger.timeline import Timeline
from edge.errors import CocoError
from edge.rounds import MAX_ROUND_SECONDS, MAX_START
from edge.spec import MechanismSpec

__all__ = [
    "FORMAT",
    "VERSION",
    "Bound",
    "LedgerFileError",
    "LoadedLedger",
    "canonical_json",
    "decode_ledger",
    "encode_ledger",
    "encode_ledger_content",
    "file_digest",
    "ledger_path_for",
    "load_ledger",
    "previous_path",
    "read_ledger",
    "save_ledger",
]

logger = logging.getLogger(__name__)

FORMAT: Final = "coco-privacy-ledger"
VERSION: Final = 2
"""Version 2 adds ``checkpoint`` (the binding); version 1 is still read."""
_BIG: Final = 2**63


class LedgerFileError(CocoError):
    """A ledger file that cannot be used (one line: the file, and the field if one is
    wrong)."""


@dataclass(frozen=True)
class Bound:
    """The checkpoint a ledger file was written with: its deployment and generation."""

    deployment: str
    generation: int

    def to_dict(self) -> dict[str, Any]:
        return {"deployment": self.deployment, "generation": self.generation}


@dataclass(frozen=True)
class LoadedLedger:
    """What :func:`read_ledger` found: the ledger, the file it came from (``path`` or its
    previous generation), the checkpoint it was written with (``None``: a version-1 file or
    one saved without a checkpoint) and the SHA-256 of the file's bytes."""

    ledger: PrivacyLedger
    path: Path
    bound: Bound | None
    digest: str
    fell_back: bool = False


def ledger_path_for(checkpoint: Path) -> Path:
    """The default ledger file of a checkpoint: ``<checkpoint>.ledger``."""
    return checkpoint.with_name(checkpoint.name + ".ledger")


def previous_path(path: Path) -> Path:
    """Where the previous good generation of ``path`` is kept: ``<path>.prev``."""
    return path.with_name(path.name + ".prev")


def canonical_json(value: object) -> str:
    """Canonical JSON (sorted keys, no spaces, ASCII): what the checksums of the ledger's
    files are computed over."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=True)


def _content_digest(bound: object, content: object, version: int) -> str:
    covered = content if version == 1 else {"checkpoint": bound, "ledger": content}
    return hashlib.sha256(canonical_json(covered).encode("ascii")).hexdigest()


def encode_ledger(ledger: PrivacyLedger, bound: Bound | None = None) -> str:
    """The file's text for ``ledger``, written with the checkpoint ``bound`` (if any)."""
    return encode_ledger_content(ledger.to_dict(), bound)


def encode_ledger_content(content: Mapping[str, Any], bound: Bound | None = None) -> str:
    """:func:`encode_ledger` of a :meth:`PrivacyLedger.to_dict` taken before (fresh lists
    and dicts, which nothing else changes: the service takes it on its event loop and
    encodes it in its checkpoint's thread).

    The canonical JSON of ``checkpoint`` and ``ledger`` is encoded once and used twice:
    hashed inside ``{"checkpoint":…,"ledger":…}`` and placed in the document, whose sorted
    keys put the two in the same order around ``format`` (the same text as
    ``canonical_json(document)``)."""
    binding = canonical_json(None if bound is None else bound.to_dict())
    ledger = canonical_json(content)
    covered = f'{{"checkpoint":{binding},"ledger":{ledger}}}'
    digest = hashlib.sha256(covered.encode("ascii")).hexdigest()
    return (
        f'{{"checkpoint":{binding},"format":{canonical_json(FORMAT)},"ledger":{ledger},'
        f'"sha256":"{digest}","version":{VERSION}}}\n'
    )


def file_digest(text: str) -> str:
    """The SHA-256 (hex) of a ledger file's bytes, as the checkpoint records it."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def _bound(value: object) -> Bound | None:
    if value is None:
        return None
    if (
        isinstance(value, dict)
        and set(value) == {"deployment", "generation"}
        and isinstance(value["deployment"], str)
        and isinstance(value["generation"], int)
        and not isinstance(value["generation"], bool)
        and 0 <= value["generation"] < _BIG
    ):
        return Bound(value["deployment"], value["generation"])
    raise _FieldError("checkpoint", "must be {deployment, generation} or null")


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
        compacted_through=read.optional("compacted_through", high=MAX_START),
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
        round_ = read.integer(f"{name}.round", row[0], high=MAX_START)
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
    shape = "[round, shard, batch_id, size] or [..., size, round_seconds]"
    for i, row in enumerate(read.rows("batches", shape, (4, 5))):
        name = f"batches[{i}]"
        round_ = read.integer(f"{name}.round", row[0], high=MAX_START)
        batch_id = read.hex_id(name, row[2])
        size = read.integer(f"{name}.size", row[3], low=1)
        seconds = 0
        if len(row) == 5:  # the length the batch carried (written only when it carried one)
            seconds = read.integer(f"{name}.round_seconds", row[4], low=1, high=MAX_ROUND_SECONDS)
        try:
            outcome = ledger.record_batch(
                round=round_, shard=row[1], batch_id=batch_id, size=size, seconds=seconds
            )
        except ValueError as exc:
            raise _FieldError(name, str(exc)) from None
        if outcome not in ("recorded", "covered"):
            raise _FieldError(name, f"contradicts an earlier entry ({outcome})")
    ledger.restore_forgotten(_forgotten(data.get("forgotten", [])))
    ledger.timeline = _timeline(data.get("timeline"), read.counts("compacted"))
    ledger.generation = read.integer("generation", read.get("generation"), high=_BIG)
    rounds = data.get("rounds")
    if rounds not in (None, "start"):
        raise _FieldError("rounds", f"must be 'start', got {rounds!r}")
    ledger.numbered = rounds is None  # written before rounds were times: renumber()
    return ledger


def _timeline(raw: object, compacted: Mapping[int, int]) -> Timeline:
    """The dates of compacted participations (:mod:`aggregator.ledger.timeline`). A file
    written before them has every compacted participation undated: counted in every
    rolling period, pessimistically, until it ages out of none (it never does)."""
    if raw is None:
        timeline = Timeline()
        for size, count in compacted.items():
            timeline.add(None, size, count)
        return timeline
    if not isinstance(raw, dict):
        raise _FieldError("timeline", "must be an object")
    try:
        return Timeline.from_json(raw)
    except ValueError as exc:
        raise _FieldError("timeline", str(exc)) from None


def _forgotten(raw: object) -> list[tuple[bytes, bytes]]:
    """The remembered ids of compacted rounds (absent in older files: none)."""
    if not isinstance(raw, list):
        raise _FieldError("forgotten", "must be a list")
    out = []
    for i, row in enumerate(raw):
        try:
            if not (isinstance(row, list) and len(row) == 2 and len(row[0]) == 2 * ID_BYTES + 2):
                raise ValueError
            out.append((bytes.fromhex(row[0]), bytes.fromhex(row[1])))
        except (TypeError, ValueError):
            raise _FieldError(f"forgotten[{i}]", "must be [kind_and_id_hex, digest_hex]") from None
    return out


def decode_ledger(text: str, *, path: Path, spec: MechanismSpec, delta: float) -> PrivacyLedger:
    """The checked ledger of a file's ``text``; :class:`LedgerFileError` naming ``path``
    and the field otherwise."""
    return _decode(text, path=path, spec=spec, delta=delta)[0]


def _decode(
    text: str, *, path: Path, spec: MechanismSpec, delta: float
) -> tuple[PrivacyLedger, Bound | None]:
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
    version = document.get("version")
    if version not in (1, VERSION) or isinstance(version, bool):
        raise error("version", f"must be 1 or {VERSION}, got {version!r}")
    content = document.get("ledger")
    if not isinstance(content, dict):
        raise error("ledger", "must be an object")
    if version != 1 and "checkpoint" not in document:
        raise error("checkpoint", "is missing")
    digest = document.get("sha256")
    if not isinstance(digest, str):
        raise error("sha256", "is missing")
    if _content_digest(document.get("checkpoint"), content, version) != digest:
        raise error("sha256", "does not match the content: the file is damaged")
    try:
        bound = None if version == 1 else _bound(document["checkpoint"])
        return _parse(spec, delta, content), bound
    except _FieldError as exc:
        name = exc.name if exc.name.startswith(("ledger.", "checkpoint")) else f"ledger.{exc.name}"
        raise error(name, exc.problem) from None


def _read(path: Path, spec: MechanismSpec, delta: float) -> LoadedLedger:
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise LedgerFileError(f"ledger file {path} is not UTF-8 text ({exc.reason})") from None
    ledger, bound = _decode(text, path=path, spec=spec, delta=delta)
    return LoadedLedger(ledger, path, bound, file_digest(text))


def load_ledger(path: Path, *, spec: MechanismSpec, delta: float) -> PrivacyLedger | None:
    """The ledger saved at ``path``, or its previous generation if ``path`` is missing or
    damaged (logged at WARNING, with the generations lost); ``None`` if neither file
    exists. Raises :class:`LedgerFileError` (the problem with ``path``) if no generation
    can be used: the service must not start with a privacy record it cannot read.
    (:func:`read_ledger` tells also which file it was and the checkpoint it belongs to.)"""
    loaded = read_ledger(path, spec=spec, delta=delta)
    return None if loaded is None else loaded.ledger


def read_ledger(path: Path, *, spec: MechanismSpec, delta: float) -> LoadedLedger | None:
    """:func:`load_ledger`, with the file used, its binding and its digest."""
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
        fallback.ledger.generation,
        sum(fallback.ledger.rounds().values()),
    )
    return dataclasses.replace(fallback, fell_back=True)


def save_ledger(path: Path, ledger: PrivacyLedger, bound: Bound | None = None) -> None:
    """Write ``ledger`` to ``path`` atomically (written with the checkpoint ``bound``, if
    any), keeping the file it replaces as ``<path>.prev`` (only if that file is itself a
    good ledger: a damaged file never replaces the last good generation)."""
    text = encode_ledger(ledger, bound)
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
