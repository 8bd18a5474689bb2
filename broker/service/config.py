"""The shuffler's settings (:class:`ShufflerConfig`) and its broker URL."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

from broker.core.machine import (
    CoreConfig,
    RoundPolicy,
)
from edge import mqtt_url
from edge.batch_auth import BatchSigner
from edge.mqtt_version import MqttVersion, check_mqtt_version
from edge.rounds import check_round_seconds
from edge.shards import ShardPlan
from edge.spec import MechanismSpec
from edge.topics import check_name

INGEST_MAX_PACKET = 512
"""Largest MQTT packet the ingest connection accepts (a report's PUBLISH is under 100 bytes)."""


SESSION_EXPIRY = 7 * 24 * 3600
"""Seconds the broker keeps the ingest session (MQTT 5) while the shuffler is away; the same
for ``coco shuffler prepare``, which creates the session before the shuffler's first start."""


def ingest_client_id(
    deployment: str, shard: str | None, *, client_id: str | None, username: str | None
) -> str:
    """The ingest session's client id: ``client_id``, else the username, else
    ``coco-shuffler-<deployment>``; with ``-<label>`` for a shard."""
    base = client_id or username or f"coco-shuffler-{deployment}"
    return base if shard is None else f"{base}-{shard}"


def parse_broker_url(url: str) -> tuple[str, int, bool]:
    """``(host, port, tls)`` of a broker URL (:func:`edge.mqtt_url.parse_broker_url`), or of
    the first node of a comma-separated list (:func:`edge.mqtt_url.parse_broker_urls`)."""
    return tuple(mqtt_url.parse_broker_urls(url)[0])  # type: ignore[return-value]


@dataclass(frozen=True, kw_only=True)
class ShufflerConfig:
    """Settings of one shuffler (see the module docstrings of this module and
    :mod:`broker.core` for their role).

    ``broker`` is ``mqtt://host:port`` or ``mqtts://host:port`` (TLS, optionally with
    ``ca_file``). ``state_dir`` holds the durable state (:mod:`broker.store`); ``None``
    keeps everything in memory. The batch signer is ``signer`` if given, else the key in
    ``signing_key`` (default ``<state_dir>/signing.key``), else (no state directory) a
    fresh in-memory key.
    """

    broker: str
    deployment: str
    spec: MechanismSpec
    min_batch: int
    round_seconds: int
    max_skew: float = 5.0
    late_seconds: float = 600.0
    """Reports of an ended round still accepted this long (queued while the shuffler was
    down); their duplicate tokens are kept as long (:mod:`broker.core.admission`, "Rounds")."""
    max_batch: int = 10_000
    release_size: int | None = None
    round_policy: RoundPolicy = "carry"
    flush_interval: float = 1.0
    qos: int = 1
    username: str | None = None
    password: str | None = field(default=None, repr=False)
    ca_file: str | None = None
    client_id: str | None = None
    session_expiry: int = SESSION_EXPIRY
    mqtt_version: MqttVersion = "auto"
    """``auto``: MQTT 5, or 3.1.1 where the broker refuses 5 (probed once per process,
    :func:`edge.mqtt_version.negotiate`). On 3.1.1 the session is ``clean_session=0`` (kept
    until a clean connection), there is no Maximum Packet Size (the broker's own limit
    applies; the ingest checks every payload's length first) and no DISCONNECT 0x8E on a
    takeover (only the quick-loss rule, or a shard lease, tells)."""
    state_dir: Path | None = None
    fsync: bool = False
    signing_key: Path | None = None
    create_signing_key: bool = False
    """Create ``signing_key`` (default ``<state_dir>/signing.key``) if it does not exist;
    otherwise a missing key is an error (broker/service/keys.py)."""
    announced_public_key: str | None = None
    """The announcement's ``batch_public_key``: the shuffler refuses any other key."""
    signer: BatchSigner | None = field(default=None, repr=False)
    shard: str | None = None
    """This shuffler's shard label (``g0s1``) in a sharded deployment; ``plan`` is then the
    announced layouts (:class:`edge.shards.ShardPlan`)."""
    plan: ShardPlan | None = None
    lease_ttl: float = 30.0
    """The shard lease's time to live (broker/service/lease.py); renewed every third of it."""
    lease_settle: float = 1.0
    """How long a lease claim waits before it reads the retained value back."""
    announced: bool = False
    """The spec came from the deployment's retained announcement: a node must deliver it
    with the lease for its "no lease" to be believed (broker/service/lease.py)."""
    lease_start_window: float = 60.0
    """Seconds a starting shuffler walks the nodes of ``broker`` to claim its lease
    (:mod:`broker.service.sharding`)."""
    broker_stats: bool = False
    """Export Mosquitto's ``$SYS`` loss counters (``coco_mosquitto_*``,
    :mod:`broker.service.broker_stats`) on the shuffler's registry, over a connection of its own;
    absent on a broker without ``$SYS`` (NATS)."""
    backlog_quiet: float = 2.0
    """After a (re)subscription, rounds that ended while the shuffler was away are held
    open until no report of an ended round has arrived for this long (bounded by
    ``late_seconds``), so the broker's queued backlog is still accepted."""
    max_reports_per_round: int = 1_000_000
    max_outbox_batches: int = 1_000
    compact_bytes: int = 64 << 20
    """Compact the log once it has grown by this many bytes since the last compaction."""
    publish_timeout: float = 10.0
    drain_timeout: float = 10.0
    reconnect_min: float = 0.1
    reconnect_max: float = 10.0

    def __post_init__(self) -> None:
        parse_broker_url(self.broker)
        check_name("deployment", self.deployment)
        if not isinstance(self.spec, MechanismSpec):
            raise ValueError(f"spec must be a MechanismSpec, got {self.spec!r}")
        check_round_seconds(self.round_seconds)
        self.core_config()  # validates the release rules
        if self.qos != 1:
            raise ValueError(f"qos must be 1 (at-least-once batches), got {self.qos}")
        for name in (
            "flush_interval",
            "publish_timeout",
            "drain_timeout",
            "reconnect_min",
            "reconnect_max",
            "lease_start_window",
        ):
            value = getattr(self, name)
            if not (math.isfinite(value) and value > 0):
                raise ValueError(f"{name} must be a positive number of seconds, got {value}")
        expiry = self.session_expiry
        if isinstance(expiry, bool) or not isinstance(expiry, int) or not 0 <= expiry < 2**32:
            raise ValueError(
                f"session_expiry must be an integer number of seconds in [0, 2**32), got {expiry!r}"
            )
        if self.client_id is not None and not self.client_id:
            raise ValueError("client_id must be None (derived from the account) or non-empty")
        check_mqtt_version(self.mqtt_version)
        if (self.shard is None) != (self.plan is None):
            raise ValueError("a sharded shuffler needs both shard and plan (the announcement's)")
        if self.shard is not None and self.plan is not None:
            if self.plan.layout_of_label(self.shard) is None:
                raise ValueError(
                    f"shard {self.shard} is not one of the announced shards "
                    f"({', '.join(self.plan.labels)})"
                )
            if self.signer is not None and self.signer.shard != self.shard:
                raise ValueError(f"the signer is not shard {self.shard}'s")
        if self.compact_bytes < 1:
            raise ValueError(f"compact_bytes must be >= 1, got {self.compact_bytes}")

    def core_config(self) -> CoreConfig:
        return CoreConfig(
            fingerprint=self.spec.fingerprint_int,
            t=self.spec.t,
            round_seconds=self.round_seconds,
            min_batch=self.min_batch,
            max_batch=self.max_batch,
            release_size=self.release_size,
            round_policy=self.round_policy,
            max_skew=self.max_skew,
            late_seconds=self.late_seconds,
            max_reports_per_round=self.max_reports_per_round,
            max_outbox_batches=self.max_outbox_batches,
        )

    @property
    def ingest_client_id(self) -> str:
        """The persistent session's client id: derived from the account, and fixed per
        shard (``-<label>``), so the broker lets one connection consume a shard's session."""
        return ingest_client_id(
            self.deployment, self.shard, client_id=self.client_id, username=self.username
        )
