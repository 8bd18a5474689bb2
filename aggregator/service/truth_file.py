"""``GET /truth`` of ``coco aggregator run --truth FILE`` (SIMULATION ONLY): a simulated
fleet's ground-truth file served beside the estimates, so that the live page and
``coco aggregator plot`` can draw the per-round truth next to the per-round estimate.

The file is the one ``coco fleet --ground-truth`` (or ``coco demo``) rewrites after every
round; :class:`TruthFile` reads it again whenever it changed (its size, modification time
or inode) and otherwise answers from what it read. What it serves is
:meth:`aggregator.page.truth.TruthTable.select`'s document. It never fails the service: a
file that does not exist (yet) or is not a ground-truth document is a 404 whose one line
says why, a malformed query a 400; each is counted in
``coco_aggregator_truth_requests_rejected_total{reason}`` (``no_truth``, ``query``).
:class:`TruthMemory` answers the same from a document a simulation keeps in memory
(``coco demo --serve``).
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry, Counter

from aggregator.page.truth import TruthError, TruthTable, parse_query, parse_truth

__all__ = ["MAX_TRUTH_BYTES", "TRUTH_REJECT_REASONS", "TruthAnswer", "TruthFile", "TruthMemory"]

MAX_TRUTH_BYTES = 128 * 1024 * 1024
"""A larger file is not read (a round takes about 600 bytes at d = 8: a week of 10-s rounds
is about 40 MB)."""
TRUTH_REJECT_REASONS = ("no_truth", "query")

TruthAnswer = tuple[int, str, bytes]
"""HTTP status, content type, body."""


def _text(status: int, line: str) -> TruthAnswer:
    return status, "text/plain; charset=utf-8", f"{line}\n".encode()


class _TruthServer:
    """The ``/truth`` answers of a table (module docs) and their rejection counter."""

    def __init__(self, registry: CollectorRegistry | None) -> None:
        self._rejected = Counter(
            "coco_aggregator_truth_requests_rejected",
            "SIMULATION ONLY: /truth requests refused, by reason (no_truth: no usable "
            "ground truth, e.g. the --truth file is missing; query: a malformed query).",
            ["reason"],
            registry=registry,
        )
        for reason in TRUTH_REJECT_REASONS:
            self._rejected.labels(reason=reason)

    def table(self) -> TruthTable:
        raise NotImplementedError

    def answer(self, query: str, now: float) -> TruthAnswer:
        """The response to ``GET /truth?<query>`` at Unix time ``now``."""
        try:
            table = self.table()
        except TruthError as exc:
            self._rejected.labels(reason="no_truth").inc()
            return _text(404, str(exc))
        try:
            document = table.select(parse_query(query, now=now, d=table.d))
        except TruthError as exc:
            self._rejected.labels(reason="query").inc()
            return _text(400, f"bad /truth query: {exc}")
        return 200, "application/json", json.dumps(document).encode()


class TruthMemory(_TruthServer):
    """The ``/truth`` of a document a simulation keeps in memory (``coco demo --serve``):
    ``document`` returns the latest one (``None`` before the first round)."""

    def __init__(
        self,
        document: Callable[[], dict[str, Any] | None],
        *,
        registry: CollectorRegistry | None = None,
    ) -> None:
        super().__init__(registry)
        self._document = document

    def table(self) -> TruthTable:
        doc = self._document()
        if doc is None:
            raise TruthError("no simulation truth yet: no round published")
        return parse_truth(doc)


class TruthFile(_TruthServer):
    """The ``/truth`` answers of one ground-truth file (module docs); thread-safe."""

    def __init__(self, path: Path, *, registry: CollectorRegistry | None = None) -> None:
        super().__init__(registry)
        self.path = path
        self._lock = threading.Lock()
        self._key: tuple[int, int, int] | None = None
        self._table: TruthTable | None = None
        self._error = ""

    def table(self) -> TruthTable:
        """The file's rounds, read again if it changed; :class:`TruthError` (one line) if
        there is no usable file."""
        try:
            st = os.stat(self.path)
        except OSError as exc:
            raise TruthError(
                f"no simulation truth: {self.path} cannot be read ({exc.strerror})"
            ) from None
        key = (st.st_ino, st.st_size, st.st_mtime_ns)
        with self._lock:
            if key != self._key:
                self._table, self._error = self._read(st.st_size)
                self._key = key
            if self._table is None:
                raise TruthError(self._error)
            return self._table

    def _read(self, size: int) -> tuple[TruthTable | None, str]:
        where = f"no simulation truth: {self.path}"
        if size > MAX_TRUTH_BYTES:
            return None, f"{where} is larger than {MAX_TRUTH_BYTES} bytes"
        try:
            return parse_truth(json.loads(self.path.read_bytes())), ""
        except OSError as exc:
            return None, f"{where} cannot be read ({exc.strerror})"
        except TruthError as exc:
            return None, f"{where} is not a ground-truth file of coco fleet: {exc}"
        except ValueError:  # JSON (a file being replaced is renamed over whole: not torn)
            return None, f"{where} is not JSON"
