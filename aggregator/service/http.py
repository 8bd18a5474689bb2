"""The aggregator's HTTP endpoint.

:class:`MetricsServer` serves, on one port, ``/ready`` (200 once the checkpoint is
recovered and the batches topic subscribed, else 503, whose body says why in one line, as the
source's ``not_ready`` tells it; ``coco_aggregator_ready`` alike;
before recovery ``/metrics`` serves that gauge alone and ``/estimates`` answers 503), the
live page at ``/``
(:mod:`aggregator.page.live_page`), ``/metrics`` (Prometheus text format) and
``/estimates`` (JSON: spec, n, estimates, certified central epsilon for the smallest and the
latest batch, delta, the counters and the retained horizon; rebuilt for every request, so
they never lag ``/metrics``), and the series: ``/series`` and ``/estimates?window=W``
(:mod:`aggregator.service.series_view`, written piece by piece; 400 with one line for a
malformed query, 404 where the service keeps no series), and, SIMULATION ONLY, ``/truth`` (a
simulated fleet's per-round ground truth: :mod:`aggregator.service.truth_file`). It is a stdlib
``ThreadingHTTPServer`` in a daemon thread: the handler asks the event loop for a fresh
snapshot (an immutable document the loop replaces; :mod:`aggregator.service.publishing`)
and waits for it, so no lock is needed and a slow scraper never blocks the event loop.

What it serves is a :class:`Source` (the registry and the callables behind ``/estimates``,
``/ready`` and the recovery gate), which :meth:`MetricsServer.serve` replaces on the live
socket: a server handed to an :class:`~aggregator.service.service.Aggregator` (``http=``) outlives
it and goes on serving the stopped service's final state, and ``coco demo --serve`` keeps
one server from its first report to Ctrl-C.
"""

from __future__ import annotations

import errno
import json
import logging
import sys
import threading
import time
import urllib.parse
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest

from aggregator.page.live_page import CONTENT_SECURITY_POLICY, PAGE
from aggregator.service.metrics import ready_gauge
from edge.errors import CocoError

if TYPE_CHECKING:
    from aggregator.service.series_view import Reply

__all__ = ["MetricsServer", "Source"]

logger = logging.getLogger("aggregator.service.metrics")

_RECOVERING = CollectorRegistry()
ready_gauge(_RECOVERING).set(0)
"""What ``/metrics`` serves before the checkpoint is recovered: the readiness gauge alone,
so that no counter is shown as zero."""
_GONE = (BrokenPipeError, ConnectionResetError, ConnectionAbortedError, TimeoutError)
"""A client that went away mid-response: nothing to tell anyone."""


class _Handler(BaseHTTPRequestHandler):
    server: _Server

    def handle(self) -> None:
        try:
            super().handle()
        except _GONE:  # a scraper that timed out and closed: no traceback
            self.close_connection = True

    def do_GET(self) -> None:
        path, _, query = self.path.partition("?")
        params = urllib.parse.parse_qs(query, keep_blank_values=True)
        headers: dict[str, str] = {}
        source = self.server.source  # read once: a switch of source never splits a request
        recovered = source.recovered()
        if path == "/series" or (path == "/estimates" and "window" in params):
            self._query(source, path, params, recovered)
            return
        try:
            if path == "/ready":
                why = None if source.ready() else source.not_ready() or ""
                text = "ready" if why is None else f"not ready: {why}" if why else "not ready"
                status = 200 if why is None else 503
                self._send(status, f"{text}\n".encode(), "text/plain; charset=utf-8", {})
                return
            if path == "/metrics" and not recovered:
                self._send(200, generate_latest(_RECOVERING), CONTENT_TYPE_LATEST, {})
                return
            if path == "/estimates" and not recovered:
                body = json.dumps({"ready": False, "recovering": True}).encode()
                self._send(503, body, "application/json", {})
                return
            if path == "/":
                body = PAGE
                content_type = "text/html; charset=utf-8"
                headers = {
                    "Content-Security-Policy": CONTENT_SECURITY_POLICY,
                    "Cache-Control": "no-cache",
                }
            elif path == "/favicon.ico":
                self.send_response(204)
                self.end_headers()
                return
            elif path == "/metrics":
                body = generate_latest(source.registry)
                content_type = CONTENT_TYPE_LATEST
            elif path == "/estimates":
                body = json.dumps(source.estimates()).encode()
                content_type = "application/json"
            elif path == "/truth":
                status, content_type, body = _truth(source, query)
                self._send(status, body, content_type, {"Cache-Control": "no-cache"})
                return
            else:
                self.send_error(404, "try /, /metrics, /estimates, /series or /ready")
                return
        except Exception:  # a failing snapshot must not kill the server thread
            logger.exception("error serving %s", path)
            self.send_error(500)
            return
        self._send(200, body, content_type, headers)

    def _query(
        self, source: Source, path: str, params: dict[str, list[str]], recovered: bool
    ) -> None:
        """``/series`` and ``/estimates?window=W``: the source's :class:`Reply`, written
        piece by piece (its length is not known before; the connection closes after it)."""
        if source.query is None:
            self._send(404, b"no series here\n", "text/plain; charset=utf-8", {})
            return
        if not recovered:
            self._send(503, b"recovering the checkpoint\n", "text/plain; charset=utf-8", {})
            return
        try:
            reply = source.query(path, params)
        except Exception:  # a failing query must not kill the server thread
            logger.exception("error serving %s", path)
            self.send_error(500)
            return
        body = reply.body
        try:
            self.send_response(reply.status)
            self.send_header("Content-Type", reply.content_type)
            self.send_header("Cache-Control", "no-cache")
            self.end_headers()
            for piece in body:
                self.wfile.write(piece)
        except _GONE:
            self.close_connection = True
        except Exception:  # the head is out: end the answer short, keep serving
            logger.exception("error writing %s", path)
            self.close_connection = True
        finally:
            close = getattr(body, "close", None)
            if close is not None:
                close()

    def _send(self, status: int, body: bytes, content_type: str, headers: dict[str, str]) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        for name, value in headers.items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        logger.debug("http: " + format, *args)


def _truth(source: Source, query: str) -> tuple[int, str, bytes]:
    """``/truth``: the source's answer, or a 404 where it has no simulation truth."""
    if source.truth is None:
        line = "no simulation truth: the aggregator was started without --truth (simulation only)"
        return 404, "text/plain; charset=utf-8", f"{line}\n".encode()
    return source.truth(query, time.time())


@dataclass(frozen=True)
class Source:
    """What a :class:`MetricsServer` serves: a registry and four callables (module docs;
    ``not_ready`` says why it is not ready, ``None`` for no reason given)."""

    registry: CollectorRegistry
    estimates: Callable[[], dict[str, Any]]
    ready: Callable[[], bool] = lambda: True
    recovered: Callable[[], bool] = lambda: True
    not_ready: Callable[[], str | None] = lambda: None
    query: Callable[[str, Mapping[str, Sequence[str]]], Reply] | None = None
    """``/series`` and ``/estimates?window=W`` (path, query parameters);
    :meth:`aggregator.service.series_view.SeriesView.answer`. ``None``: 404."""
    truth: Callable[[str, float], tuple[int, str, bytes]] | None = None
    """SIMULATION ONLY: ``/truth`` (query, now) -> (status, content type, body), with
    ``--truth`` (:mod:`aggregator.service.truth_file`); ``None``: 404."""


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, address: tuple[str, int], source: Source) -> None:
        super().__init__(address, _Handler)
        self.source = source

    def handle_error(self, request: Any, client_address: Any) -> None:
        if isinstance(sys.exc_info()[1], _GONE):
            return  # a client that went away: no traceback
        super().handle_error(request, client_address)


class MetricsServer:
    """``/``, ``/metrics``, ``/estimates`` and ``/ready`` on ``host:port`` (``port=0`` picks
    a free port), from a :class:`Source` that :meth:`serve` may replace. A port that cannot
    be bound is a one-line :class:`CocoError` naming it and ``option`` (the command's option
    for it; ``--metrics-port`` by default)."""

    def __init__(
        self,
        *,
        host: str,
        port: int,
        registry: CollectorRegistry,
        estimates: Callable[[], dict[str, Any]],
        ready: Callable[[], bool] = lambda: True,
        recovered: Callable[[], bool] = lambda: True,
        not_ready: Callable[[], str | None] = lambda: None,
        query: Callable[[str, Mapping[str, Sequence[str]]], Reply] | None = None,
        truth: Callable[[str, float], tuple[int, str, bytes]] | None = None,
        option: str = "--metrics-port (COCO_METRICS_PORT)",
    ) -> None:
        source = Source(registry, estimates, ready, recovered, not_ready, query, truth)
        try:
            self._server = _Server((host, port), source)
        except OSError as exc:
            problem = (
                "is in use"
                if exc.errno == errno.EADDRINUSE
                else f"cannot be bound ({exc.strerror})"
            )
            raise CocoError(
                f"port {port} on {host} {problem}: choose another with {option}"
            ) from None
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="coco-aggregator-http", daemon=True
        )

    def serve(self, source: Source) -> None:
        """Serve ``source`` from the next request on, on the same socket: the port never
        closes in between (``coco demo --serve`` hands the page from the running aggregator
        to the run's final state this way)."""
        self._server.source = source  # one reference: a request reads the old or the new

    @property
    def source(self) -> Source:
        return self._server.source

    @property
    def port(self) -> int:
        port: int = self._server.server_address[1]
        return port

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        if self._thread.is_alive():
            self._server.shutdown()
            self._thread.join(timeout=5)
        self._server.server_close()
