"""The aggregator's checkpoint file: what it holds, how it is read, written and locked.

A checkpoint is one UTF-8 JSON object, written atomically (temporary file, ``fsync``,
``os.replace``, ``fsync`` of the directory) by :func:`write_checkpoint`, in a thread of the
service::

    {"version": 2, "fingerprint": ..., "deployment": ..., "delta": ...,
     "state": AggregateState.to_dict(), "batch_rounds": {"<round>": ["<32 hex>", ...]},
     "retention_rounds": ..., "counters": {...}, "smallest_batch": ..., "latest_batch": ...,
     "last_batch_timestamp": ..., "written_at": ...}

``batch_rounds`` holds the ids of the applied batches of the retained rounds only
(:mod:`aggregator.service`), so its size follows the traffic of the window, not the age of
the deployment. :func:`load_checkpoint` checks every field and names the file and the field
in a one-line :class:`CheckpointError`. :func:`lock_checkpoint` takes the single-writer
lock, an exclusive ``flock`` on ``<checkpoint>.lock``.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from aggregator.estimators import AggregateState
from edge.errors import CocoError

CHECKPOINT_VERSION = 2
"""Version 2 keeps the applied batch ids per round (``batch_rounds``). A version-1
checkpoint (unsigned batches, a flat ``seen`` list) is read for its sums and counters; its
ids are dropped, since a redelivered unsigned batch fails its signature anyway."""


class CheckpointError(CocoError):
    """A checkpoint that cannot be read, or that belongs to another spec."""


class CheckpointLockedError(CocoError):
    """Another aggregator holds the checkpoint's lock: one writer per deployment."""


@dataclass
class Counters:
    """The service's counts, kept in the checkpoint so that they continue across restarts."""

    reports: int = 0
    batches: int = 0
    duplicates: int = 0
    rejected: dict[str, int] = field(default_factory=dict)
    """Batches rejected, by reason."""
    rejected_reports: dict[str, int] = field(default_factory=dict)
    """Reports in the rejected batches whose signature verified, by reason."""
    unacknowledged: dict[str, int] = field(default_factory=dict)
    """Batches left without a PUBACK (the broker redelivers them), by reason."""

    def copy(self) -> Counters:
        return Counters(
            reports=self.reports,
            batches=self.batches,
            duplicates=self.duplicates,
            rejected=dict(self.rejected),
            rejected_reports=dict(self.rejected_reports),
            unacknowledged=dict(self.unacknowledged),
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "reports": self.reports,
            "batches": self.batches,
            "duplicates": self.duplicates,
            "rejected": dict(sorted(self.rejected.items())),
            "rejected_reports": dict(sorted(self.rejected_reports.items())),
            "unacknowledged": dict(sorted(self.unacknowledged.items())),
        }


@dataclass(frozen=True, kw_only=True)
class Checkpoint:
    """A checked checkpoint file (:func:`load_checkpoint`)."""

    path: Path
    version: int
    fingerprint: str
    delta: float
    state: AggregateState
    batch_rounds: dict[int, list[bytes]]
    """Applied batch ids by round (empty for a version-1 file)."""
    counters: Counters
    smallest_batch: int | None
    latest_batch: int | None
    batch_sizes: dict[int, int]
    """Batches applied by size (the history ``epsilon_total`` composes). A checkpoint
    without it (written before it existed) counts every batch as one of the smallest size:
    the largest per-batch epsilon, so the composition stays an upper bound."""
    last_batch_timestamp: float | None


def _short(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _one_line(exc: BaseException) -> str:
    if isinstance(exc, KeyError):
        return f"missing {exc}"
    return " ".join(str(exc).split())


class _Fields:
    """Checked access to the fields of one checkpoint, each error naming file and field."""

    def __init__(self, path: Path, data: dict[str, Any]) -> None:
        self.path = path
        self.data = data

    def error(self, name: str, problem: str) -> CheckpointError:
        return CheckpointError(f"checkpoint {self.path}: field {name!r} {problem}")

    def get(self, name: str, data: dict[str, Any] | None = None) -> Any:
        source = self.data if data is None else data
        if name not in source:
            raise self.error(name, "is missing")
        return source[name]

    def count(self, name: str, value: object) -> int:
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise self.error(name, f"must be an integer >= 0, got {_short(value)}")
        return value

    def optional_count(self, name: str) -> int | None:
        value = self.get(name)
        return None if value is None else self.count(name, value)

    def counts(self, name: str, value: object) -> dict[str, int]:
        if not isinstance(value, dict):
            raise self.error(name, f"must be an object of counts, got {_short(value)}")
        return {str(k): self.count(f"{name}.{k}", v) for k, v in value.items()}


def _parse_batch_rounds(fields: _Fields) -> dict[int, list[bytes]]:
    name = "batch_rounds"
    raw = fields.get(name)
    if not isinstance(raw, dict):
        raise fields.error(name, f"must be an object of rounds, got {_short(raw)}")
    rounds: dict[int, list[bytes]] = {}
    for key, ids in raw.items():
        if not (isinstance(key, str) and key.isdigit() and int(key) <= 0xFFFFFFFF):
            raise fields.error(name, f"has a round that is not a u32: {_short(key)}")
        if not isinstance(ids, list):
            raise fields.error(f"{name}.{key}", f"must be a list of batch ids, got {_short(ids)}")
        parsed = []
        for batch_id in ids:
            try:
                if not isinstance(batch_id, str) or len(batch_id) != 32:
                    raise ValueError
                parsed.append(bytes.fromhex(batch_id))
            except ValueError:
                raise fields.error(
                    f"{name}.{key}", f"holds {_short(batch_id)}, not a 32-hex-digit batch id"
                ) from None
        rounds[int(key)] = parsed
    return rounds


def _parse_batch_sizes(fields: _Fields, smallest: int | None, batches: int) -> dict[int, int]:
    raw = fields.data.get("batch_sizes")
    if raw is None:  # written before the field existed: pessimistic (see Checkpoint)
        return {smallest: batches} if smallest is not None and batches else {}
    sizes: dict[int, int] = {}
    for key, count in fields.counts("batch_sizes", raw).items():
        if not key.isdigit() or int(key) < 1:
            raise fields.error(f"batch_sizes.{key}", "must be keyed by a batch size >= 1")
        sizes[int(key)] = count
    if sum(sizes.values()) != batches:
        raise fields.error(
            "batch_sizes", f"counts {sum(sizes.values())} batches, counters.batches {batches}"
        )
    return sizes


def load_checkpoint(path: Path) -> Checkpoint:
    """The checked checkpoint at ``path``; :class:`CheckpointError` (one line, naming the
    file and, for a bad field, the field) otherwise."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise CheckpointError(f"cannot read checkpoint {path}: {_one_line(exc)}") from exc
    try:
        data = json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise CheckpointError(f"checkpoint {path} is not valid JSON ({_one_line(exc)})") from exc
    if not isinstance(data, dict):
        raise CheckpointError(f"checkpoint {path} is not a JSON object")
    fields = _Fields(path, data)
    version = fields.get("version")
    if version not in (1, CHECKPOINT_VERSION) or isinstance(version, bool):
        raise fields.error("version", f"must be 1 or {CHECKPOINT_VERSION}, got {_short(version)}")
    fingerprint = fields.get("fingerprint")
    if not isinstance(fingerprint, str):
        raise fields.error("fingerprint", f"must be a string, got {_short(fingerprint)}")
    delta = fields.get("delta")
    if isinstance(delta, bool) or not isinstance(delta, int | float) or not 0 < delta < 1:
        raise fields.error("delta", f"must be a number in (0, 1), got {_short(delta)}")
    try:
        state = AggregateState.from_dict(fields.get("state"))
    except CheckpointError:
        raise
    except (CocoError, KeyError, TypeError, ValueError, OverflowError, AttributeError) as exc:
        raise fields.error("state", f"is not a valid state ({_one_line(exc)})") from exc
    raw_counters = fields.get("counters")
    if not isinstance(raw_counters, dict):
        raise fields.error("counters", f"must be an object, got {_short(raw_counters)}")
    counters = Counters(
        reports=fields.count("counters.reports", fields.get("reports", raw_counters)),
        batches=fields.count("counters.batches", fields.get("batches", raw_counters)),
        duplicates=fields.count("counters.duplicates", fields.get("duplicates", raw_counters)),
        rejected=fields.counts("counters.rejected", fields.get("rejected", raw_counters)),
        rejected_reports=fields.counts(
            "counters.rejected_reports", raw_counters.get("rejected_reports", {})
        ),
        unacknowledged=fields.counts(
            "counters.unacknowledged", raw_counters.get("unacknowledged", {})
        ),
    )
    smallest = fields.optional_count("smallest_batch")
    last = fields.get("last_batch_timestamp")
    if last is not None and (isinstance(last, bool) or not isinstance(last, int | float)):
        raise fields.error("last_batch_timestamp", f"must be a number, got {_short(last)}")
    return Checkpoint(
        path=path,
        version=version,
        fingerprint=fingerprint,
        delta=float(delta),
        state=state,
        batch_rounds={} if version == 1 else _parse_batch_rounds(fields),
        counters=counters,
        smallest_batch=smallest,
        latest_batch=fields.optional_count("latest_batch"),
        batch_sizes=_parse_batch_sizes(fields, smallest, counters.batches),
        last_batch_timestamp=None if last is None else float(last),
    )


_HEX_PAIRS = np.array(
    [int.from_bytes(f"{byte:02x}".encode(), "little") for byte in range(256)], dtype=np.uint16
)
"""The two hex digits of each byte value, as the uint16 whose little-endian bytes they are."""
_QUOTE, _COMMA = ord('"'), ord(",")


def _quoted_hex(ids: tuple[bytes, ...]) -> str:
    """``"<hex>","<hex>",...`` of 16-byte ids, built by numpy in a few array operations.
    Formatting each id in Python (``b.hex()``, 10^5 bytecode loops per checkpoint) kept
    the writing thread competing with the event loop for the GIL: with 10^5 retained ids
    it was the largest part of the loop's lag in ``bench/bench_aggregator.py``."""
    if not ids:
        return ""
    raw = np.frombuffer(b"".join(ids), dtype=np.uint8).reshape(len(ids), 16)
    out = np.empty((len(ids), 35), dtype=np.uint8)  # " + 32 hex digits + " + ,
    out[:, 0] = out[:, 33] = _QUOTE
    out[:, 34] = _COMMA
    out[:, 1:33] = _HEX_PAIRS[raw].astype("<u2", copy=False).view(np.uint8)
    return out.tobytes()[:-1].decode("ascii")


def encode_checkpoint(snapshot: dict[str, Any]) -> str:
    """The checkpoint text of a :meth:`Aggregator._checkpoint_snapshot` (runs in a thread:
    the snapshot holds copies, nothing the event loop changes).

    Equal to ``json.dumps(document, separators=(",", ":"))`` with ``batch_rounds`` last,
    but the ids (hex digits: nothing to escape) are written by :func:`_quoted_hex` instead
    of the C encoder, which would hold the GIL for all of them in one call (about 100 ms
    for 10^5 ids, time the event loop could not run)."""
    state: AggregateState = snapshot.pop("state")
    rounds: dict[int, tuple[bytes, ...]] = snapshot.pop("batch_rounds")
    head = json.dumps({**snapshot, "state": state.to_dict()}, separators=(",", ":"))
    parts = [head[:-1], ',"batch_rounds":{']
    for i, (round_, ids) in enumerate(sorted(rounds.items())):
        parts.append(f'{"," if i else ""}"{round_}":[')
        parts.append(_quoted_hex(ids))
        parts.append("]")
    parts.append("}}")
    return "".join(parts)


def write_atomically(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "w") as fh:
        fh.write(text)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)
    with contextlib.suppress(OSError):  # make the rename durable where directories open
        fd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def write_checkpoint(path: Path, snapshot: dict[str, Any]) -> None:
    write_atomically(path, encode_checkpoint(snapshot))


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
        raise CheckpointLockedError(f"cannot lock {lock}: {_one_line(exc)}") from exc
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    return fd
