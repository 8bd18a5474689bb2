"""The result of a demo run: the document (``coco demo --json``) and the table printed for
people.

``reports_sent = reports_aggregated + reports_rejected + reports_dropped + reports_buffered +
reports_unaccounted``, where the last term (reports lost at the broker or after a timeout) is
0 in a healthy run.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from prometheus_client import CollectorRegistry
from scipy.stats import chi2

from aggregator.service.service import Aggregator
from broker.service.metrics import DROP_REASONS, REJECT_REASONS
from edge import MechanismSpec
from sim.demo.config import DemoConfig, page_url
from sim.demo.publisher import DemoFleet
from sim.demo.tracking import RoundEstimate, format_tracking, tracking

__all__ = [
    "format_table",
    "interval_in_range",
    "metric_value",
    "mse_range",
    "outbox_accounting",
    "result_document",
]

FAULTY_NOTE = (
    "a faulty device has one channel stuck at an end of its range or reading outside it "
    "(clipped by the encoder); their readings count in the truth, as a real fleet's would"
)
"""What the demo's ``faulty_devices`` are (:mod:`sim.models.sensors`)."""
CLIPPED_NOTE = (
    "* interval cut to the channel's physical range: the true mean lies in it (the point "
    "estimate is kept as computed: unbiased, it can fall outside)"
)
OUTSIDE_NOTE = (
    "! interval entirely outside the channel's physical range: it misses the true mean, as "
    "a 95 % interval does once in 20"
)
MARKS = {"inside": " ", "cut": "*", "outside": "!"}


def interval_in_range(
    estimate: float, halfwidth: float, lo: float, hi: float
) -> tuple[float, float, str]:
    """The interval ``estimate +- halfwidth`` intersected with the channel's physical range
    ``[lo, hi]`` (every reading is clipped to it before encoding, so the true mean lies in
    it): ``(low, high, where)``, ``where`` being ``"inside"`` (unchanged), ``"cut"`` or
    ``"outside"``: the interval misses the range altogether, so it misses the true mean (as
    a 95 % interval may, once in 20); it is then returned unchanged."""
    low, high = estimate - halfwidth, estimate + halfwidth
    if high < lo or low > hi:
        return low, high, "outside"
    if lo <= low and high <= hi:
        return low, high, "inside"
    return max(low, lo), min(high, hi), "cut"


def mse_range(d: int, probability: float = 0.95) -> tuple[float, float]:
    """The central ``probability`` range of one run's MSE over its closed form: the sum of
    ``d`` squared, roughly independent normal errors of equal variance is a chi-square with
    ``d`` degrees of freedom times that variance, so the ratio is ``chi2(d) / d``."""
    tail = (1.0 - probability) / 2.0
    return float(chi2.ppf(tail, d)) / d, float(chi2.ppf(1.0 - tail, d)) / d


def metric_value(registry: CollectorRegistry, name: str, **labels: str) -> float:
    """The value of a sample in ``registry`` (0 where it has none yet)."""
    sample = registry.get_sample_value(name, labels)
    return 0.0 if sample is None else sample


def outbox_accounting(outbox: int, applied_unacked: int, counted: int) -> tuple[int, int]:
    """Where the reports of the shuffler's outbox at the end go, each once: ``(dropped
    unpublished at shutdown, still buffered)``. A batch the aggregator applied before the
    broker's PUBACK reached the stopping shuffler is still in its outbox (``applied_unacked``
    reports: the aggregator's ``n`` minus the shuffler's acknowledged): it counts as
    aggregated only. The rest was never applied: a shuffler without a state directory that
    stopped counted its whole outbox as dropped (``counted``), so those are dropped, and
    what it did not count (it has not stopped) is buffered."""
    never_applied = max(0, outbox - max(0, applied_unacked))
    dropped = min(counted, never_applied)
    return dropped, never_applied - dropped


def result_document(
    *,
    config: DemoConfig,
    spec: MechanismSpec,
    fleet: DemoFleet,
    aggregator: Aggregator,
    registry: CollectorRegistry,
    broker_kind: str,
    url: str,
    publish_seconds: float,
    http_port: int | None,
) -> dict[str, Any]:
    """The run's result: what was sent and what became of it (every report accounted for),
    the estimates beside the simulation-only ground truth, and the privacy level."""
    rejected = {
        r: int(metric_value(registry, "coco_shuffler_reports_rejected_total", reason=r))
        for r in REJECT_REASONS
    }
    dropped = {
        r: int(metric_value(registry, "coco_shuffler_dropped_total", reason=r))
        for r in DROP_REASONS
    }
    state = aggregator.state
    n = state.n
    acknowledged = int(metric_value(registry, "coco_shuffler_reports_released_total"))
    outbox = int(metric_value(registry, "coco_shuffler_outbox_reports"))
    dropped["unpublished_at_shutdown"], in_outbox = outbox_accounting(
        outbox, n - acknowledged, dropped["unpublished_at_shutdown"]
    )
    buffered = int(metric_value(registry, "coco_shuffler_buffer_reports")) + in_outbox
    agg_rejected_batches = sum(aggregator.counters.rejected.values())
    accounted = n + sum(rejected.values()) + sum(dropped.values()) + buffered
    est = state.estimate()
    encoder = fleet.sensors.encoder(config.s)
    sent = fleet.sent
    xbar = fleet.total / max(sent, 1)
    mse = float(np.sum((est.mean - xbar) ** 2)) if n else math.nan
    mse_theory = spec.moments.mean_mse(spec.d, spec.s) / n if n else math.nan
    value, se = encoder.decode_mean(est.mean, est.mean_se, n=n)
    truth = fleet.truth_sum / max(sent, 1)
    sampled = config.participation < 1
    fleet_mean = fleet.fleet_sum / max(fleet.fleet_count, 1)
    smallest = aggregator.smallest_batch
    tracked = per_round_tracking(aggregator, fleet, spec)
    privacy = aggregator.ledger.compute(aggregator.ledger.snapshot())  # the one accountant call
    channels = []
    for j, ch in enumerate(fleet.sensors.channel_specs):
        interval: dict[str, Any] = {}
        if n:
            low, high, where = interval_in_range(float(value[j]), float(1.96 * se[j]), ch.lo, ch.hi)
            interval = {"ci95_lo": low, "ci95_hi": high, "ci95_range": where}
        channels.append(
            {
                "name": ch.name,
                "unit": ch.unit,
                "lo": ch.lo,
                "hi": ch.hi,
                "estimate": None if not n else float(value[j]),
                "ci95_halfwidth": None if not n else float(1.96 * se[j]),
                **interval,
                "ground_truth": float(truth[j]),
                **({"ground_truth_fleet": float(fleet_mean[j])} if sampled else {}),
            }
        )
    low, high = mse_range(spec.d)
    return {
        "broker": f"{broker_kind} at {url}",
        "deployment": config.deployment,
        "mechanism": spec.mechanism,
        "d": spec.d,
        "s": spec.s,
        "t": spec.t,
        "devices": config.devices,
        "rounds": config.rounds,
        "faulty_devices": fleet.sensors.faulty_devices,
        "faulty_devices_note": FAULTY_NOTE,
        "min_batch": config.min_batch,
        "reports_sent": sent,
        "reports_aggregated": n,
        "reports_rejected": sum(rejected.values()),
        "reports_rejected_by_reason": {k: v for k, v in rejected.items() if v},
        "reports_dropped": sum(dropped.values()),
        "reports_dropped_by_reason": {k: v for k, v in dropped.items() if v},
        "reports_buffered": buffered,
        "reports_unaccounted": sent - accounted,
        "batches": aggregator.counters.batches,
        "batches_rejected": agg_rejected_batches,
        "batch_size_smallest": smallest,
        "n": n,
        "epsilon_local": spec.epsilon,
        "epsilon_local_effective": spec.epsilon_effective,
        "epsilon_central": privacy.epsilon_central["smallest"],
        "epsilon_central_generic": privacy.epsilon_central_generic["smallest"],
        "epsilon_central_certified": True,
        "epsilon_total": privacy.epsilon_total,
        "epsilon_total_batches": privacy.batches,
        "delta": config.delta,
        "mse_mean": mse,
        "mse_mean_theory": mse_theory,
        "mse_mean_ratio": mse / mse_theory if n else math.nan,
        "mse_mean_ratio_range95": [low, high],
        "mse_mean_note": (
            "sum over channels of squared errors of the ternary-vector means (estimate vs the "
            "realised mean of the encoded vectors sent); theory = closed form / n, the "
            "expected value; one run's ratio falls in mse_mean_ratio_range95 (chi-square with "
            "d degrees of freedom over d) in 95 % of runs"
        ),
        "channels_note": (
            "ci95_lo, ci95_hi: the interval within the channel's range [lo, hi]; ci95_range: "
            "inside (unchanged), cut ("
            + CLIPPED_NOTE[2:]
            + ") or outside ("
            + OUTSIDE_NOTE[2:]
            + ")"
        ),
        "channels": channels,
        "ground_truth_note": (
            "simulation only: the exact mean of the readings the devices that reported sent "
            "(with participation q < 1, ground_truth_fleet is every device's, reporting or not)"
            if sampled
            else "simulation only: the exact fleet mean of the readings"
        ),
        **({"participation": config.participation} if sampled else {}),
        "tracking": tracked,
        "throughput_reports_per_s": sent / publish_seconds if publish_seconds > 0 else None,
        **({} if http_port is None else {"url": page_url(http_port)}),
    }


def per_round_tracking(
    aggregator: Aggregator, fleet: DemoFleet, spec: MechanismSpec
) -> dict[str, Any]:
    """How well the aggregator's per-round estimates (its series) tracked the truth of the
    vectors sent in each round (:func:`sim.demo.tracking.tracking`)."""
    series = getattr(aggregator.core, "series", None)
    rows = [] if series is None else series.rows()
    estimates = []
    for row in rows:
        if row.rounds != 1:  # a coarse row (rolled up past retention): not one round
            continue
        est = row.state.estimate()
        estimates.append(RoundEstimate(row.round, row.state.n, est.mean, est.mean_lo, est.mean_hi))
    truth = {
        r: np.asarray(sums.total, dtype=np.float64) / sums.n
        for r, sums in fleet.truth.rounds.items()
        if sums.n
    }
    return tracking(estimates, truth, spec)


def format_table(result: dict[str, Any]) -> str:
    """The result as a table for people."""
    lines = [
        f"broker: {result['broker']}",
        *([f"note: {result['note']}"] if result.get("note") else []),
        f"{result['mechanism']} d={result['d']} s={result['s']} t={result['t']}: "
        f"{result['devices']} devices x {result['rounds']} rounds "
        f"({result['faulty_devices']} of them faulty: see below)",
        "",
        f"{'channel':<12} {'unit':<6} {'estimate':>12} {'95% interval':>25} "
        f"{'truth (sim)':>12} {'error':>10}",
    ]
    marks: set[str] = set()
    for ch in result["channels"]:
        est, truth = ch["estimate"], ch["ground_truth"]
        if est is None:
            lines.append(f"{ch['name']:<12} {ch['unit']:<6} {'n/a':>12}")
            continue
        mark = MARKS[ch["ci95_range"]]
        marks.add(mark)
        interval = f"[{ch['ci95_lo']:.4g}, {ch['ci95_hi']:.4g}]{mark}"
        lines.append(
            f"{ch['name']:<12} {ch['unit']:<6} {est:>12.4g} {interval:>25} {truth:>12.4g} "
            f"{est - truth:>10.3g}"
        )
    eps_c, eps_t = result["epsilon_central"], result["epsilon_total"]
    lines += [
        *([CLIPPED_NOTE] if "*" in marks else []),
        *([OUTSIDE_NOTE] if "!" in marks else []),
        f"faulty devices: {result['faulty_devices']}; {FAULTY_NOTE}",
        "",
        *(
            [
                f"participation {result['participation']:g}: truth (sim) is over the devices "
                "that reported"
            ]
            if "participation" in result
            else []
        ),
        f"reports: sent {result['reports_sent']}, aggregated {result['reports_aggregated']}, "
        f"rejected {result['reports_rejected']}, dropped {result['reports_dropped']}"
        f"{' ' + str(result['reports_dropped_by_reason']) if result['reports_dropped'] else ''}, "
        f"buffered {result['reports_buffered']}, "
        f"unaccounted {result['reports_unaccounted']}",
        f"batches: {result['batches']} (smallest {result['batch_size_smallest']}, "
        f"min_batch {result['min_batch']})",
        mse_line(result),
        *format_tracking(result.get("tracking") or {}),
        f"epsilon_local {result['epsilon_local']:g}  epsilon_central (certified, smallest "
        f"batch) {'n/a' if eps_c is None else f'{eps_c:.4g}'}  delta {result['delta']:g}",
        f"epsilon_total (a device in all {result['epsilon_total_batches']} rounds) "
        f"{'n/a' if eps_t is None else f'{eps_t:.4g}'}",
        f"throughput: {result['throughput_reports_per_s'] or 0:.0f} reports/s published",
        *([f"live page: {result['url']}"] if result.get("url") else []),
    ]
    return "\n".join(lines)


def mse_line(result: dict[str, Any]) -> str:
    """The MSE beside its closed form, their ratio and whether the ratio is where 95 % of
    runs put it."""
    mse, theory = result["mse_mean"], result["mse_mean_theory"]
    head = f"MSE of the ternary means (sum over channels): {mse:.4g}, closed form {theory:.4g}"
    if not (math.isfinite(mse) and math.isfinite(theory) and theory > 0):
        return head
    ratio = mse / theory
    low, high = result["mse_mean_ratio_range95"]
    verdict = "as expected" if low <= ratio <= high else "outside that range: look closer"
    return (
        f"{head}: ratio {ratio:.2f} (one run's ratio falls in [{low:.2f}, {high:.2f}] "
        f"95 % of the time for d={result['d']}: {verdict})"
    )
