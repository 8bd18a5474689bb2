"""What one demo run is given (:class:`DemoConfig`) and what it leaves behind
(:class:`DemoRun`), and the few names every part of the demo shares."""

from __future__ import annotations

import math
import secrets
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from prometheus_client import CollectorRegistry

from aggregator.estimation.estimators import AggregateState
from aggregator.service.http import MetricsServer
from aggregator.service.series_view import Reply
from broker.service.shuffler import parse_broker_url
from edge import CocoError, MechanismSpec
from edge.defaults import DEFAULT_METRICS_HOST
from edge.participation import check_participation
from sim.models.day import check_day_seconds

__all__ = [
    "DEFAULT_DEVICES",
    "HTTP_HOST",
    "DemoConfig",
    "DemoError",
    "DemoRun",
    "ReportSink",
    "page_url",
    "progress",
]

DEFAULT_DEVICES = 2000
HTTP_HOST = DEFAULT_METRICS_HOST
"""Where the demo's aggregator serves its page (``http_port``): this machine only, the
services' default (:mod:`edge.defaults`)."""

ReportSink = Callable[[str, int, int, int], None]
"""Called with ``(device_id, round, seed, z)`` for every report before it is published."""


class DemoError(CocoError):
    """The demo cannot run (no broker binary, broker unreachable, services failed)."""


@dataclass(frozen=True, kw_only=True)
class DemoConfig:
    """Parameters of one demo run.

    Rounds are wall-clock rounds of ``round_seconds`` (:mod:`edge.rounds`): the fleet
    publishes round ``k`` of its readings in the ``k``-th round from its start, and the
    shuffler releases each round whole, as one batch, when it closes (the last one at the
    drain). ``release_size`` (unset by default) would cap a pool's size before its round
    ends.
    """

    devices: int = DEFAULT_DEVICES
    rounds: int = 3
    mechanism: Literal["coco", "collision"] = "coco"
    epsilon: float = 1.0
    channels: int = 6
    s: int = 2
    min_batch: int = 500
    delta: float = 1e-6
    seed: int = 1
    day_seconds: int | None = None
    """Compress the sensor model's day into this many wall-clock seconds, each round's
    readings those of its hour (:func:`~sim.models.day.hour_of_day`); ``None``: the
    model's own clock, one hour a round."""
    participation: float = 1.0
    """The announced ``q``: each device reports in a round with probability ``q``
    (:mod:`edge.participation`); 1: every round (nothing drawn)."""
    broker: str | None = None
    embedded_broker: bool = False
    """Use the embedded amqtt broker even when Mosquitto is installed (ignored with ``broker``)."""
    auto_devices: bool = False
    """``devices`` was not chosen by the user: the embedded broker may reduce it."""
    connections: int = 4
    window: int = 500
    round_seconds: int = 2
    flush_interval: float = 0.2
    release_size: int | None = None
    timeout: float = 60.0
    http_port: int | None = None
    """Serve the aggregator's live page, ``/metrics`` and ``/estimates`` on 127.0.0.1 at this
    port during the run (``0``: a free one); ``None``: no HTTP server."""
    truth_file: Path | None = None
    """SIMULATION ONLY: write the per-round ground truth here after every round (the format
    of ``coco fleet --ground-truth``) and serve it at the aggregator's ``/truth``; with
    ``http_port`` and no file, the aggregator serves the run's truth from memory."""
    progress: bool = True
    deployment: str = field(default_factory=lambda: f"demo-{secrets.token_hex(4)}")

    def __post_init__(self) -> None:
        if self.devices < 2 or self.rounds < 1:
            raise ValueError(
                f"need devices >= 2 and rounds >= 1, got {self.devices}, {self.rounds}"
            )
        if not 2 <= self.min_batch <= self.devices:
            raise ValueError(
                f"min_batch must be in [2, devices={self.devices}], got {self.min_batch}"
            )
        check_participation(self.participation)
        if self.min_batch > expected_low(self.devices, self.participation):
            raise ValueError(
                f"with participation {self.participation:g} a round has about "
                f"{self.devices * self.participation:.0f} of {self.devices} devices' reports, "
                f"too few for min_batch {self.min_batch} (at most "
                f"{expected_low(self.devices, self.participation)}: lower --min-batch or raise "
                "--devices or --participation)"
            )
        if self.connections < 1 or self.window < 1:
            raise ValueError("connections and window must be >= 1")
        if not self.timeout > 0:
            raise ValueError(f"timeout must be > 0, got {self.timeout}")
        if self.http_port is not None and not 0 <= self.http_port <= 65535:
            raise ValueError(f"http_port must be in [0, 65535], got {self.http_port}")
        if self.broker is not None:
            parse_broker_url(self.broker)
        if self.day_seconds is not None:
            check_day_seconds(self.day_seconds, self.round_seconds)

    def spec(self) -> MechanismSpec:
        return MechanismSpec(
            mechanism=self.mechanism, d=self.channels, s=self.s, epsilon=self.epsilon
        )


@dataclass
class DemoRun:
    """What a run leaves behind: the result document and the live objects (for tests)."""

    result: dict[str, Any]
    state: AggregateState
    shuffler_registry: CollectorRegistry
    aggregator_registry: CollectorRegistry
    estimates: dict[str, Any] = field(default_factory=dict)
    """The aggregator's final ``/estimates`` document."""
    http_port: int | None = None
    """The port the aggregator served on during the run (``None``: it did not serve)."""
    server: MetricsServer | None = None
    """With ``http_port``: the run's HTTP server, still serving the final state; stop it."""
    truth_file: Path | None = None
    """Where the run wrote its per-round ground truth (``None``: nowhere)."""
    truth: Callable[[str, float], tuple[int, str, bytes]] | None = None
    """The aggregator's ``/truth`` of it (served on after the run)."""
    query: Callable[[str, Mapping[str, Sequence[str]]], Reply] | None = None
    """The aggregator's ``/series`` and ``/estimates?window=`` (served on after the run)."""


SAMPLING_SE = 5
"""Binomial standard errors below its mean that a round's count of reports may fall."""


def expected_low(devices: int, q: float) -> int:
    """The reports a round of ``devices`` devices sampled with probability ``q`` has at least,
    but with a chance below ``3e-7`` (:data:`SAMPLING_SE` binomial standard errors below
    ``q N``): the largest ``min_batch`` the demo accepts, so that no round is held back."""
    return math.floor(devices * q - SAMPLING_SE * math.sqrt(devices * q * (1 - q)))


def page_url(port: int) -> str:
    """The live page of an aggregator serving on :data:`HTTP_HOST` at ``port``."""
    return f"http://{HTTP_HOST}:{port}/"


def progress(enabled: bool, line: str) -> None:
    """A progress line on stderr, where :attr:`DemoConfig.progress` asks for them."""
    if enabled:
        print(line, file=sys.stderr, flush=True)
