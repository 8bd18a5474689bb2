"""Prometheus metrics of the aggregator and the HTTP endpoint that serves them.

Every metric lives in an injected :class:`~prometheus_client.CollectorRegistry` (never the
global one). The ``dim`` label exists only for the bounded set of exported dimensions
(:attr:`AggregatorConfig.metrics_dims <aggregator.service.config.AggregatorConfig.metrics_dims>`),
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

The HTTP endpoint that serves them is :class:`aggregator.service.http.MetricsServer`.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import numpy as np
from prometheus_client import CollectorRegistry, Counter, Gauge, Info

from aggregator.estimation.estimators import Estimates
from aggregator.service.core.machine import AggregatorCore
from aggregator.service.metric_labels import (
    BAD_REQUEST_ENDPOINTS,
    MANIFEST_REJECT_REASONS,
    RECONCILED,
    REJECT_REASONS,
    UNACKED_REASONS,
)
from edge.spec import MechanismSpec

logger = logging.getLogger(__name__)

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


def _reason_counter(
    registry: CollectorRegistry, name: str, documentation: str, reasons: Sequence[str]
) -> Counter:
    """A counter labelled by ``reason``, every reason of the fixed list shown from 0."""
    counter = Counter(name, documentation, ["reason"], registry=registry)
    for reason in reasons:
        counter.labels(reason=reason)
    return counter


def _shard_metrics(
    registry: CollectorRegistry, p: str
) -> tuple[Counter, Counter, Gauge, Gauge, Gauge]:
    """The per-shard metrics (label ``shard``: the announced labels, a bounded set)."""
    batches = Counter(
        f"{p}_shard_batches", "Batches applied, by shard.", ["shard"], registry=registry
    )
    reports = Counter(
        f"{p}_shard_reports", "Reports applied, by shard.", ["shard"], registry=registry
    )
    batch_size = Gauge(
        f"{p}_shard_batch_size",
        "Reports in the smallest and in the latest batch applied, by shard (the smallest "
        "over all shards is the guarantee every report has).",
        ["shard", "batch"],
        registry=registry,
    )
    silent_rounds = Gauge(
        f"{p}_shard_silent_rounds",
        "Rounds in which other shards of the layout in force released while this one "
        "released nothing (since its last release or this run's start), by shard of "
        "that layout.",
        ["shard"],
        registry=registry,
    )
    silent = Gauge(
        f"{p}_shard_silent",
        "1 while a shard of the layout in force has been silent for "
        "--silent-shard-rounds rounds in which others released, else 0.",
        ["shard"],
        registry=registry,
    )
    return batches, reports, batch_size, silent_rounds, silent


class AggregatorMetrics:
    """The aggregator's metrics, registered in ``registry``."""

    def __init__(
        self,
        registry: CollectorRegistry,
        *,
        spec: MechanismSpec,
        dims: Sequence[int],
        epsilon_target: float | None = None,
        windows: Sequence[str] = (),
        periods: Sequence[str] = (),
    ) -> None:
        self.registry = registry
        self.dims = tuple(dims)
        self.windows, self.periods = tuple(windows), tuple(periods)
        self._children: list[tuple[Gauge, Gauge, Gauge]] | None = None
        p = "coco_aggregator"
        self.reports = Counter(
            f"{p}_reports", "Reports applied to the estimates.", registry=registry
        )
        self.batches = Counter(f"{p}_batches", "Batches applied.", registry=registry)
        self.batches_other_length = Counter(
            f"{p}_batches_other_length",
            "Batches applied whose round length (wire version 2) is not the one this "
            "aggregator runs with: the rounds before a change of round_seconds; still growing "
            "long after one, a shuffler on the old length, or this aggregator not restarted.",
            registry=registry,
        )
        self.rejected = _reason_counter(
            registry, f"{p}_batches_rejected", "Batches rejected, by reason.", REJECT_REASONS
        )
        self.rejected_reports = _reason_counter(
            registry,
            f"{p}_reports_rejected",
            "Reports in rejected batches whose signature verified, by reason.",
            [
                r
                for r in REJECT_REASONS
                if r not in ("unknown_shard", "bad_length", "bad_signature")
            ],
        )
        self.manifests_rejected = _reason_counter(
            registry,
            f"{p}_manifests_rejected",
            "Release manifests rejected, by reason.",
            MANIFEST_REJECT_REASONS,
        )
        self.manifests_duplicate = Counter(
            f"{p}_manifests_duplicate",
            "Release manifests ignored because their release was already accepted.",
            registry=registry,
        )
        self.reconciled = {
            field: Counter(f"{p}_{name}", help_text, registry=registry)
            for field, name, help_text in RECONCILED
        }
        (
            self.shard_batches,
            self.shard_reports,
            self.shard_batch_size,
            self.shard_silent_rounds,
            self.shard_silent,
        ) = _shard_metrics(registry, p)
        self._silence_labels: set[str] = set()
        self._synced: dict[tuple[str, str], float] = {}
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
            "Reports in the smallest release ever accounted and in the newest round's smallest "
            "(the n of epsilon_central).",
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
            "Composed central epsilon (at delta) of a device present in every round released "
            "so far, one participation per round a device reported in, at the smallest "
            "release holding that round's reports (pessimistic PLD composition of the "
            "certified bounds).",
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
        self.checkpoint_failing = Gauge(
            f"{p}_checkpoint_failing",
            "1 while the last write of the checkpoint or the privacy ledger failed (a full "
            "disk): batches stay unacknowledged, the write is retried, /ready answers 503; "
            "0 once a write succeeds.",
            registry=registry,
        )
        self.checkpoint_generation = Gauge(
            f"{p}_checkpoint_generation",
            "Generation of the newest checkpoint written or recovered (0: none yet).",
            registry=registry,
        )
        self._window_gauges(registry)
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

    def _window_gauges(self, registry: CollectorRegistry) -> None:
        p = "coco_aggregator"
        self.window_mean = Gauge(
            f"{p}_window_estimate_mean",
            "Estimated mean of x_j over the rounds of a configured window (--window): the "
            "rounds whose end lies within the window, or the r newest.",
            ["window", "dim"],
            registry=registry,
        )
        self.window_mean_halfwidth = Gauge(
            f"{p}_window_estimate_mean_halfwidth",
            "Half-width of the confidence interval of a window's mean.",
            ["window", "dim"],
            registry=registry,
        )
        self.window_n = Gauge(
            f"{p}_window_n",
            "Reports in the rounds of a configured window.",
            ["window"],
            registry=registry,
        )
        self.window_epsilon_total = Gauge(
            f"{p}_window_epsilon_total",
            "Composed central epsilon (at delta) of a device present in every round of a "
            "configured window, each round at its smallest release (NaN until computed, "
            "and for an empty window).",
            ["window"],
            registry=registry,
        )
        self.epsilon_total_period = Gauge(
            f"{p}_epsilon_total_period",
            "Composed central epsilon (at delta) of a device present in every round that "
            "ended in the last `period` (--privacy-period), from the privacy ledger: every "
            "release of those rounds, applied here or not, and every participation of unknown "
            "time (NaN until computed).",
            ["period"],
            registry=registry,
        )
        for period in self.periods:
            self.epsilon_total_period.labels(period=period).set(np.nan)
        self.bad_requests = Counter(
            f"{p}_http_bad_requests",
            "HTTP queries refused as malformed (400: a bad window, from/to, step, dims or "
            "format), by endpoint.",
            ["endpoint"],
            registry=registry,
        )
        for endpoint in BAD_REQUEST_ENDPOINTS:
            self.bad_requests.labels(endpoint=endpoint)
        for window in self.windows:
            self.set_window(window, None, epsilon_total=None)
        self.change_statistic = Gauge(
            f"{p}_change_statistic",
            "The change detector's CUSUM statistic (max of its two sides, in standard "
            "deviations of a round's residual against the same round of earlier cycles).",
            ["dim"],
            registry=registry,
        )
        self.change_alarm = Gauge(
            f"{p}_change_alarm",
            "1 while the change detector's alarm on a dimension holds (its CUSUM crossed the "
            "threshold within the last 10 charted rounds), else 0.",
            ["dim"],
            registry=registry,
        )

    def set_change(self, statistic: Sequence[float], alarm: Sequence[bool]) -> None:
        """The change detector's state per exported dimension (in ``dims`` order)."""
        for j, value, flag in zip(self.dims, statistic, alarm, strict=True):
            self.change_statistic.labels(dim=str(j)).set(value)
            self.change_alarm.labels(dim=str(j)).set(int(flag))

    def set_epsilon_periods(self, epsilons: dict[str, float | None]) -> None:
        """Each configured period's ``epsilon_total`` (NaN while unknown)."""
        for period in self.periods:
            value = epsilons.get(period)
            self.epsilon_total_period.labels(period=period).set(np.nan if value is None else value)

    def set_window(
        self, window: str, estimates: Estimates | None, *, epsilon_total: float | None
    ) -> None:
        """Export a configured window's estimates of the bounded set of dimensions (NaN for
        an empty window, ``None``) and its epsilon_total (NaN while unknown)."""
        self.window_n.labels(window=window).set(0 if estimates is None else estimates.n)
        self.window_epsilon_total.labels(window=window).set(
            np.nan if epsilon_total is None else epsilon_total
        )
        dims = list(self.dims)
        if estimates is None:
            means = halfwidths = [np.nan] * len(dims)
        else:
            means = estimates.mean[dims].tolist()
            halfwidths = estimates.mean_halfwidth[dims].tolist()
        for j, mean, half in zip(dims, means, halfwidths, strict=True):
            self.window_mean.labels(window=window, dim=str(j)).set(mean)
            self.window_mean_halfwidth.labels(window=window, dim=str(j)).set(half)

    def sync(self, core: AggregatorCore) -> None:
        """Bring every counter up to the core's counts (which continue across restarts
        in the checkpoint) and the per-shard gauges to its shard stats. ``O(reasons +
        shards)``: after each batch or manifest, and on restore."""
        counters = core.counters
        self._bump(self.reports, ("reports", ""), counters.reports)
        self._bump(self.batches, ("batches", ""), counters.batches)
        self._bump(self.duplicates, ("duplicates", ""), counters.duplicates)
        for name, metric, counts in (
            ("rejected", self.rejected, counters.rejected),
            ("rejected_reports", self.rejected_reports, counters.rejected_reports),
            ("unacknowledged", self.unacknowledged, counters.unacknowledged),
            ("manifests_rejected", self.manifests_rejected, counters.manifests_rejected),
        ):
            for reason, value in counts.items():
                self._bump(metric.labels(reason=reason), (name, reason), value)
        self._bump(
            self.manifests_duplicate, ("manifests_duplicate", ""), counters.manifests_duplicate
        )
        for field, metric in self.reconciled.items():
            self._bump(metric, ("reconciled", field), getattr(core.reconciler.counts, field))
        for label, stats in core.shards.items():
            self._bump(
                self.shard_batches.labels(shard=label), ("shard_batches", label), stats.batches
            )
            self._bump(
                self.shard_reports.labels(shard=label), ("shard_reports", label), stats.reports
            )
            for which, size in (("smallest", stats.smallest), ("latest", stats.latest)):
                self.shard_batch_size.labels(shard=label, batch=which).set(
                    np.nan if size is None else size
                )
        if core.last_batch_timestamp is not None:
            self.last_batch.set(core.last_batch_timestamp)
        self._sync_silence(core)

    def _sync_silence(self, core: AggregatorCore) -> None:
        """The silence gauges of the layout in force's shards only: the labels of a layout
        that gave way are removed (a bounded set, the announced labels)."""
        counts = core.silence.silent_rounds(core.keys.plan)
        for label in self._silence_labels - set(counts):
            self.shard_silent_rounds.remove(label)
            self.shard_silent.remove(label)
        for label, rounds in counts.items():
            self.shard_silent_rounds.labels(shard=label).set(rounds)
            self.shard_silent.labels(shard=label).set(int(rounds >= core.silence.threshold))
        self._silence_labels = set(counts)

    def _bump(self, metric: Any, key: tuple[str, str], value: float) -> None:
        last = self._synced.get(key, 0.0)
        if value > last:
            metric.inc(value - last)
            self._synced[key] = value

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
        """Export a curve from :func:`~aggregator.ledger.levels.epsilon_curve` (at most
        :data:`MAX_CURVE_POINTS`)."""
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
