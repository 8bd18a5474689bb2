"""Prometheus metrics of ``coco fleet``, on an injected ``CollectorRegistry``.

Labels take values only from fixed tuples (:data:`CONNECT_FAILURE_REASONS`,
:data:`PUBLISH_FAILURE_REASONS`, and ``dim`` for at most :data:`MAX_METRICS_DIMS`
dimensions), all pre-created at start-up; no label ever names a device. The
``coco_fleet_ground_truth_*`` gauges are SIMULATION ONLY: exact running means over the
reports the fleet published, and the mean of the last round it finished
(``coco_fleet_ground_truth_round_mean``), for comparison with the aggregator's cumulative
and per-round or windowed estimates.
"""

from __future__ import annotations

import math

from prometheus_client import CollectorRegistry, Counter, Gauge

from sim.fleet.truth import GroundTruth

__all__ = [
    "CONNECT_FAILURE_REASONS",
    "DEFAULT_METRICS_DIMS",
    "MAX_METRICS_DIMS",
    "PUBLISH_FAILURE_REASONS",
    "FleetMetrics",
]

DEFAULT_METRICS_DIMS = 16
MAX_METRICS_DIMS = 1024
"""As the aggregator's ``metrics_dims``: the series count stays bounded whatever ``d``."""

CONNECT_FAILURE_REASONS: tuple[str, ...] = (
    "bad_credentials",  # CONNACK 4 (3.1.1) / 0x86 (5): bad user name or password
    "not_authorized",  # CONNACK 5 / 0x87
    "refused",  # any other refusing CONNACK
    "timeout",  # no CONNACK in time
    "network",  # TCP connection failed or closed
    "tls",  # TLS handshake or certificate failed
)
"""Why a device could not connect (``reason`` of ``coco_fleet_connect_failures_total``)."""

PUBLISH_FAILURE_REASONS: tuple[str, ...] = (
    "not_connected",  # the device (or its shared connection) is not connected
    "not_authorized",  # PUBACK reason 0x87 (MQTT 5: the broker's ACL refused the topic)
    "refused",  # any other PUBACK reason >= 0x80
    "timeout",  # no PUBACK in time
    "connection_lost",  # the connection closed with the report unacknowledged
)
"""Why a report was not published (``reason`` of ``coco_fleet_publish_failures_total``)."""


class FleetMetrics:
    """The fleet's metrics, registered in ``registry`` (never the global one)."""

    def __init__(
        self, registry: CollectorRegistry, *, d: int, dims: int = DEFAULT_METRICS_DIMS
    ) -> None:
        if not 0 <= dims <= MAX_METRICS_DIMS:
            raise ValueError(f"metrics_dims must be in [0, {MAX_METRICS_DIMS}], got {dims}")
        self.registry = registry
        self.dims = tuple(range(min(dims, d)))
        p = "coco_fleet"
        self.connected = Gauge(
            f"{p}_devices_connected",
            "Simulated devices currently connected (own connections), or devices whose shared "
            "connection is up (multiplexed).",
            registry=registry,
        )
        self.published = Counter(
            f"{p}_reports_published",
            "Reports published (PUBACK received at QoS 1, written at QoS 0).",
            registry=registry,
        )
        self.publish_failures = Counter(
            f"{p}_publish_failures",
            "Reports not published, by reason.",
            ["reason"],
            registry=registry,
        )
        self.connect_failures = Counter(
            f"{p}_connect_failures",
            "Failed connection attempts of simulated devices, by reason.",
            ["reason"],
            registry=registry,
        )
        self.connections_lost = Counter(
            f"{p}_connections_lost",
            "Connections that closed while the fleet ran (a broker restart, a network fault); "
            "each is tried again with backoff.",
            registry=registry,
        )
        self.reconnecting = Gauge(
            f"{p}_devices_reconnecting",
            "Simulated devices whose connection is being tried again with backoff.",
            registry=registry,
        )
        self.rounds = Counter(
            f"{p}_rounds_completed", "Rounds every device has finished.", registry=registry
        )
        self.truth_mean = Gauge(
            f"{p}_ground_truth_mean",
            "SIMULATION ONLY: exact mean of x_j over every report published so far (what the "
            "aggregator's estimate_mean estimates); no real deployment has it.",
            ["dim"],
            registry=registry,
        )
        self.truth_freq = Gauge(
            f"{p}_ground_truth_freq",
            "SIMULATION ONLY: exact share of published reports with x_j != 0 (what the "
            "aggregator's estimate_freq estimates); no real deployment has it.",
            ["dim"],
            registry=registry,
        )
        self.truth_round_mean = Gauge(
            f"{p}_ground_truth_round_mean",
            "SIMULATION ONLY: exact mean of x_j over the reports published in the last round "
            "the fleet finished (what the aggregator's estimate of that round estimates); no "
            "real deployment has it.",
            ["dim"],
            registry=registry,
        )
        self.truth_round = Gauge(
            f"{p}_ground_truth_round",
            "SIMULATION ONLY: the wall-clock round of coco_fleet_ground_truth_round_mean "
            "(-1 before the first).",
            registry=registry,
        )
        self.truth_round.set(-1)
        for reason in CONNECT_FAILURE_REASONS:
            self.connect_failures.labels(reason=reason)
        for reason in PUBLISH_FAILURE_REASONS:
            self.publish_failures.labels(reason=reason)
        for j in self.dims:
            self.truth_mean.labels(dim=str(j)).set(math.nan)
            self.truth_freq.labels(dim=str(j)).set(math.nan)
            self.truth_round_mean.labels(dim=str(j)).set(math.nan)

    def connect_failure(self, reason: str) -> None:
        if reason not in CONNECT_FAILURE_REASONS:  # never let a stray string become a series
            raise ValueError(f"unknown connect failure reason {reason!r}")
        self.connect_failures.labels(reason=reason).inc()

    def publish_failure(self, reason: str, count: int = 1) -> None:
        if reason not in PUBLISH_FAILURE_REASONS:
            raise ValueError(f"unknown publish failure reason {reason!r}")
        if count:
            self.publish_failures.labels(reason=reason).inc(count)

    def set_truth(self, truth: GroundTruth) -> None:
        """Export the running ground truth of the bounded set of dimensions."""
        for j in self.dims:
            self.truth_mean.labels(dim=str(j)).set(truth.mean(j))
            self.truth_freq.labels(dim=str(j)).set(truth.freq(j))

    def set_round_truth(self, truth: GroundTruth, round_: int) -> None:
        """Export the ground truth of round ``round_``, the last one the fleet finished."""
        sums = truth.rounds.get(round_)
        self.truth_round.set(round_)
        for j in self.dims:
            value = sums.total[j] / sums.n if sums is not None and sums.n else math.nan
            self.truth_round_mean.labels(dim=str(j)).set(value)
