"""Prometheus metrics of the aggregator and the HTTP endpoint that serves them.

Every metric lives in an injected :class:`~prometheus_client.CollectorRegistry` (never the
global one). The ``dim`` label exists only for the bounded set of exported dimensions
(:attr:`AggregatorConfig.metrics_dims <aggregator.service.AggregatorConfig.metrics_dims>`),
so the series count does not grow with ``d``; no label ever names a device.

Privacy level for operators
---------------------------
``coco_aggregator_epsilon_central{batch="smallest"|"latest"}`` is the certified central
epsilon of the batches actually applied. ``coco_aggregator_epsilon_central_curve{n}`` is the
same certified bound (:func:`~aggregator.accountant.amplify_spec`, never the paper's
uncertified mechanism-specific value) for the spec in force on a fixed grid of batch sizes
(:func:`epsilon_curve_grid`: at most :data:`MAX_CURVE_POINTS` values of ``n``), so a
dashboard can show what a larger ``min_batch`` would buy. ``coco_aggregator_epsilon_target``
is the operator's target (``--epsilon-target``); it is not exported at all when no target is
set, so a dashboard draws no line rather than a made-up one.

Lag is left to PromQL: ``time() - coco_aggregator_last_batch_timestamp_seconds`` (seconds
since the last applied batch) and ``coco_shuffler_reports_released_total -
coco_aggregator_reports_total`` (reports released but not applied yet). A histogram of apply
time minus release time is not possible: a batch carries no release time (docs/protocol.md,
section 10.3), and adding one would change the wire format.

:class:`MetricsServer` serves, on one port, ``/ready`` (200 once the checkpoint is
recovered and the batches topic subscribed, else 503; ``coco_aggregator_ready`` alike;
before recovery ``/metrics`` serves that gauge alone and ``/estimates`` answers 503), the
live page at ``/``
(:mod:`aggregator.live_page`), ``/metrics`` (Prometheus text format) and
``/estimates`` (JSON: spec, n, estimates, certified central epsilon for the smallest and the
latest batch, delta, the counters and the retained horizon; rebuilt for every request, so
they never lag ``/metrics``). It is a stdlib ``ThreadingHTTPServer`` in a daemon thread:
the handler asks the event loop for a fresh snapshot (an immutable document the loop
replaces; :mod:`aggregator.service`, *Publishing*) and waits for it, so no lock is needed
and a slow scraper never blocks the event loop.
"""

from __future__ import annotations

import errno
import json
import logging
import sys
import threading
from collections.abc import Callable, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import numpy as np
from prometheus_client import CollectorRegistry, Counter, Gauge, Info
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest

from aggregator.accountant import amplify_spec
from aggregator.estimators import Estimates
from aggregator.live_page import CONTENT_SECURITY_POLICY, PAGE
from edge.errors import CocoError
from edge.spec import MechanismSpec

logger = logging.getLogger(__name__)

REJECT_REASONS = (
    "bad_length",
    "bad_signature",
    "bad_version",
    "bad_kind",
    "bad_count",
    "bad_field",
    "fingerprint_mismatch",
    "empty",
    "below_min_batch",
    "stale_round",
    "future_round",
    "z_out_of_range",
    "seed_out_of_range",
)
"""Every ``reason`` label of ``coco_aggregator_batches_rejected_total`` (pre-created at 0), in
the order the checks run: ``bad_length`` (too short to hold a batch and its signature, or a
length that does not match the count), ``bad_signature`` (not sealed by the trusted shuffler
key), the codec's ``bad_version``, ``bad_kind``, ``bad_count``, ``bad_field``, then
``fingerprint_mismatch`` (another spec), ``empty``, ``below_min_batch``, ``stale_round``
(a round below the retained horizon), ``future_round`` (a round more than the retained
window ahead of the aggregator's clock) and the record checks ``z_out_of_range``,
``seed_out_of_range``. A redelivered or replayed ``batch_id`` is not a rejection but a
duplicate (``coco_aggregator_batches_duplicate_total``)."""
UNACKED_REASONS = ("connection_lost", "unprocessed", "checkpoint_failed", "taken_over")
"""Every ``reason`` label of ``coco_aggregator_batches_unacknowledged_total``: batches whose
PUBACK could not be sent because the connection ended first (``connection_lost``), that were
still queued unread at shutdown (``unprocessed``), whose final checkpoint failed
(``checkpoint_failed``), or that were applied after the last checkpoint of a service whose
session another aggregator took over (``taken_over``: that checkpoint is not written, so
the batches count once, at the new holder). The broker redelivers all of them to the
persistent session."""

CURVE_MAX_N = 10_000_000
"""Largest batch size of the epsilon curve."""
CURVE_DEFAULT_START = 100
"""First point of the curve when the deployment's ``min_batch`` is not known (``--spec``)."""
MAX_CURVE_POINTS = 16
"""Upper bound on the ``n`` label values of ``coco_aggregator_epsilon_central_curve``."""


def epsilon_curve_grid(min_batch: int | None) -> tuple[int, ...]:
    """The batch sizes of the epsilon curve: ``min_batch`` itself (the guarantee every
    released batch has at least), then ``1·10^k`` and ``3·10^k`` above it up to
    :data:`CURVE_MAX_N`. At most 15 points for any ``min_batch >= 1``."""
    start = CURVE_DEFAULT_START if min_batch is None else min_batch
    if start < 1:
        raise ValueError(f"min_batch must be >= 1, got {start}")
    grid = {start}
    for k in range(8):
        for m in (1, 3):
            n = m * 10**k
            if start < n <= CURVE_MAX_N:
                grid.add(n)
    points = tuple(sorted(grid))
    assert len(points) <= MAX_CURVE_POINTS
    return points


def epsilon_curve(spec: MechanismSpec, *, delta: float, grid: Sequence[int]) -> dict[int, float]:
    """Certified central epsilon (:func:`amplify_spec`) at each ``n`` of ``grid``.

    About 0.01-0.2 s per point (the largest ``n`` cost most): call it off the event loop.
    """
    return {n: amplify_spec(spec, n=n, delta=delta).epsilon_central for n in grid}


def _reason_counter(
    registry: CollectorRegistry, name: str, documentation: str, reasons: Sequence[str]
) -> Counter:
    """A counter labelled by ``reason``, every reason of the fixed list shown from 0."""
    counter = Counter(name, documentation, ["reason"], registry=registry)
    for reason in reasons:
        counter.labels(reason=reason)
    return counter


class AggregatorMetrics:
    """The aggregator's metrics, registered in ``registry``."""

    def __init__(
        self,
        registry: CollectorRegistry,
        *,
        spec: MechanismSpec,
        dims: Sequence[int],
        epsilon_target: float | None = None,
    ) -> None:
        self.registry = registry
        self.dims = tuple(dims)
        self._children: list[tuple[Gauge, Gauge, Gauge]] | None = None
        p = "coco_aggregator"
        self.reports = Counter(
            f"{p}_reports", "Reports applied to the estimates.", registry=registry
        )
        self.batches = Counter(f"{p}_batches", "Batches applied.", registry=registry)
        self.rejected = _reason_counter(
            registry, f"{p}_batches_rejected", "Batches rejected, by reason.", REJECT_REASONS
        )
        self.rejected_reports = _reason_counter(
            registry,
            f"{p}_reports_rejected",
            "Reports in rejected batches whose signature verified, by reason.",
            [r for r in REJECT_REASONS if r not in ("bad_length", "bad_signature")],
        )
        self.unacknowledged = _reason_counter(
            registry,
            f"{p}_batches_unacknowledged",
            "Batches left without a PUBACK (redelivered by the broker), by reason.",
            UNACKED_REASONS,
        )
        self.min_batch = Gauge(
            f"{p}_min_batch",
            "Smallest batch applied; smaller ones are rejected (below_min_batch).",
            registry=registry,
        )
        self.retention_rounds = Gauge(
            f"{p}_retention_rounds",
            "Rounds whose applied batch ids are kept to reject replays.",
            registry=registry,
        )
        self.retained_batch_ids = Gauge(
            f"{p}_batch_ids_retained",
            "Applied batch ids in memory and in the checkpoint (those of the retained rounds).",
            registry=registry,
        )
        self.oldest_round = Gauge(
            f"{p}_oldest_retained_round",
            "Oldest round still accepted; older batches are rejected as stale_round "
            "(NaN before the first batch).",
            registry=registry,
        )
        self.oldest_round.set(np.nan)
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
        self.batch_size = Gauge(
            f"{p}_batch_size",
            "Reports in the smallest batch applied and in the latest (the n of epsilon_central).",
            ["batch"],
            registry=registry,
        )
        self.epsilon_central_generic = Gauge(
            f"{p}_epsilon_central_generic",
            "Central epsilon of a shuffled batch by the generic stronger-clone bound (certified, "
            "looser than epsilon_central), for comparison.",
            ["batch"],
            registry=registry,
        )
        self.epsilon_total = Gauge(
            f"{p}_epsilon_total",
            "Composed central epsilon (at delta) of a device present in every batch applied "
            "so far (pessimistic PLD composition of the per-batch certified bounds).",
            registry=registry,
        )
        self.epsilon_curve = Gauge(
            f"{p}_epsilon_central_curve",
            "Certified central epsilon of a batch of n reports under the spec in force "
            "(fixed grid of n).",
            ["n"],
            registry=registry,
        )
        self.epsilon_target: Gauge | None = None
        if epsilon_target is not None:
            self.epsilon_target = Gauge(
                f"{p}_epsilon_target",
                "The operator's target for the central epsilon of the smallest batch.",
                registry=registry,
            )
            self.epsilon_target.set(epsilon_target)
        self.delta = Gauge(f"{p}_delta", "Target delta of the accountant.", registry=registry)
        self.n = Gauge(f"{p}_n", "Reports in the current estimates.", registry=registry)
        self.ready = ready_gauge(registry)
        self.announcements_refused = Counter(
            f"{p}_announcements_refused",
            "Spec announcements refused because they name another batch key than the "
            "pinned one (each new key once; accepted only by `coco aggregator trust`).",
            registry=registry,
        )
        self.checkpoint_generation = Gauge(
            f"{p}_checkpoint_generation",
            "Generation of the newest checkpoint written or recovered (0: none yet).",
            registry=registry,
        )
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
        if self._children is None:  # the labelled series, looked up once
            self._children = [
                (
                    self.mean.labels(dim=str(j)),
                    self.mean_halfwidth.labels(dim=str(j)),
                    self.freq.labels(dim=str(j)),
                )
                for j in self.dims
            ]
        dims = list(self.dims)
        columns = zip(
            estimates.mean[dims].tolist(),
            estimates.mean_halfwidth[dims].tolist(),
            estimates.freq[dims].tolist(),
            strict=True,
        )
        for (mean, halfwidth, freq), (m, h, f) in zip(self._children, columns, strict=True):
            mean.set(m)
            halfwidth.set(h)
            freq.set(f)

    def set_epsilon(self, *, smallest: float | None, latest: float | None) -> None:
        for name, value in (("smallest", smallest), ("latest", latest)):
            self.epsilon_central.labels(batch=name).set(np.nan if value is None else value)

    def set_epsilon_generic(self, *, smallest: float | None, latest: float | None) -> None:
        for name, value in (("smallest", smallest), ("latest", latest)):
            gauge = self.epsilon_central_generic.labels(batch=name)
            gauge.set(np.nan if value is None else value)

    def set_epsilon_total(self, value: float | None) -> None:
        self.epsilon_total.set(np.nan if value is None else value)

    def set_batch_size(self, *, smallest: int | None, latest: int | None) -> None:
        for name, value in (("smallest", smallest), ("latest", latest)):
            self.batch_size.labels(batch=name).set(np.nan if value is None else value)

    def set_retention(self, *, retained_ids: int, oldest_round: int | None) -> None:
        self.retained_batch_ids.set(retained_ids)
        self.oldest_round.set(np.nan if oldest_round is None else oldest_round)

    def set_epsilon_curve(self, curve: dict[int, float]) -> None:
        """Export a curve from :func:`epsilon_curve` (at most :data:`MAX_CURVE_POINTS`)."""
        if len(curve) > MAX_CURVE_POINTS:
            raise ValueError(f"at most {MAX_CURVE_POINTS} curve points, got {len(curve)}")
        for n, epsilon in curve.items():
            self.epsilon_curve.labels(n=str(n)).set(epsilon)


def ready_gauge(registry: CollectorRegistry) -> Gauge:
    """``coco_aggregator_ready``: 1 once the checkpoint is recovered and the batches topic
    subscribed, else 0 (the same as ``/ready``)."""
    return Gauge(
        "coco_aggregator_ready",
        "1 once the checkpoint is recovered and the batches topic subscribed, else 0.",
        registry=registry,
    )


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
        path = self.path.split("?", 1)[0]
        headers: dict[str, str] = {}
        recovered = self.server.recovered()
        try:
            if path == "/ready":
                ready = self.server.ready()
                body = b"ready\n" if ready else b"not ready\n"
                self._send(200 if ready else 503, body, "text/plain; charset=utf-8", {})
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
                body = generate_latest(self.server.registry)
                content_type = CONTENT_TYPE_LATEST
            elif path == "/estimates":
                body = json.dumps(self.server.estimates()).encode()
                content_type = "application/json"
            else:
                self.send_error(404, "try /, /metrics, /estimates or /ready")
                return
        except Exception:  # a failing snapshot must not kill the server thread
            logger.exception("error serving %s", path)
            self.send_error(500)
            return
        self._send(200, body, content_type, headers)

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


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(
        self,
        address: tuple[str, int],
        registry: CollectorRegistry,
        estimates: Callable[[], dict[str, Any]],
        ready: Callable[[], bool],
        recovered: Callable[[], bool],
    ) -> None:
        super().__init__(address, _Handler)
        self.registry = registry
        self.estimates = estimates
        self.ready = ready
        self.recovered = recovered

    def handle_error(self, request: Any, client_address: Any) -> None:
        if isinstance(sys.exc_info()[1], _GONE):
            return  # a client that went away: no traceback
        super().handle_error(request, client_address)


class MetricsServer:
    """``/``, ``/metrics``, ``/estimates`` and ``/ready`` on ``host:port`` (``port=0`` picks
    a free port). A port that cannot be bound is a one-line :class:`CocoError` naming it and
    the option (``--metrics-port``)."""

    def __init__(
        self,
        *,
        host: str,
        port: int,
        registry: CollectorRegistry,
        estimates: Callable[[], dict[str, Any]],
        ready: Callable[[], bool] = lambda: True,
        recovered: Callable[[], bool] = lambda: True,
    ) -> None:
        try:
            self._server = _Server((host, port), registry, estimates, ready, recovered)
        except OSError as exc:
            problem = (
                "is in use"
                if exc.errno == errno.EADDRINUSE
                else f"cannot be bound ({exc.strerror})"
            )
            raise CocoError(
                f"port {port} on {host} {problem}: choose another with --metrics-port "
                "(COCO_METRICS_PORT)"
            ) from None
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
