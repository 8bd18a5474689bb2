"""Prometheus metrics of the aggregator and the HTTP endpoint that serves them.

Every metric lives in an injected :class:`~prometheus_client.CollectorRegistry` (never the
global one). The ``dim`` label exists only for the bounded set of exported dimensions
(:attr:`AggregatorConfig.metrics_dims <aggregator.service.AggregatorConfig.metrics_dims>`),
so the series count does not grow with ``d``; no label ever names a device.

:class:`MetricsServer` serves, on one port, ``/metrics`` (Prometheus text format) and
``/estimates`` (JSON: spec, n, estimates, certified central epsilon for the smallest and the
latest batch, delta). It is a stdlib ``ThreadingHTTPServer`` in a daemon thread: the handler
reads an immutable snapshot that the event loop replaces after each batch, so no lock is
needed and a slow scraper never blocks the event loop.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import numpy as np
from prometheus_client import CollectorRegistry, Counter, Gauge, Info
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest

from aggregator.estimators import Estimates
from edge.spec import MechanismSpec

logger = logging.getLogger(__name__)

REJECT_REASONS = (
    "bad_length",
    "bad_version",
    "bad_kind",
    "bad_count",
    "bad_field",
    "fingerprint_mismatch",
    "z_out_of_range",
    "seed_out_of_range",
    "empty",
)
"""Every ``reason`` label of ``coco_aggregator_batches_rejected_total`` (pre-created at 0)."""


class AggregatorMetrics:
    """The aggregator's metrics, registered in ``registry``."""

    def __init__(
        self, registry: CollectorRegistry, *, spec: MechanismSpec, dims: Sequence[int]
    ) -> None:
        self.registry = registry
        self.dims = tuple(dims)
        p = "coco_aggregator"
        self.reports = Counter(
            f"{p}_reports", "Reports applied to the estimates.", registry=registry
        )
        self.batches = Counter(f"{p}_batches", "Batches applied.", registry=registry)
        self.rejected = Counter(
            f"{p}_batches_rejected",
            "Batches rejected, by reason.",
            ["reason"],
            registry=registry,
        )
        for reason in REJECT_REASONS:
            self.rejected.labels(reason=reason)
        self.duplicates = Counter(
            f"{p}_batches_duplicate",
            "Batches ignored because their batch_id was already applied (redeliveries).",
            registry=registry,
        )
        self.mean = Gauge(
            f"{p}_estimate_mean", "Estimated mean of x_j.", ["dim"], registry=registry
        )
        self.mean_halfwidth = Gauge(
            f"{p}_estimate_mean_ci_halfwidth",
            "Half-width of the confidence interval of the mean.",
            ["dim"],
            registry=registry,
        )
        self.freq = Gauge(
            f"{p}_estimate_freq",
            "Estimated share of reports with x_j != 0.",
            ["dim"],
            registry=registry,
        )
        self.epsilon_local = Gauge(
            f"{p}_epsilon_local", "Local epsilon of one report (spec).", registry=registry
        )
        self.epsilon_central = Gauge(
            f"{p}_epsilon_central",
            "Certified central epsilon of a shuffled batch (smallest seen, latest).",
            ["batch"],
            registry=registry,
        )
        self.delta = Gauge(f"{p}_delta", "Target delta of the accountant.", registry=registry)
        self.n = Gauge(f"{p}_n", "Reports in the current estimates.", registry=registry)
        self.info = Info(f"{p}_mechanism", "The mechanism in force.", registry=registry)
        self.last_batch = Gauge(
            f"{p}_last_batch_timestamp_seconds",
            "Unix time at which the last batch was applied.",
            registry=registry,
        )
        self.epsilon_local.set(spec.epsilon)
        self.info.info(
            {
                "mechanism": spec.mechanism,
                "d": str(spec.d),
                "s": str(spec.s),
                "t": str(spec.t),
                "fingerprint": spec.fingerprint,
            }
        )

    def set_estimates(self, estimates: Estimates) -> None:
        """Export the estimates of the bounded set of dimensions (NaN while ``n == 0``)."""
        self.n.set(estimates.n)
        halfwidth = estimates.mean_halfwidth
        for j in self.dims:
            label = str(j)
            self.mean.labels(dim=label).set(float(estimates.mean[j]))
            self.mean_halfwidth.labels(dim=label).set(float(halfwidth[j]))
            self.freq.labels(dim=label).set(float(estimates.freq[j]))

    def set_epsilon(self, *, smallest: float | None, latest: float | None) -> None:
        for name, value in (("smallest", smallest), ("latest", latest)):
            self.epsilon_central.labels(batch=name).set(np.nan if value is None else value)


class _Handler(BaseHTTPRequestHandler):
    server: _Server

    def do_GET(self) -> None:
        path = self.path.split("?", 1)[0]
        try:
            if path == "/metrics":
                body = generate_latest(self.server.registry)
                content_type = CONTENT_TYPE_LATEST
            elif path == "/estimates":
                body = json.dumps(self.server.estimates()).encode()
                content_type = "application/json"
            else:
                self.send_error(404, "try /metrics or /estimates")
                return
        except Exception:  # a failing snapshot must not kill the server thread
            logger.exception("error serving %s", path)
            self.send_error(500)
            return
        self.send_response(200)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        logger.debug("http: " + format, *args)


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(
        self,
        address: tuple[str, int],
        registry: CollectorRegistry,
        estimates: Callable[[], dict[str, Any]],
    ) -> None:
        super().__init__(address, _Handler)
        self.registry = registry
        self.estimates = estimates


class MetricsServer:
    """``/metrics`` and ``/estimates`` on ``host:port`` (``port=0`` picks a free port)."""

    def __init__(
        self,
        *,
        host: str,
        port: int,
        registry: CollectorRegistry,
        estimates: Callable[[], dict[str, Any]],
    ) -> None:
        self._server = _Server((host, port), registry, estimates)
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="coco-aggregator-http", daemon=True
        )

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
