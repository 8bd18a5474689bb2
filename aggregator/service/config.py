"""The aggregator's configuration (:class:`AggregatorConfig`) and how it reaches a broker.

Only data and checks: nothing here connects, reads a file or starts a task.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from aggregator.page.page_data import Channel, check_channels
from aggregator.series.windows import Window, parse_duration, parse_windows
from aggregator.service.core.keys import anchor_of
from aggregator.service.core.silence import DEFAULT_SILENT_SHARD_ROUNDS
from edge import mqtt_url, topics
from edge.batch_auth import BatchVerifier
from edge.defaults import DEFAULT_METRICS_HOST, check_delta
from edge.errors import CocoError
from edge.mqtt_version import MqttVersion, check_mqtt_version
from edge.rounds import check_round_seconds
from edge.shards import ShardPlan
from edge.spec import MechanismSpec

DEFAULT_METRICS_DIMS = 16
MAX_METRICS_DIMS = 1024
DEFAULT_RETENTION_ROUNDS = 1440
DEFAULT_CYCLE_SECONDS = 86_400.0
"""Rounds whose batch ids are kept: one day at the default 60-second round."""
MAX_PRIVACY_PERIODS = 4
"""Rolling periods whose ``epsilon_total`` is computed (each a composition)."""
DEFAULT_SERIES_RETENTION = 7 * 86400.0
"""Seconds of per-round rows: a week (10 080 rows at the default 60-second round)."""
DEFAULT_SERIES_STEP = 3600
"""Seconds of the coarse rows older rounds are rolled into: an hour."""
DEFAULT_SERIES_COARSE_RETENTION = 90 * 86400.0
"""Seconds the hourly rows are kept past the week: 2160 rows."""
DEFAULT_PUBLISH_INTERVAL = 1.0
"""Seconds between two rebuilds of the estimates, gauges and ``/estimates`` (also rebuilt
on every scrape and request, and on shutdown)."""


def resolve_batch_public_key(configured: str | None, announced: str | None) -> str:
    """The shuffler key to trust: the configured one, else the announced one.

    :class:`CocoError` (one line) when neither is given, or when both are and differ: a
    pinned key that disagrees with the announcement means one of them is wrong, and
    guessing which would let a forger choose.
    """
    if configured is not None and announced is not None and configured != announced:
        raise CocoError(
            f"the configured batch public key ({configured}) differs from the announced "
            f"batch_public_key ({announced}); refusing to start"
        )
    key = configured if configured is not None else announced
    if key is None:
        raise CocoError(
            "no batch public key: give --batch-public-key (the shuffler's Ed25519 public key, "
            "64 hex digits or a file holding them) or announce batch_public_key"
        )
    return key


@dataclass(frozen=True, kw_only=True)
class AggregatorConfig:
    """Everything the service needs; ``metrics_dims`` is a count (the first ``k``
    dimensions) or an explicit list, at most :data:`MAX_METRICS_DIMS` of them.

    ``batch_public_key`` and ``min_batch`` are required: the service applies no batch it
    cannot verify, and none below ``min_batch``.
    """

    broker: str
    deployment: str
    spec: MechanismSpec
    delta: float
    batch_public_key: str | None = None
    """The shuffler's Ed25519 public key, 64 lowercase hex digits (:mod:`edge.batch_auth`):
    the only key whose batches are applied (:func:`resolve_batch_public_key`)."""
    shards: ShardPlan | None = None
    """The announced shard layouts of a sharded deployment (then ``batch_public_key`` is
    ``None``): the aggregator trusts exactly their per-shard keys
    (:mod:`aggregator.service.core.keys`)."""
    manifest_grace: float = 120.0
    """Seconds a release manifest waits for its batches before the missing reports are
    counted (:mod:`aggregator.service.core.manifests`)."""
    key_source: Literal["configured", "announced"] = "configured"
    """Where ``batch_public_key`` comes from: the operator's option, or the announcement.
    With a checkpoint the key is pinned on first use (:mod:`aggregator.service.trust`): an option
    that disagrees with the pin is refused at start, an announcement that does is refused
    (ERROR, counted) while the pin stays in force."""
    min_batch: int | None = None
    """The announced ``min_batch``: smaller batches are rejected (``below_min_batch``); also
    the first point of ``coco_aggregator_epsilon_central_curve``."""
    retention_rounds: int = DEFAULT_RETENTION_ROUNDS
    """Rounds whose applied batch ids are kept (:mod:`aggregator.service.core.rules`): a batch older
    than the newest round applied minus ``retention_rounds - 1`` is rejected as ``stale_round``."""
    silent_shard_rounds: int = DEFAULT_SILENT_SHARD_ROUNDS
    """Rounds in which other shards of the layout in force released while one released
    nothing, from which that one is reported silent (WARNING;
    :mod:`aggregator.service.core.silence`)."""
    round_seconds: int | None = None
    """The announced round length. When known (and the clock is set), a batch of a round
    more than ``retention_rounds`` ahead of this clock's round is rejected as
    ``future_round``: one such batch would otherwise move the horizon past every honest
    round. ``None`` (``--spec`` without ``--round-seconds``) skips that check."""
    checkpoint: Path | None = None
    checkpoint_interval: float = 10.0
    series_retention: float = DEFAULT_SERIES_RETENTION
    """Seconds each round keeps its own row in the per-round series
    (:class:`~aggregator.series.core.Series`; kept in ``<checkpoint>.series``:
    :mod:`aggregator.service.series_file`)."""
    series_step: int | None = DEFAULT_SERIES_STEP
    """Seconds of the coarse rows that rounds past ``series_retention`` are rolled into
    (``None``: they are dropped)."""
    series_coarse_retention: float = DEFAULT_SERIES_COARSE_RETENTION
    """Seconds the coarse rows are kept past ``series_retention``."""
    new_series: bool = False
    """Set the series file aside (``<checkpoint>.series.old``) and start the series anew."""
    publish_interval: float = DEFAULT_PUBLISH_INTERVAL
    """Seconds between rebuilds of the estimates and gauges while batches arrive (module
    docs, *Publishing*); every scrape and ``/estimates`` request also gets fresh ones."""
    metrics_dims: int | Sequence[int] = DEFAULT_METRICS_DIMS
    http_host: str = DEFAULT_METRICS_HOST
    http_port: int | None = 9108
    """``None`` disables the HTTP endpoint; ``0`` picks a free port."""
    client_id: str | None = None
    """MQTT client id of the persistent session; default ``username`` when given, else
    ``coco-aggregator-<deployment>``."""
    session_expiry: int = 7 * 24 * 3600
    mqtt_version: MqttVersion = "auto"
    """``auto`` connects with MQTT 5 and falls back to 3.1.1 once if the broker refuses
    that protocol version (:class:`edge.mqtt_version.VersionChoice`); ``"5"`` or
    ``"3.1.1"`` forces one. On 3.1.1 the persistent session is ``clean_session=False``
    with no expiry interval, and a session taken over is told by the lease alone (no
    DISCONNECT 0x8E)."""
    lease_timeout: float = 10.0
    """Seconds after which a service whose lease claim never comes back (a broker that
    grants the subscription but drops the claim, e.g. an ``acl_file`` without the topic)
    applies batches without the lease, with a warning (:mod:`aggregator.service.session`)."""
    max_unacked: int = 10
    """Half the broker's in-flight window: once half of this many deliveries wait (or this
    many are unacknowledged in all), a checkpoint starts in the background
    (:mod:`aggregator.service.generations`). A PUBACK waits for two durable generations
    (:class:`aggregator.service.core.acks.AckGenerations`), so keep ``2 * max_unacked`` within the
    broker's in-flight window (Mosquitto's ``max_inflight_messages``, 20 by default; NATS's
    ``max_ack_pending``)."""
    confidence: float = 0.95
    reconnect_min: float = 0.1
    reconnect_max: float = 10.0
    username: str | None = None
    password: str | None = field(default=None, repr=False)
    ca_file: str | None = None
    """CA bundle that verifies an ``mqtts://`` broker (default: the system's)."""
    epsilon_target: float | None = None
    """Exported as ``coco_aggregator_epsilon_target`` for dashboards; ``None`` exports
    nothing (no target line is drawn). It changes nothing in the service's behaviour."""
    truth_file: Path | None = None
    """SIMULATION ONLY: a fleet's ground-truth file served at ``/truth`` (``--truth``)."""
    channels: Sequence[Channel] | None = None
    """The dimensions as sensor channels (name, unit, range; :mod:`aggregator.page.page_data`),
    one per dimension, where the deployment encodes readings with
    :class:`~edge.encoders.SensorEncoder`: ``/estimates`` and the live page then show each
    channel's mean in its physical unit. ``None``: dimensions ``x0``, ``x1``, ..."""
    cycle_seconds: float = DEFAULT_CYCLE_SECONDS
    """The fleet's cycle (a day) for the change detector (:mod:`aggregator.series.watch`):
    each round is compared with the same round of the earlier cycles. A compressed day
    (``coco fleet --day-seconds S``) needs ``S``; not a whole number of rounds: no detector
    (a WARNING at start)."""
    windows: Sequence[str] = ()
    """Windows exported as ``coco_aggregator_window_*`` gauges (``--window 1h``, ``r10``; at
    most :data:`~aggregator.series.windows.MAX_WINDOWS`); they need the round length."""
    privacy_periods: Sequence[str] = ("24h",)
    """Rolling periods over which ``epsilon_total`` is also reported (``--privacy-period``,
    at most :data:`MAX_PRIVACY_PERIODS`): a device present in every round that ended in the
    last ``P`` (:meth:`~aggregator.ledger.privacy_ledger.PrivacyLedger.period_rounds`)."""
    exported_dims: tuple[int, ...] = field(init=False)
    exported_windows: tuple[Window, ...] = field(init=False)
    periods: tuple[tuple[str, int], ...] = field(init=False)
    """``privacy_periods`` parsed: ``(label, seconds)``."""

    def __post_init__(self) -> None:
        mqtt_url.parse_broker_urls(self.broker)
        topics.check_name("deployment", self.deployment)
        check_delta(self.delta)
        self._check_batch_rules()
        if not self.checkpoint_interval > 0:
            raise ValueError(f"checkpoint_interval must be > 0, got {self.checkpoint_interval}")
        if not self.publish_interval > 0:
            raise ValueError(f"publish_interval must be > 0, got {self.publish_interval}")
        if not self.lease_timeout > 0:
            raise ValueError(f"lease_timeout must be > 0, got {self.lease_timeout}")
        check_mqtt_version(self.mqtt_version)
        if self.max_unacked < 1:
            raise ValueError(f"max_unacked must be >= 1, got {self.max_unacked}")
        if not 0 < self.reconnect_min <= self.reconnect_max:
            raise ValueError(
                f"need 0 < reconnect_min <= reconnect_max, got {self.reconnect_min}, "
                f"{self.reconnect_max}"
            )
        if self.epsilon_target is not None and not (
            math.isfinite(self.epsilon_target) and self.epsilon_target > 0
        ):
            raise ValueError(f"epsilon_target must be finite and > 0, got {self.epsilon_target}")
        if isinstance(self.metrics_dims, int):
            if self.metrics_dims < 0:
                raise ValueError(f"metrics_dims must be >= 0, got {self.metrics_dims}")
            dims = tuple(range(min(self.metrics_dims, self.spec.d)))
        else:
            dims = tuple(sorted({int(j) for j in self.metrics_dims}))
            if dims and (dims[0] < 0 or dims[-1] >= self.spec.d):
                raise ValueError(f"metrics_dims must be in [0, {self.spec.d}), got {dims}")
        if len(dims) > MAX_METRICS_DIMS:
            raise ValueError(f"at most {MAX_METRICS_DIMS} metrics_dims, got {len(dims)}")
        object.__setattr__(self, "exported_dims", dims)
        self._check_channels()
        self._check_windows()
        self._check_periods()

    def _check_periods(self) -> None:
        labels = [text.strip() for text in self.privacy_periods]
        if len(labels) > MAX_PRIVACY_PERIODS:
            raise ValueError(f"at most {MAX_PRIVACY_PERIODS} privacy periods, got {len(labels)}")
        if len(set(labels)) != len(labels):
            raise ValueError(f"a privacy period is given twice: {labels}")
        periods = tuple((label, parse_duration(label, name="privacy period")) for label in labels)
        object.__setattr__(self, "periods", periods)

    def _check_windows(self) -> None:
        windows = parse_windows(list(self.windows))  # QueryError is a ValueError
        if windows and self.round_seconds is None:
            raise ValueError("--window needs the round length (the announced round_seconds)")
        object.__setattr__(self, "exported_windows", windows)
        if not (math.isfinite(self.cycle_seconds) and self.cycle_seconds > 0):
            raise ValueError(f"cycle_seconds must be > 0, got {self.cycle_seconds}")

    def _check_channels(self) -> None:
        if self.channels is not None:
            channels = check_channels(self.channels, d=self.spec.d, s=self.spec.s)
            object.__setattr__(self, "channels", channels)

    def _check_batch_rules(self) -> None:
        if self.batch_public_key is None and self.shards is None:
            raise ValueError(
                "batch_public_key is required: the shuffler's Ed25519 public key "
                "(--batch-public-key, or batch_public_key in the announcement)"
            )
        if self.batch_public_key is not None and self.shards is not None:
            raise ValueError("a sharded deployment trusts its shards' keys, not batch_public_key")
        if self.batch_public_key is not None:
            BatchVerifier(self.batch_public_key, self.deployment)  # CocoError if malformed
        if not self.manifest_grace > 0:
            raise ValueError(f"manifest_grace must be > 0, got {self.manifest_grace}")
        if self.min_batch is None:
            raise ValueError("min_batch is required: the announced one, or --min-batch")
        if self.min_batch < 1:
            raise ValueError(f"min_batch must be >= 1, got {self.min_batch}")
        if self.silent_shard_rounds < 1:
            raise ValueError(f"silent_shard_rounds must be >= 1, got {self.silent_shard_rounds}")
        if self.retention_rounds < 1:
            raise ValueError(f"retention_rounds must be >= 1, got {self.retention_rounds}")
        if self.round_seconds is not None:
            check_round_seconds(self.round_seconds)
        if not (math.isfinite(self.series_retention) and self.series_retention > 0):
            raise ValueError(f"series_retention must be > 0 seconds, got {self.series_retention}")
        if self.series_step is not None and self.series_step < 1:
            raise ValueError(f"series_step must be >= 1 second, got {self.series_step}")
        if not (math.isfinite(self.series_coarse_retention) and self.series_coarse_retention >= 0):
            raise ValueError(
                f"series_coarse_retention must be >= 0 seconds, got {self.series_coarse_retention}"
            )

    @property
    def mqtt_client_id(self) -> str:
        return self.client_id or self.username or f"coco-aggregator-{self.deployment}"

    @property
    def trusted(self) -> str:
        """The anchor to trust on first use (:func:`aggregator.service.core.keys.anchor_of`)."""
        return anchor_of(self.batch_public_key, self.shards)

    @property
    def trust_path(self) -> Path | None:
        """``<checkpoint>.trust``, the pinned batch key (``None`` without a checkpoint)."""
        if self.checkpoint is None:
            return None
        return self.checkpoint.with_name(self.checkpoint.name + ".trust")

    @property
    def curves_path(self) -> Path | None:
        """``<checkpoint>.ledger.curves``, the certified curve's points kept across a
        restart (:mod:`aggregator.ledger.curve_file`; ``None`` without a checkpoint)."""
        if self.checkpoint is None:
            return None
        return self.checkpoint.with_name(self.checkpoint.name + ".ledger.curves")

    @property
    def lock_path(self) -> Path | None:
        """``<checkpoint>.lock``, the single-writer lock (``None`` without a checkpoint)."""
        if self.checkpoint is None:
            return None
        return self.checkpoint.with_name(self.checkpoint.name + ".lock")


def series_options(retention: str, step: str, coarse_retention: str) -> dict[str, Any]:
    """``--series-retention``, ``--series-step``, ``--series-coarse-retention`` as
    :class:`~aggregator.service.config.AggregatorConfig` fields; :class:`CocoError` (one
    line) naming the option."""
    options: dict[str, Any] = {}
    try:
        options["series_retention"] = parse_duration(retention)
    except ValueError as exc:
        raise CocoError(f"--series-retention: {exc}") from None
    if step.strip().lower() == "none":
        options["series_step"] = None
    else:
        try:
            seconds = parse_duration(step)
        except ValueError as exc:
            raise CocoError(f"--series-step: {exc}") from None
        if seconds != int(seconds):
            raise CocoError(f"--series-step must be whole seconds, got {step!r}")
        options["series_step"] = int(seconds)
    try:
        coarse = coarse_retention.strip()
        options["series_coarse_retention"] = (
            0.0 if coarse in ("0", "0s") else parse_duration(coarse)
        )
    except ValueError as exc:
        raise CocoError(f"--series-coarse-retention: {exc}") from None
    return options
