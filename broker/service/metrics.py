"""Prometheus metrics of the shuffling bridge, on an injected ``CollectorRegistry``.

Privacy: no metric carries a device id, a topic or any other per-sender value. Every label
takes its values from a small fixed tuple (:data:`REJECT_REASONS`, :data:`DROP_REASONS`),
so the series set cannot grow with the fleet and a scrape reveals only aggregate counts.
All label values are pre-created at start-up, so a series appearing for the first time does
not reveal when its first event happened.
"""

from __future__ import annotations

import errno
import math
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily
from prometheus_client.registry import Collector

from edge.codec import REASONS as CODEC_REASONS
from edge.errors import CocoError

REJECT_REASONS: tuple[str, ...] = (
    *CODEC_REASONS,
    "unknown_fingerprint",
    "z_out_of_range",
    "duplicate_in_round",
    "round_too_old",
    "round_in_future",
    "round_full",
    "retained",
    "bad_topic",
    "bad_device_id",
    "wrong_shard",
)
"""Why an ingress message was refused (the ``reason`` label of the rejection counter)."""

DROP_REASONS: tuple[str, ...] = (
    "small_round",
    "at_shutdown",
    "carry_superseded",
    "unpublished_at_shutdown",
    "spec_changed",
)
"""Why accepted reports left the shuffler without being released (see ``broker.service.shuffler``);
``at_shutdown`` and ``unpublished_at_shutdown`` happen only without a state directory."""

BATCH_SIZE_BUCKETS = (
    2,
    5,
    10,
    20,
    50,
    100,
    200,
    500,
    1_000,
    2_000,
    5_000,
    10_000,
    20_000,
    50_000,
    100_000,
)
LATENCY_BUCKETS = (0.01, 0.05, 0.1, 0.5, 1, 5, 10, 30, 60, 300, 900, 3600, 14400, 86400)


class LiveCounts(Collector):
    """``coco_shuffler_reports_received_total`` and ``..._accepted_total`` as plain integers
    read at scrape time: the per-report path adds one to an int instead of taking two
    counter locks (the shuffler's ingest is single-threaded on its event loop)."""

    def __init__(self) -> None:
        self.received = 0
        """Ingress messages received (accepted + rejected)."""
        self.accepted = 0
        """Reports accepted into a round pool."""
        self._created = time.time()

    def collect(self) -> Iterator[CounterMetricFamily]:
        for name, documentation, value in (
            ("received", "Ingress messages received (accepted + rejected).", self.received),
            ("accepted", "Reports accepted into a round pool.", self.accepted),
        ):
            family = CounterMetricFamily(f"coco_shuffler_reports_{name}", documentation)
            family.add_metric([], value, created=self._created)
            yield family


class ShufflerMetrics:
    """The shuffler's metrics, registered on ``registry`` (never the global one)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        self.live = LiveCounts()
        registry.register(self.live)
        self.reports_rejected = Counter(
            "coco_shuffler_reports_rejected",
            "Ingress messages refused, by reason.",
            ["reason"],
            registry=registry,
        )
        self.batches_released = Counter(
            "coco_shuffler_batches_released",
            "Shuffled batches published and acknowledged by the broker.",
            registry=registry,
        )
        self.manifests_published = Counter(
            "coco_shuffler_manifests_published",
            "Signed release manifests published and acknowledged by the broker (one per "
            "release, after its batches).",
            registry=registry,
        )
        self.reports_released = Counter(
            "coco_shuffler_reports_released",
            "Reports inside published, acknowledged batches.",
            registry=registry,
        )
        self.batch_size = Histogram(
            "coco_shuffler_batch_size",
            "Number of reports in each published batch.",
            buckets=BATCH_SIZE_BUCKETS,
            registry=registry,
        )
        self.buffer_reports = Gauge(
            "coco_shuffler_buffer_reports",
            "Accepted reports waiting in round buffers.",
            registry=registry,
        )
        self.outbox_reports = Gauge(
            "coco_shuffler_outbox_reports",
            "Reports in shuffled batches waiting for the broker's PUBACK.",
            registry=registry,
        )
        self.release_latency = Histogram(
            "coco_shuffler_release_latency_seconds",
            "Time from the end of a batch's round to the broker's PUBACK of the batch.",
            buckets=LATENCY_BUCKETS,
            registry=registry,
        )
        self.min_batch = Gauge(
            "coco_shuffler_min_batch",
            "The smallest batch the shuffler releases.",
            registry=registry,
        )
        self.dropped = Counter(
            "coco_shuffler_dropped",
            "Accepted reports discarded without release, by reason.",
            ["reason"],
            registry=registry,
        )
        self.connected = Gauge(
            "coco_shuffler_connected",
            "1 while connected to the broker, else 0.",
            registry=registry,
        )
        self.recovered_reports = Gauge(
            "coco_shuffler_recovered_reports",
            "Reports found in the state directory at start (pools and unacknowledged batches); "
            "NaN until the state is recovered.",
            registry=registry,
        )
        self.ready = Gauge(
            "coco_shuffler_ready",
            "1 once the state is recovered and the ingest subscribed (GET /ready: 200), else 0.",
            registry=registry,
        )
        self.log_paused = Gauge(
            "coco_shuffler_log_paused",
            "1 while writes to the state directory's log fail for lack of space: nothing is "
            "acknowledged, the ingest is disconnected, writes are retried.",
            registry=registry,
        )
        self.log_full = Counter(
            "coco_shuffler_log_full",
            "Writes to the log that failed for lack of space (each one retried later).",
            registry=registry,
        )
        self.sessions_new = Counter(
            "coco_shuffler_sessions_new",
            "Ingest connections for which the broker held no session (its CONNACK's session "
            "present flag unset): the first start, or the broker lost the session. Reports "
            "published while no session existed were not queued for the shuffler and are lost "
            "uncounted; more than one per state directory means the broker lost a session.",
            registry=registry,
        )
        self.reconnects = Counter(
            "coco_shuffler_reconnects",
            "Connection attempts after a lost or failed connection.",
            registry=registry,
        )
        for reason in REJECT_REASONS:
            self.reports_rejected.labels(reason=reason)
        for reason in DROP_REASONS:
            self.dropped.labels(reason=reason)

    def reject(self, reason: str, count: int = 1, *, received: bool = True) -> None:
        """Count ``count`` rejected messages; ``reason`` must be in the fixed set.
        ``received``: count them as received too (not when they were counted on arrival
        and rejected when settled)."""
        if reason not in REJECT_REASONS:  # never let an unexpected string become a series
            raise ValueError(f"unknown rejection reason {reason!r}")
        if received:
            self.live.received += count
        self.reports_rejected.labels(reason=reason).inc(count)

    def drop(self, reason: str, count: int) -> None:
        """Count ``count`` accepted reports discarded without release."""
        if reason not in DROP_REASONS:
            raise ValueError(f"unknown drop reason {reason!r}")
        if count:
            self.dropped.labels(reason=reason).inc(count)


def _not_ready(registry: CollectorRegistry) -> bytes:
    """The body of a 503 from ``/ready``: why, in one line, from the gauges."""
    recovered = registry.get_sample_value("coco_shuffler_recovered_reports")
    if registry.get_sample_value("coco_shuffler_log_paused") == 1:
        why = "the state directory's disk is full: acknowledgements paused, retrying"
    elif recovered is None or math.isnan(recovered):
        why = "recovering the state"
    else:
        why = "not subscribed to the ingress topic"
    return f"not ready: {why}\n".encode()


def serve_http(
    port: int,
    registry: CollectorRegistry,
    host: str = "",
    option: str = "--metrics-port (COCO_METRICS_PORT)",
) -> ThreadingHTTPServer:
    """``GET /metrics`` (Prometheus text) and ``GET /ready`` (200 once
    ``coco_shuffler_ready`` is 1: the state recovered and the ingest subscribed; 503
    before, while reconnecting, or while a full disk pauses it), in a daemon thread. A port
    that cannot be bound is a :class:`CocoError` naming it and ``option``."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # the http.server API
            path = self.path.split("?", 1)[0]
            if path == "/ready":
                ready = registry.get_sample_value("coco_shuffler_ready") == 1
                self._reply(200 if ready else 503, b"ready\n" if ready else _not_ready(registry))
            elif path in ("/metrics", "/"):
                self._reply(200, generate_latest(registry), CONTENT_TYPE_LATEST)
            else:
                self._reply(404, b"not found\n")

        def _reply(self, code: int, body: bytes, kind: str = "text/plain") -> None:
            self.send_response(code)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *_: object) -> None:  # no access log
            return

    try:
        server = ThreadingHTTPServer((host, port), Handler)
    except OSError as exc:  # the aggregator's wording (aggregator/service/http.py)
        problem = (
            "is in use" if exc.errno == errno.EADDRINUSE else f"cannot be bound ({exc.strerror})"
        )
        where = f" on {host}" if host else ""
        raise CocoError(f"port {port}{where} {problem}: choose another with {option}") from None
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, name="shuffler-http", daemon=True).start()
    return server
