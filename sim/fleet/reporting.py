"""What a fleet run tells about itself: its counters (:class:`FleetStats`), the one line per
round that says what was not sent and why (:func:`round_problems`), and the ``--json``
summary (:func:`summary_document`). Pure arithmetic on counts, no I/O, and never a device
id: the line and the summary hold counts only (:mod:`sim.fleet.run` logs and prints them).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from sim.fleet.config import FleetConfig


@dataclass
class FleetStats:
    """The run's counters that are not failures (those are by reason, in :class:`Tally`)."""

    started: float = field(default_factory=time.monotonic)
    connect_seconds: float = 0.0
    connected_first: int = 0
    connections_first: int = 0
    publish_seconds: float = 0.0
    peak_connected: int = 0
    rounds_completed: int = 0
    rounds_skipped: int = 0
    rounds_late: int = 0
    interrupted: bool = False
    connected_at_end: int = 0


@dataclass(frozen=True)
class Tally:
    """The failure counts and published reports at one moment (a round's line compares two)."""

    publish: dict[str, int]
    connect: dict[str, int]
    lost: int
    published: int


def _reasons(counts: dict[str, int]) -> str:
    return ", ".join(f"{k} {v}" for k, v in counts.items() if v) or "none"


def round_problems(
    round_: int,
    before: Tally,
    now: Tally,
    *,
    connected: int,
    devices: int,
    reconnecting: int,
) -> str | None:
    """The round's line: reports not sent by reason, connections lost and refused, who is
    connected (``None``: nothing went wrong since ``before``, so no line)."""
    failed = {k: v - before.publish.get(k, 0) for k, v in now.publish.items()}
    refused = {k: v - before.connect.get(k, 0) for k, v in now.connect.items()}
    lost = now.lost - before.lost
    if not (any(failed.values()) or any(refused.values()) or lost):
        return None
    not_sent = sum(failed.values())
    attempted = not_sent + now.published - before.published
    return (
        f"round {round_}: {not_sent} of {attempted} reports not sent ({_reasons(failed)}); "
        f"{lost} connections lost, {sum(refused.values())} connection attempts failed "
        f"({_reasons(refused)}); {connected} of {devices} devices connected, "
        f"{reconnecting} reconnecting"
    )


def summary_document(
    cfg: FleetConfig,
    stats: FleetStats,
    tally: Tally,
    *,
    rounds_used: list[int],
    peak_connected: int,
    sat_out: int,
    version: str,
    fingerprint: str,
) -> dict[str, Any]:
    """The run's counts and rates (the ``--json`` document of ``coco fleet``)."""
    return {
        "devices": cfg.devices,
        "mode": cfg.mode,
        "connections": cfg.connection_count,
        "connected": peak_connected,
        "connected_at_start": stats.connected_first,
        "connected_at_end": stats.connected_at_end,
        "connections_lost": tally.lost,
        "rounds": cfg.rounds,
        "rounds_completed": stats.rounds_completed,
        "round_seconds": cfg.round_seconds,
        "first_round": rounds_used[0] if rounds_used else None,
        "last_round": rounds_used[-1] if rounds_used else None,
        "rounds_skipped": stats.rounds_skipped,
        "rounds_late": stats.rounds_late,
        "reports_published": tally.published,
        "reports_not_sent": sum(tally.publish.values()),
        "participation": cfg.participation,
        "reports_sat_out": sat_out,
        "publish_failures": dict(tally.publish),
        "connect_failures": dict(tally.connect),
        "connect_rate_per_s": (  # connections (not devices) per second
            stats.connections_first / stats.connect_seconds if stats.connect_seconds > 0 else None
        ),
        "publish_rate_per_s": (
            tally.published / stats.publish_seconds if stats.publish_seconds > 0 else None
        ),
        "duration_seconds": time.monotonic() - stats.started,
        "seed": cfg.seed,
        "model": cfg.model,
        "qos": cfg.qos,
        "mqtt_version": version,
        "deployment": cfg.deployment,
        "spec_fingerprint": fingerprint,
        "interrupted": stats.interrupted,
    }
