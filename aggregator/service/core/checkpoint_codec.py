"""The aggregator checkpoint's text: written, read and checked, with no I/O (the data
model: :mod:`aggregator.service.core.checkpoint`; the files:
:mod:`aggregator.service.checkpoint_files`).

Separate from the data model because it is most of the code and all of the versions: the
readers of versions 1 to 4, field by field with one-line errors, the checksums, and a
writer tuned to spare the event loop.

A checkpoint is one UTF-8 JSON object (:func:`encode_checkpoint`)::

    {"version": 4, "generation": 17, "fingerprint": ..., "deployment": ..., "delta": ...,
     "trusted": ..., "retention_rounds": ..., "counters": {...},
     "smallest_batch": ..., "latest_batch": ..., "batch_sizes": {...},
     "last_batch_timestamp": ..., "written_at": ..., "shards": {"<label>": {...}},
     "reconciliation": {...}, "state": AggregateState.to_dict(),
     "ledger": {"generation": 41, "sha256": "<64 hex>"}, "series": {"seq": 812},
     "newest_length": 60, "forgotten": [<start>, <start>],
     "batch_rounds": {"<start>": ["<32 hex>", ...]},
     "checksums": {"<field>": "<32 hex>"}}

The fields are those of :class:`~aggregator.service.core.checkpoint.Checkpoint` (whose module
says what each holds). A checkpoint of version 3 or older keyed rounds by their numbers: it is
read as it is, and made one of round starts by
:mod:`aggregator.service.core.checkpoint_migration`.

Integrity
---------
``checksums`` holds, for every other field, the first 128 bits of the SHA-256 of its value
as compact JSON. :func:`decode_checkpoint` checks each field's form first, then its
checksum, and names the file and the field in a one-line :class:`CheckpointError`: a digit
changed in ``sum_u`` (valid JSON, a plausible number) is ``field 'state' does not match its
checksum``, never a silently wrong sum. Files of versions 1 and 2 (written before checksums)
are read as before and rewritten as version 3 at the next checkpoint.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import numpy as np

from aggregator.estimation.estimators import AggregateState
from aggregator.service.core.checkpoint import (
    CHECKPOINT_VERSION,
    Checkpoint,
    CheckpointError,
    Counters,
    LedgerRecord,
    one_line,
)
from aggregator.service.core.keys import is_anchor
from aggregator.service.core.manifests import Reconciler
from edge.errors import CocoError
from edge.rounds import MAX_START

CHECKSUM_HEX = 32
_ORDER = (
    "version",
    "generation",
    "fingerprint",
    "deployment",
    "delta",
    "trusted",
    "retention_rounds",
    "counters",
    "smallest_batch",
    "latest_batch",
    "batch_sizes",
    "last_batch_timestamp",
    "written_at",
    "shards",
    "reconciliation",
    "state",
    "ledger",
    "series",
    "newest_length",
    "forgotten",
    "batch_rounds",
)
"""The fields of a version-3 checkpoint, in the order they are written (``checksums``
last; ``ledger`` and ``series`` absent from files written before they existed)."""
_DIGEST_HEX = 64


def _short(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


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


def _parse_batch_rounds(fields: _Fields, version: int) -> dict[int, list[bytes]]:
    name = "batch_rounds"
    raw = fields.get(name)
    if not isinstance(raw, dict):
        raise fields.error(name, f"must be an object of rounds, got {_short(raw)}")
    rounds: dict[int, list[bytes]] = {}
    high, what = (MAX_START, "a round start") if version >= 4 else (0xFFFFFFFF, "a u32")
    for key, ids in raw.items():
        if not (isinstance(key, str) and key.isdigit() and int(key) <= high):
            raise fields.error(name, f"has a round that is not {what}: {_short(key)}")
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
    if fields.data.get("version") == 2 and sum(sizes.values()) != batches:
        raise fields.error(
            "batch_sizes", f"counts {sum(sizes.values())} batches, counters.batches {batches}"
        )
    return sizes


def _parse_counters(fields: _Fields) -> Counters:
    raw = fields.get("counters")
    if not isinstance(raw, dict):
        raise fields.error("counters", f"must be an object, got {_short(raw)}")
    return Counters(
        reports=fields.count("counters.reports", fields.get("reports", raw)),
        batches=fields.count("counters.batches", fields.get("batches", raw)),
        duplicates=fields.count("counters.duplicates", fields.get("duplicates", raw)),
        rejected=fields.counts("counters.rejected", fields.get("rejected", raw)),
        rejected_reports=fields.counts(
            "counters.rejected_reports", raw.get("rejected_reports", {})
        ),
        unacknowledged=fields.counts("counters.unacknowledged", raw.get("unacknowledged", {})),
        manifests_rejected=fields.counts(
            "counters.manifests_rejected", raw.get("manifests_rejected", {})
        ),
        manifests_duplicate=fields.count(
            "counters.manifests_duplicate", raw.get("manifests_duplicate", 0)
        ),
    )


def _parse_trusted(fields: _Fields) -> str:
    trusted = fields.get("trusted")
    if not is_anchor(trusted):
        raise fields.error(
            "trusted", f"is neither a batch key nor shard layouts: {_short(trusted)}"
        )
    assert isinstance(trusted, str)
    return trusted


def _parse_shards(fields: _Fields) -> dict[str, dict[str, int | None]]:
    raw = fields.get("shards")
    if not isinstance(raw, dict):
        raise fields.error("shards", f"must be an object of shards, got {_short(raw)}")
    shards: dict[str, dict[str, int | None]] = {}
    for label, stats in raw.items():
        name = f"shards.{label}"
        if not isinstance(stats, dict) or set(stats) != {
            "batches",
            "reports",
            "smallest",
            "latest",
        }:
            raise fields.error(
                name, f"must hold batches, reports, smallest, latest: {_short(stats)}"
            )
        shards[label] = {
            key: None
            if value is None and key in ("smallest", "latest")
            else fields.count(f"{name}.{key}", value)
            for key, value in stats.items()
        }
    return shards


def _parse_reconciliation(fields: _Fields) -> dict[str, Any]:
    raw = fields.get("reconciliation")
    try:
        if not isinstance(raw, dict):
            raise TypeError("not an object")
        Reconciler.from_json(raw, grace=1.0, min_batch=1)
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise fields.error("reconciliation", f"is not valid ({one_line(exc)})") from None
    return raw


def _parse_ledger(fields: _Fields) -> LedgerRecord | None:
    raw = fields.data.get("ledger")
    if "ledger" not in fields.data:
        return None
    if not (isinstance(raw, dict) and set(raw) == {"generation", "sha256"}):
        raise fields.error("ledger", f"must hold generation and sha256, got {_short(raw)}")
    digest = raw["sha256"]
    if not (
        isinstance(digest, str)
        and len(digest) == _DIGEST_HEX
        and all(c in "0123456789abcdef" for c in digest)
    ):
        raise fields.error("ledger.sha256", f"must be {_DIGEST_HEX} hex digits: {_short(digest)}")
    return LedgerRecord(fields.count("ledger.generation", raw["generation"]), digest)


def _parse_series(fields: _Fields) -> int | None:
    if "series" not in fields.data:
        return None
    raw = fields.data["series"]
    if raw is None:
        return None
    if not (isinstance(raw, dict) and set(raw) == {"seq"}):
        raise fields.error("series", f"must hold seq, got {_short(raw)}")
    return fields.count("series.seq", raw["seq"])


def _checksum(value: object) -> str:
    text = json.dumps(value, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:CHECKSUM_HEX]


def _verify_checksums(fields: _Fields) -> None:
    """Every field's value against its checksum; a one-line error naming the first field
    that differs (or the ``checksums`` field itself when it is malformed)."""
    sums = fields.get("checksums")
    names = [name for name in fields.data if name != "checksums"]
    if not isinstance(sums, dict) or sorted(sums) != sorted(names):
        raise fields.error("checksums", "does not list the other fields: the file is damaged")
    for name in names:
        if sums[name] != _checksum(fields.data[name]):
            raise fields.error(name, "does not match its checksum: the file is damaged")


def decode_checkpoint(text: str, path: Path) -> Checkpoint:
    """The checked checkpoint of ``text`` (read from ``path``, named in errors):
    :class:`CheckpointError`, one line naming the file and, for a field, the field."""
    try:
        data = json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise CheckpointError(f"checkpoint {path} is not valid JSON ({one_line(exc)})") from exc
    if not isinstance(data, dict):
        raise CheckpointError(f"checkpoint {path} is not a JSON object")
    fields = _Fields(path, data)
    version = fields.get("version")
    if version not in (1, 2, 3, CHECKPOINT_VERSION) or isinstance(version, bool):
        raise fields.error("version", f"must be 1 to {CHECKPOINT_VERSION}, got {_short(version)}")
    checked = version >= 3  # with checksums
    if checked:
        unknown = sorted(set(data) - {*_ORDER, "checksums"})
    else:  # a damaged key name must not pass as an older version's file
        unknown = sorted(
            set(data) & {"checksums", "generation", "trusted", "reconciliation", "ledger", "series"}
        )
    if unknown:
        raise fields.error(unknown[0], f"is not a field of a version-{version} checkpoint")
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
        raise fields.error("state", f"is not a valid state ({one_line(exc)})") from exc
    counters = _parse_counters(fields)
    smallest = fields.optional_count("smallest_batch")
    last = fields.get("last_batch_timestamp")
    if last is not None and (isinstance(last, bool) or not isinstance(last, int | float)):
        raise fields.error("last_batch_timestamp", f"must be a number, got {_short(last)}")
    generation = 0 if not checked else fields.count("generation", fields.get("generation"))
    deployment = data.get("deployment")
    checkpoint = Checkpoint(
        path=path,
        version=version,
        generation=generation,
        fingerprint=fingerprint,
        deployment=deployment if isinstance(deployment, str) else None,
        delta=float(delta),
        trusted=_parse_trusted(fields) if checked else None,
        state=state,
        batch_rounds={} if version == 1 else _parse_batch_rounds(fields, version),
        counters=counters,
        smallest_batch=smallest,
        latest_batch=fields.optional_count("latest_batch"),
        batch_sizes=_parse_batch_sizes(fields, smallest, counters.batches),
        last_batch_timestamp=None if last is None else float(last),
        written_at=_optional_time(data.get("written_at")),
        newest_length=_parse_length(fields) if version == CHECKPOINT_VERSION else None,
        forgotten=_parse_forgotten(fields) if version == CHECKPOINT_VERSION else None,
        retention_rounds=_optional_rounds(data.get("retention_rounds")),
        shards=_parse_shards(fields) if checked else {},
        reconciliation=_parse_reconciliation(fields) if checked else None,
        ledger=_parse_ledger(fields) if checked else None,
        series_seq=_parse_series(fields) if checked else None,
    )
    if checked:
        _verify_checksums(fields)
    return checkpoint


def _parse_forgotten(fields: _Fields) -> tuple[int, int] | None:
    raw = fields.data.get("forgotten")
    if raw is None:
        return None
    if not isinstance(raw, list) or len(raw) != 2:
        raise fields.error("forgotten", f"must be [first, high], got {_short(raw)}")
    first, high = (fields.count("forgotten", value) for value in raw)
    if not first <= high <= MAX_START:
        raise fields.error("forgotten", f"must be two round starts, first <= high: {raw}")
    return first, high


def _parse_length(fields: _Fields) -> int | None:
    if "newest_length" not in fields.data:
        return None
    raw = fields.data["newest_length"]
    if raw is None:
        return None
    length = fields.count("newest_length", raw)
    if not 1 <= length <= 86_400:
        raise fields.error("newest_length", f"must be a round length in [1, 86400]: {length}")
    return length


def _optional_time(value: object) -> float | None:
    """``written_at`` (informative: read when it is a number, else ``None``)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


def _optional_rounds(value: object) -> int | None:
    """``retention_rounds`` (informative: read when it is a count, else ``None``)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        return None
    return value


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


def _document_head(checkpoint: Checkpoint) -> dict[str, Any]:
    head: dict[str, Any] = {
        "version": checkpoint.version,
        "generation": checkpoint.generation,
        "fingerprint": checkpoint.fingerprint,
        "deployment": checkpoint.deployment,
        "delta": checkpoint.delta,
        "trusted": checkpoint.trusted,
        "retention_rounds": checkpoint.retention_rounds,
        "counters": checkpoint.counters.to_dict(),
        "smallest_batch": checkpoint.smallest_batch,
        "latest_batch": checkpoint.latest_batch,
        "batch_sizes": {str(n): c for n, c in sorted(checkpoint.batch_sizes.items())},
        "last_batch_timestamp": checkpoint.last_batch_timestamp,
        "written_at": checkpoint.written_at,
        "shards": checkpoint.shards,
        "reconciliation": checkpoint.reconciliation,
        "state": checkpoint.state.to_dict(),
    }
    if checkpoint.ledger is not None:
        head["ledger"] = checkpoint.ledger.to_dict()
    if checkpoint.series_seq is not None:
        head["series"] = {"seq": checkpoint.series_seq}
    if checkpoint.newest_length is not None:
        head["newest_length"] = checkpoint.newest_length
    if checkpoint.forgotten is not None:
        head["forgotten"] = list(checkpoint.forgotten)
    return head


def encode_checkpoint(checkpoint: Checkpoint) -> str:
    """The text of a version-3 checkpoint (runs in a thread: ``checkpoint`` holds copies,
    nothing the event loop changes).

    Equal to ``json.dumps(document, separators=(",", ":"))`` of the fields in
    :data:`_ORDER` and ``checksums``, but the ids (hex digits: nothing to escape) are
    written by :func:`_quoted_hex` instead of the C encoder, which would hold the GIL for
    all of them in one call (about 100 ms for 10^5 ids, time the event loop could not
    run)."""
    head = _document_head(checkpoint)
    sums = {name: _checksum(value) for name, value in head.items()}
    parts = ['"batch_rounds":{']
    for i, (round_, ids) in enumerate(sorted(checkpoint.batch_rounds.items())):
        parts.append(f'{"," if i else ""}"{round_}":[')
        parts.append(_quoted_hex(tuple(ids)))
        parts.append("]")
    parts.append("}")
    rounds = "".join(parts)
    sums["batch_rounds"] = hashlib.sha256(rounds[len('"batch_rounds":') :].encode()).hexdigest()[
        :CHECKSUM_HEX
    ]
    text = json.dumps(head, separators=(",", ":"))
    tail = json.dumps({"checksums": sums}, separators=(",", ":"))
    return f"{text[:-1]},{rounds},{tail[1:]}"
