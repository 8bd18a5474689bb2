"""``coco fleet``'s configuration (:class:`FleetConfig`, checked when built), the choice of
the next wall-clock round (:func:`next_round`) and the file-descriptor limit
(:func:`ensure_fd_limit`); :mod:`sim.fleet.run` runs the fleet."""

from __future__ import annotations

import logging
import math
import resource
from dataclasses import dataclass
from typing import Literal

from edge import CocoError
from edge.mqtt_url import parse_broker_urls
from edge.mqtt_version import MQTT_VERSIONS, MqttVersion
from edge.rounds import check_round_seconds, current_round, round_start
from edge.shards import ShardPlan
from edge.spec import MechanismSpec
from edge.topics import check_name
from sim.credentials.accounts import DEFAULT_PREFIX, device_id
from sim.fleet.metrics import DEFAULT_METRICS_DIMS
from sim.fleet.models import ModelName
from sim.models.day import DAY_SECONDS, check_day_seconds

__all__ = [
    "FDS_RESERVED",
    "FleetConfig",
    "FleetError",
    "Mode",
    "ensure_fd_limit",
    "next_round",
]

logger = logging.getLogger(__name__)

Mode = Literal["connections", "multiplexed"]

FDS_RESERVED = 64
"""File descriptors beyond one per connection: the event loop, the metrics server, logs."""


class FleetError(CocoError):
    """The fleet cannot run (file-descriptor limit, bad configuration)."""


def next_round(
    now: float,
    round_seconds: int,
    offset: float,
    after: int | None = None,
    *,
    join_current: bool = True,
) -> int:
    """The wall-clock round a fleet ready at Unix time ``now`` publishes in next.

    After ``after`` (the round it last published in, if any): the round in progress if the
    fleet is ready no later than ``max(offset, L / 2)`` seconds after it started, otherwise
    the next one. Without ``join_current`` the first round (``after`` None) is always the
    next one: a run started right after another one never reuses the round that one ended
    in (its reports would all be duplicates). Raises :class:`~edge.rounds.ClockError` for a
    clock that is not set.
    """
    round_ = current_round(round_seconds, now)
    if after is None and not join_current:
        return round_ + 1
    if after is not None and round_ <= after:
        return after + 1
    late = now - round_start(round_, round_seconds) > max(offset, round_seconds / 2)
    return round_ + 1 if late else round_


@dataclass(frozen=True, kw_only=True)
class FleetConfig:
    """Everything one fleet run needs (the CLI builds it from its options)."""

    broker: str
    deployment: str
    spec: MechanismSpec
    devices: int
    round_seconds: int
    """Length of a round (the deployment's announced ``round_seconds``)."""
    rounds: int = 1
    """Consecutive wall-clock rounds to publish in; 0 runs until :meth:`Fleet.stop`."""
    round_offset: float = 0.0
    """Seconds after a round starts before the fleet publishes in it."""
    join_current_round: bool = False
    """Publish the first round in the round in progress (when early enough in it) instead of
    waiting for the next: faster to start, but a run right after another one would repeat
    that run's last round, whose reports the shuffler rejects as duplicates."""
    round_spread: float = 0.0
    """Seconds over which a round's reports are spread (0 = as fast as possible);
    ``round_offset + round_spread`` must be below ``round_seconds``."""
    ramp_up: float = 0.0
    """New connections per second; 0 = as fast as possible."""
    qos: Literal[0, 1] = 1
    mode: Mode = "connections"
    connections: int = 4
    """Shared connections in ``multiplexed`` mode (ignored otherwise)."""
    model: ModelName = "sensors"
    day_seconds: int = DAY_SECONDS
    """Length of the sensor model's day in seconds (a real day by default; smaller
    compresses the daily cycle so that it shows in minutes: ``--day-seconds``)."""
    seed: int = 0
    prefix: str = DEFAULT_PREFIX
    username: str | None = None
    password: str | None = None
    credentials_secret: bytes | None = None
    """Per-device credentials: user name = device id, password from this secret."""
    ca_file: str | None = None
    window: int = 1000
    connect_timeout: float = 30.0
    publish_timeout: float = 30.0
    drain_timeout: float = 5.0
    """After :meth:`Fleet.stop`, how long to wait for outstanding PUBACKs."""
    reconnect_min_delay: float = 1.0
    reconnect_max_delay: float = 30.0
    """A lost or failed connection is tried again after ``min * 2^k`` seconds (k = 0, 1,
    ...), at most ``max``, each with jitter (docs/protocol.md, section 12)."""
    metrics_dims: int = DEFAULT_METRICS_DIMS
    mqtt_version: MqttVersion = "auto"
    shards: ShardPlan | None = None
    """The announced shard layouts (``None``: an unsharded deployment)."""

    def __post_init__(self) -> None:
        parse_broker_urls(self.broker)
        if self.mqtt_version not in MQTT_VERSIONS:
            raise ValueError(f"mqtt_version must be one of {MQTT_VERSIONS}")
        check_name("deployment", self.deployment)
        check_name("device", device_id(0, self.prefix))
        if isinstance(self.devices, bool) or self.devices < 1:
            raise ValueError(f"devices must be >= 1, got {self.devices}")
        if self.rounds < 0:
            raise ValueError(f"rounds must be >= 0 (0 = until interrupted), got {self.rounds}")
        check_round_seconds(self.round_seconds)
        check_day_seconds(self.day_seconds, self.round_seconds)
        for name in ("round_offset", "round_spread", "ramp_up"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value >= 0):
                raise ValueError(f"{name} must be >= 0, got {value}")
        for name in ("connect_timeout", "publish_timeout", "drain_timeout", "reconnect_min_delay"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value > 0):
                raise ValueError(f"{name} must be > 0, got {value}")
        if not (
            math.isfinite(self.reconnect_max_delay)
            and self.reconnect_max_delay >= self.reconnect_min_delay
        ):
            raise ValueError(
                f"reconnect_max_delay must be >= reconnect_min_delay "
                f"({self.reconnect_min_delay}), got {self.reconnect_max_delay}"
            )
        if self.qos not in (0, 1):
            raise ValueError(f"qos must be 0 or 1, got {self.qos}")
        if self.mode not in ("connections", "multiplexed"):
            raise ValueError(f"mode must be connections or multiplexed, got {self.mode!r}")
        if self.connections < 1 or self.window < 1:
            raise ValueError("connections and window must be >= 1")
        if not self.round_offset + self.round_spread < self.round_seconds:
            raise ValueError(
                f"round_offset + round_spread must be < round_seconds ({self.round_seconds}), "
                f"got {self.round_offset} + {self.round_spread}"
            )
        self._check_credentials()

    def _check_credentials(self) -> None:
        if self.credentials_secret is not None:
            if not self.credentials_secret:
                raise ValueError("the credentials secret is empty")
            if self.username is not None:
                raise ValueError("give either a shared username or a credentials secret")
            if self.mode == "multiplexed":
                raise ValueError(
                    "per-device credentials need --mode connections (a shared connection has "
                    "one identity; give it --username/--password)"
                )

    @property
    def connection_count(self) -> int:
        return self.devices if self.mode == "connections" else min(self.connections, self.devices)


def ensure_fd_limit(needed: int) -> int:
    """Raise the soft ``RLIMIT_NOFILE`` to the hard limit if it is below ``needed``.

    Returns the soft limit in force; :class:`FleetError` if even the hard limit is too low.
    """
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or soft >= needed:
        return int(soft)
    if hard != resource.RLIM_INFINITY and hard < needed:
        raise FleetError(
            f"{needed} file descriptors needed (one per connection plus {FDS_RESERVED}), but "
            f"the hard limit RLIMIT_NOFILE is {hard}: raise it (ulimit -Hn, systemd "
            f"LimitNOFILE=, docker --ulimit nofile=) or use --mode multiplexed"
        )
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    logger.info("raised the soft RLIMIT_NOFILE from %d to %s", soft, hard)
    return int(needed if hard == resource.RLIM_INFINITY else hard)
