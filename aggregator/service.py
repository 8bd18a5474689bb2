"""The aggregator service: signed, shuffled batches in, streaming estimates and metrics out.

:class:`Aggregator` subscribes (QoS 1) to ``coco/v1/<deployment>/batches``. Every message is
opened with :class:`~edge.batch_auth.BatchVerifier` under the one trusted shuffler key
(:attr:`AggregatorConfig.batch_public_key`) *before* anything in it is read; then the batch
is checked (wire format, fingerprint of the spec in force, not empty, at least
``min_batch`` reports, a round inside the retained horizon and not beyond it by the
clock, a ``batch_id`` not applied before, ``z < t``, seeds) and only then folded into an
:class:`~aggregator.estimators.AggregateState`. Nothing unverified is ever applied: a
batch of one record, a forged batch or a batch re-sent under a new id cannot move the
estimates or ``epsilon_central``. Rejections are counted by reason
(``coco_aggregator_batches_rejected_total{reason}``, a fixed set of labels:
:data:`~aggregator.metrics.REJECT_REASONS`) and never stop the service. The certified
central epsilon is computed with :func:`~aggregator.accountant.amplify_spec` for the
smallest batch applied (the guarantee every report has) and for the latest one.

The aggregator is trusted with nothing beyond what it receives: it sees only shuffled,
locally randomised reports, never a device id, and logs none.

Exactly once, across crashes
----------------------------
Each batch carries a random 16-byte ``batch_id`` and its round (Unix time divided by the
announced ``round_seconds``, :mod:`edge.rounds`), both covered by the shuffler's signature.
The service remembers the ids it has applied *per round*, for the newest
``retention_rounds`` rounds it has applied a batch of (the retained horizon: rounds
``newest - retention_rounds + 1`` to ``newest``). A batch whose id it knows is ignored
(``coco_aggregator_batches_duplicate_total``); a batch of a round below the horizon is
rejected as ``stale_round``, since its id may have been forgotten. Every replay the broker
can deliver is therefore refused, and the memory (and checkpoint) holds only the ids of
``retention_rounds`` rounds of traffic, however long the service runs.

The ids are written in the *same* checkpoint file as the sums they went into, atomically
(temporary file, ``fsync``, ``os.replace``), so a checkpoint never holds a batch's reports
without its id or the other way round. The checkpoint is serialised and written in a
thread, off the event loop; its size is bounded by the retained window, not by age.

Delivery is MQTT QoS 1 over a **persistent session** (MQTT 5, a client id derived from the
account, ``clean_start=False`` and a session expiry interval) with **manual
acknowledgement**: the PUBACK of a batch is sent only after a checkpoint containing it is
on disk. Hence:

* crash after apply, before the checkpoint: the batch is neither in the checkpoint nor
  acknowledged; on restart the service resumes from the older checkpoint and the broker
  redelivers the batch, which is applied once;
* crash after the checkpoint, before the PUBACK: the broker redelivers, the id is in the
  checkpoint, the batch is counted as a duplicate and acknowledged;
* batches published while the service is down are queued in its session and delivered on
  reconnection.

Retained messages were rejected: only the last message per topic is retained, so batches
published while the service is down would be lost. Unacknowledged batches count against the
broker's in-flight window (Mosquitto's ``max_inflight_messages``, 20 by default), so the
service checkpoints when ``max_unacked`` batches are waiting for their PUBACK, as well as
every ``checkpoint_interval`` seconds and on shutdown. Without a checkpoint path batches
are acknowledged as soon as they are applied (at-most-once across a crash).

One writer per deployment
-------------------------
Two aggregators applying the same batches would count them twice. Two guards:

* the checkpoint is locked (``fcntl.flock`` on ``<checkpoint>.lock``, held while the
  service runs): a second service with the same checkpoint refuses to start
  (:class:`~aggregator.checkpoint.CheckpointLockedError`);
* the MQTT client id is the account's (``username``, else ``coco-aggregator-<deployment>``),
  so a second service of the account takes over the one persistent session; the first one
  then stops with :class:`SessionTakenOverError` instead of reconnecting and fighting for
  it. It knows from a DISCONNECT with MQTT 5 reason ``0x8E`` (*Session taken over*) where
  the broker sends one, and from a **lease** where it does not (Mosquitto 2.0 only closes
  the socket): each run claims the retained topic ``coco/v1/<deployment>/aggregator/lease``
  with a random instance token on its first connection and applies no batch before its own
  claim comes back; on a reconnection it applies nothing before the retained claim shows
  its token again. Another instance's claim means the session was taken over. A broker
  that refuses the lease topic (an ACL without it) leaves only the ``0x8E`` signal, with a
  warning. Batches applied after the last checkpoint of a service that stops this way are
  neither checkpointed nor acknowledged: the broker redelivers them to the new holder, so
  the two checkpoints never hold the same batch (beyond a checkpoint written in the instant
  of the takeover, before its PUBACKs went out).

Publishing, and what never runs on the event loop
------------------------------------------------
Applying a batch only adds its sums and counts (``O(d)``); the estimates, the gauges and the
``/estimates`` document are rebuilt from the state every ``publish_interval`` seconds, on
every scrape of ``/metrics`` and request of ``/estimates`` (a collector registered first
in the registry asks the event loop for a rebuild and waits for it, up to
:data:`REQUEST_WAIT`) and on shutdown, never per batch. Prometheus counters move with each
batch. The central privacy level (epsilon_central of the smallest and latest batch,
epsilon_central_generic, epsilon_total) is the :class:`~aggregator.privacy_ledger.
PrivacyLedger`'s, recomputed after batches are applied in the accountant's own
low-priority process (:mod:`aggregator.accountant_process`, the service's one use of the
accountant); until it covers the newest batch the previous level is shown
(``batches_accounted`` says how many it covers), and a request from another thread waits
for it, up to :data:`REQUEST_WAIT`, off the loop. The kernel of a batch larger than
:data:`INLINE_ELEMENTS` runs in a thread; the checkpoint is serialised and written in a
thread, its ids formatted by numpy (:func:`~aggregator.checkpoint.encode_checkpoint`).

Shutdown
--------
On shutdown the service writes a final checkpoint, sends the PUBACKs it covers and logs at
INFO what this run applied, ignored and rejected (by reason) and how many batches were left
unacknowledged (by reason: ``connection_lost``, ``unprocessed``, ``checkpoint_failed``,
``taken_over``; the broker redelivers those to the session,
``coco_aggregator_batches_unacknowledged_total``). Rejections and duplicates are logged
too, but only the 1st, 2nd, 4th, 8th... of each kind per run, so a flood of forged or
replayed batches cannot flood the log; the counters hold the exact numbers.

What a broker cannot give back is out of scope: a Mosquitto restarted without persistence
forgets sessions and queued batches (run it with ``persistence true`` in production); the
service reconnects with exponential backoff and resubscribes either way.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import os
import random
import secrets
import ssl
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any, Literal, Self

import aiomqtt
import paho.mqtt.client as paho
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties
from prometheus_client import CollectorRegistry
from prometheus_client.registry import Collector

from aggregator import accountant_process
from aggregator.batch_codec import decode_batch_arrays
from aggregator.checkpoint import (
    CHECKPOINT_VERSION,
    Checkpoint,
    CheckpointError,
    Counters,
    load_checkpoint,
    lock_checkpoint,
    write_checkpoint,
)
from aggregator.estimators import AggregateState
from aggregator.metrics import (
    UNACKED_REASONS,
    AggregatorMetrics,
    MetricsServer,
    epsilon_curve_grid,
)
from aggregator.privacy_ledger import PrivacyLedger, PrivacyLevel
from edge import mqtt_url, topics
from edge.announce import decode_announcement
from edge.batch_auth import BatchAuthError, BatchVerifier
from edge.codec import CodecError
from edge.errors import CocoError, ReportError, SpecError
from edge.rounds import ClockError, check_round_seconds, current_round
from edge.spec import MechanismSpec

logger = logging.getLogger(__name__)

DEFAULT_METRICS_DIMS = 16
MAX_METRICS_DIMS = 1024
DEFAULT_RETENTION_ROUNDS = 1440
"""Rounds whose batch ids are kept: one day at the default 60-second round."""
LEASE_WAIT = 2.0
"""Seconds a reconnected service waits for the retained lease before claiming it anew."""
SESSION_TAKEN_OVER = 0x8E
"""MQTT 5 reason code of a DISCONNECT sent because another client connected with our id."""
INLINE_ELEMENTS = 1 << 16
"""Batches of at most this many hash evaluations (``size * d``; well under 1 ms) are added
on the event loop; larger ones in a thread."""
DEFAULT_PUBLISH_INTERVAL = 1.0
"""Seconds between two rebuilds of the estimates, gauges and ``/estimates`` (also rebuilt
on every scrape and request, and on shutdown)."""
REQUEST_WAIT = 5.0
"""Seconds a scrape or ``/estimates`` request waits for the event loop (and for an
epsilon_central being computed) before it is served what was last published."""


class SessionTakenOverError(CocoError):
    """The broker handed this service's MQTT session to another client with the same id."""


class _RejectedError(Exception):
    def __init__(self, reason: str, reports: int = 0) -> None:
        super().__init__(reason)
        self.reason = reason
        self.reports = reports


def mqtt_connection(
    broker: str,
    *,
    username: str | None = None,
    password: str | None = None,
    ca_file: str | None = None,
) -> dict[str, Any]:
    """Keyword arguments of :class:`aiomqtt.Client` for ``broker`` (``mqtt://`` or
    ``mqtts://``, :func:`edge.mqtt_url.parse_broker_url`): address, credentials, and for
    ``mqtts://`` a verifying TLS context (``ca_file``, or the system's CA store)."""
    address = mqtt_url.parse_broker_url(broker)
    kwargs: dict[str, Any] = {
        "hostname": address.host,
        "port": address.port,
        "username": username,
        "password": password,
    }
    if address.tls:
        kwargs["tls_context"] = ssl.create_default_context(cafile=ca_file)
    return kwargs


def lease_topic(deployment: str) -> str:
    """``coco/v1/<deployment>/aggregator/lease``: the retained claim of the aggregator that
    holds the deployment's session (module docs, *One writer per deployment*)."""
    return topics.lease_topic(deployment)


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
    min_batch: int | None = None
    """The announced ``min_batch``: smaller batches are rejected (``below_min_batch``); also
    the first point of ``coco_aggregator_epsilon_central_curve``."""
    retention_rounds: int = DEFAULT_RETENTION_ROUNDS
    """Rounds whose applied batch ids are kept (module docs): a batch older than the newest
    round applied minus ``retention_rounds - 1`` is rejected as ``stale_round``."""
    round_seconds: int | None = None
    """The announced round length. When known (and the clock is set), a batch of a round
    more than ``retention_rounds`` ahead of this clock's round is rejected as
    ``future_round``: one such batch would otherwise move the horizon past every honest
    round. ``None`` (``--spec`` without ``--round-seconds``) skips that check."""
    checkpoint: Path | None = None
    checkpoint_interval: float = 10.0
    publish_interval: float = DEFAULT_PUBLISH_INTERVAL
    """Seconds between rebuilds of the estimates and gauges while batches arrive (module
    docs, *Publishing*); every scrape and ``/estimates`` request also gets fresh ones."""
    metrics_dims: int | Sequence[int] = DEFAULT_METRICS_DIMS
    http_host: str = "127.0.0.1"
    http_port: int | None = 9108
    """``None`` disables the HTTP endpoint; ``0`` picks a free port."""
    client_id: str | None = None
    """MQTT client id of the persistent session; default ``username`` when given, else
    ``coco-aggregator-<deployment>``."""
    session_expiry: int = 7 * 24 * 3600
    mqtt_version: Literal["5", "3.1.1"] = "5"
    """MQTT 3.1.1 is for brokers without MQTT 5 (the demo's embedded amqtt): the persistent
    session is then ``clean_session=False`` with no expiry interval, and a session taken
    over cannot be told from a lost connection."""
    lease_timeout: float = 10.0
    """Seconds after which a service whose lease claim never comes back (a broker that
    grants the subscription but drops the claim, e.g. an ``acl_file`` without the topic)
    applies batches without the lease, with a warning (module docs)."""
    max_unacked: int = 10
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
    exported_dims: tuple[int, ...] = field(init=False)

    def __post_init__(self) -> None:
        mqtt_url.parse_broker_url(self.broker)
        topics.check_name("deployment", self.deployment)
        if not 0 < self.delta < 1:
            raise ValueError(f"delta must be in (0, 1), got {self.delta}")
        self._check_batch_rules()
        if not self.checkpoint_interval > 0:
            raise ValueError(f"checkpoint_interval must be > 0, got {self.checkpoint_interval}")
        if not self.publish_interval > 0:
            raise ValueError(f"publish_interval must be > 0, got {self.publish_interval}")
        if not self.lease_timeout > 0:
            raise ValueError(f"lease_timeout must be > 0, got {self.lease_timeout}")
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

    def _check_batch_rules(self) -> None:
        if self.batch_public_key is None:
            raise ValueError(
                "batch_public_key is required: the shuffler's Ed25519 public key "
                "(--batch-public-key, or batch_public_key in the announcement)"
            )
        BatchVerifier(self.batch_public_key, self.deployment)  # CocoError if malformed
        if self.min_batch is None:
            raise ValueError("min_batch is required: the announced one, or --min-batch")
        if self.min_batch < 1:
            raise ValueError(f"min_batch must be >= 1, got {self.min_batch}")
        if self.retention_rounds < 1:
            raise ValueError(f"retention_rounds must be >= 1, got {self.retention_rounds}")
        if self.round_seconds is not None:
            check_round_seconds(self.round_seconds)

    @property
    def mqtt_client_id(self) -> str:
        return self.client_id or self.username or f"coco-aggregator-{self.deployment}"

    @property
    def lock_path(self) -> Path | None:
        """``<checkpoint>.lock``, the single-writer lock (``None`` without a checkpoint)."""
        if self.checkpoint is None:
            return None
        return self.checkpoint.with_name(self.checkpoint.name + ".lock")


def estimates_document(
    state: AggregateState,
    *,
    delta: float,
    batch_sizes: dict[int, int],
    latest_batch: int | None,
    confidence: float = 0.95,
    extra: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The offline ``/estimates`` JSON of a checkpoint (``coco aggregator snapshot``)."""
    ledger = PrivacyLedger(state.spec, delta=delta)
    ledger.restore(batch_sizes, latest_batch)
    level = ledger.compute(ledger.snapshot())
    return {
        "spec": state.spec.to_dict(),
        "n": state.n,
        "estimates": state.estimate(confidence=confidence).to_dict(),
        "epsilon_local": state.spec.epsilon,
        **level.to_dict(),
        "batch_size": {"smallest": ledger.smallest, "latest": latest_batch},
        "delta": delta,
        **(extra or {}),
    }


def snapshot_from_checkpoint(path: Path, *, confidence: float = 0.95) -> dict[str, Any]:
    """Offline ``/estimates`` document of a checkpoint file."""
    checkpoint = load_checkpoint(path)
    return estimates_document(
        checkpoint.state,
        delta=checkpoint.delta,
        batch_sizes=checkpoint.batch_sizes,
        latest_batch=checkpoint.latest_batch,
        confidence=confidence,
        extra={"checkpoint": str(path), "counters": checkpoint.counters.to_dict()},
    )


async def fetch_announcement(
    broker: str,
    deployment: str,
    *,
    timeout: float = 10.0,
    username: str | None = None,
    password: str | None = None,
    ca_file: str | None = None,
) -> dict[str, Any]:
    """The retained spec announcement of ``deployment`` (:func:`decode_announcement`)."""
    connection = mqtt_connection(broker, username=username, password=password, ca_file=ca_file)
    try:
        async with (
            asyncio.timeout(timeout),
            aiomqtt.Client(**connection, timeout=timeout) as client,
        ):
            await client.subscribe(topics.spec_topic(deployment), qos=1)
            async for message in client.messages:
                payload = message.payload
                if isinstance(payload, bytes | bytearray):
                    return decode_announcement(bytes(payload))
                raise SpecError("the spec announcement is not a binary payload")
    except TimeoutError:
        raise SpecError(
            f"no retained spec announcement on {topics.spec_topic(deployment)} within {timeout:g} s"
        ) from None
    except aiomqtt.MqttError as exc:
        raise CocoError(f"cannot read the spec announcement from {broker}: {exc}") from exc
    raise SpecError("the broker closed the announcement subscription")  # pragma: no cover


def _session_taken_over(exc: BaseException) -> bool:
    """Whether ``exc`` (or what caused it) is the broker's DISCONNECT 0x8E."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        rc = getattr(current, "rc", None)
        if rc is not None and getattr(rc, "value", rc) == SESSION_TAKEN_OVER:
            return True
        current = current.__cause__ or current.__context__
    return False


ACCOUNTING_ERRORS = (ArithmeticError, ValueError, accountant_process.AccountantError)
"""What a privacy computation may raise; logged and retried, never fatal to the service."""


def _is_power_of_two(n: int) -> bool:
    return n > 0 and n & (n - 1) == 0


class _RefreshOnCollect(Collector):
    """Registered first: every scrape (or ``get_sample_value``) brings the gauges up to date
    before the other collectors are read. It exports nothing itself."""

    def __init__(self, refresh: Callable[[], None]) -> None:
        self._refresh = refresh

    def describe(self) -> list[Any]:
        return []

    def collect(self) -> list[Any]:
        self._refresh()
        return []


class Aggregator:
    """Async context manager around the service; ``await run()`` until cancelled.

    Entering takes the checkpoint's lock, loads the checkpoint (if any) and starts the HTTP
    endpoint; leaving writes a final checkpoint, logs the shutdown counts, stops the
    endpoint and releases the lock. Reusable, not re-entrant.
    """

    def __init__(self, config: AggregatorConfig, *, registry: CollectorRegistry | None = None):
        assert config.batch_public_key is not None
        assert config.min_batch is not None
        self.config = config
        self.spec = config.spec
        self.min_batch: int = config.min_batch
        self.verifier = BatchVerifier(config.batch_public_key, config.deployment)
        self.registry = registry if registry is not None else CollectorRegistry()
        # first in the registry, so a scrape refreshes the gauges before they are read
        self.registry.register(_RefreshOnCollect(self._refresh))
        self.metrics = AggregatorMetrics(
            self.registry,
            spec=self.spec,
            dims=config.exported_dims,
            epsilon_target=config.epsilon_target,
        )
        self.metrics.delta.set(config.delta)
        self.metrics.min_batch.set(self.min_batch)
        self.metrics.retention_rounds.set(config.retention_rounds)
        self.state = AggregateState(self.spec)
        self.counters = Counters()
        self.smallest_batch: int | None = None
        self.latest_batch: int | None = None
        self.last_batch_timestamp: float | None = None
        self.newest_round: int | None = None
        """The newest round of an applied batch: the retained horizon ends there."""
        self.subscribed = asyncio.Event()
        """Set while subscribed to the batches topic (for tests and health checks)."""
        self.connections = 0
        self._seen: dict[bytes, int] = {}
        """Applied batch id -> its round, for the retained rounds only."""
        self._rounds: dict[int, list[bytes]] = {}
        self.ledger = PrivacyLedger(self.spec, delta=config.delta)
        self._privacy = PrivacyLevel(
            epsilon_central={"smallest": None, "latest": None},
            epsilon_central_generic={"smallest": None, "latest": None},
            epsilon_total=None,
            batches=0,
            sizes={"smallest": None, "latest": None},
        )
        self._privacy_dirty = asyncio.Event()
        self._first_level = asyncio.Event()  # the privacy loop's first level is done
        self._privacy_settled = threading.Event()
        """Set while the privacy level covers every batch applied."""
        self._privacy_running = False  # whether _privacy_loop runs (else a request accounts)
        self._unpublished = True
        """Whether anything published (estimates, gauges, ``/estimates``) is out of date."""
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_thread: int | None = None
        self._pending: list[tuple[paho.Client, int, int]] = []
        self._dirty = False
        self._last_checkpoint = time.monotonic()
        self._checkpoint_lock = asyncio.Lock()
        self._entered = False
        self._lock_fd: int | None = None
        self._run_start = Counters()
        self._http: MetricsServer | None = None
        self._document: dict[str, Any] = {}
        self._instance = secrets.token_hex(8)
        """This run's claim on the lease topic."""
        self._lease_fallback: asyncio.Task[None] | None = None
        self._lease_refused_logged = False
        self._abandoned = False

    # -- lifecycle -------------------------------------------------------------------------

    async def __aenter__(self) -> Self:
        if self._entered:
            raise RuntimeError("the Aggregator is reusable, but not re-entrant")
        self._entered = True
        self._abandoned = False
        try:
            path, lock = self.config.checkpoint, self.config.lock_path
            if path is not None and lock is not None:
                self._lock_fd = lock_checkpoint(lock, path)
                if path.exists():
                    self._restore(await asyncio.to_thread(load_checkpoint, path))
            self._run_start = self.counters.copy()
            self._bind_loop()
            self._publish()
            if self.config.http_port is not None:
                self._http = MetricsServer(
                    host=self.config.http_host,
                    port=self.config.http_port,
                    registry=self.registry,
                    estimates=self.snapshot,
                )
                self._http.start()
        except BaseException:
            self._release_lock()
            self._entered = False
            raise
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        try:
            if self._abandoned:
                logger.info(
                    "no final checkpoint: the batches applied since the last one are "
                    "redelivered to the session's new holder"
                )
                self._count_unacknowledged("taken_over", len(self._pending))
                self._pending.clear()
            else:
                await asyncio.shield(self.checkpoint())
            if self._pending:
                self._count_unacknowledged("checkpoint_failed", len(self._pending))
                self._pending.clear()
            self._log_shutdown()
            # what stays in the registry and document: final. The privacy level of batches
            # not yet accounted for is computed by the first read after this (_refresh),
            # not here: a stopping service does not wait for a number it will not use.
            self._unpublished = True
            self._publish()
        finally:
            if self._http is not None:
                self._http.stop()
                self._http = None
            self._release_lock()
            self._entered = False

    def _release_lock(self) -> None:
        if self._lock_fd is not None:
            os.close(self._lock_fd)  # closing the descriptor releases the flock
            self._lock_fd = None

    def _log_shutdown(self) -> None:
        """This run's counts at INFO: what was applied, ignored, rejected, unacknowledged."""
        now, start = self.counters, self._run_start

        def since(current: dict[str, int], before: dict[str, int]) -> dict[str, int]:
            delta = {k: v - before.get(k, 0) for k, v in current.items()}
            return {k: v for k, v in sorted(delta.items()) if v}

        rejected = since(now.rejected, start.rejected)
        rejected_reports = since(now.rejected_reports, start.rejected_reports)
        unacked = since(now.unacknowledged, start.unacknowledged)
        logger.info(
            "stopping: this run applied %d batches (%d reports) and ignored %d duplicates; "
            "rejected %d batches %s holding %d verified reports %s; left %d batches "
            "unacknowledged %s, which the broker redelivers to the session",
            now.batches - start.batches,
            now.reports - start.reports,
            now.duplicates - start.duplicates,
            sum(rejected.values()),
            rejected,
            sum(rejected_reports.values()),
            rejected_reports,
            sum(unacked.values()),
            unacked,
        )

    @property
    def http_port(self) -> int | None:
        return None if self._http is None else self._http.port

    def snapshot(self) -> dict[str, Any]:
        """The current ``/estimates`` document (brought up to date first, :meth:`_refresh`)."""
        self._refresh()
        return self._document

    @property
    def retained_batch_ids(self) -> int:
        """Batch ids in memory (those of the retained rounds)."""
        return len(self._seen)

    @property
    def oldest_retained_round(self) -> int | None:
        """The oldest round still accepted; ``None`` before the first batch."""
        if self.newest_round is None:
            return None
        return max(0, self.newest_round - self.config.retention_rounds + 1)

    async def run(self) -> None:
        """Consume batches (reconnecting as needed) and checkpoint, until cancelled.

        Raises :class:`SessionTakenOverError` when another client takes over the session.
        """
        if not self._entered:
            raise RuntimeError("use 'async with Aggregator(config) as agg: await agg.run()'")
        try:
            async with asyncio.TaskGroup() as tasks:
                tasks.create_task(self._mqtt_loop(), name="coco-aggregator-mqtt")
                tasks.create_task(self._checkpoint_loop(), name="coco-aggregator-checkpoint")
                tasks.create_task(self._export_epsilon_curve(), name="coco-aggregator-eps-curve")
                tasks.create_task(self._privacy_loop(), name="coco-aggregator-privacy")
                tasks.create_task(self._publish_loop(), name="coco-aggregator-publish")
        except BaseExceptionGroup as group:
            coco = group.subgroup(CocoError)
            if coco is not None and len(group.exceptions) == len(coco.exceptions):
                first = coco.exceptions[0]
                while isinstance(first, BaseExceptionGroup):
                    first = first.exceptions[0]
                raise first from None
            raise

    async def _export_epsilon_curve(self) -> None:
        """Compute the certified epsilon curve once, in the accountant's process (about
        3 s of CPU at d = 512), after the first privacy level: the level comes first."""
        await self._first_level.wait()
        grid = epsilon_curve_grid(self.min_batch)
        try:
            curve = await accountant_process.compute_curve(self.spec, self.config.delta, grid)
        except ACCOUNTING_ERRORS:  # a dashboard curve must not stop the service
            logger.exception("cannot compute the epsilon_central curve; not exported")
            return
        self.metrics.set_epsilon_curve(curve)

    async def _privacy_loop(self) -> None:
        """Recompute the central privacy level after batches were applied, in the
        accountant's process (:mod:`aggregator.accountant_process`: a new batch size costs
        up to about a second, a new composition 2-3 s), never on the event loop."""
        self._privacy_dirty.set()  # a restored checkpoint has a history to account for
        self._privacy_running = True
        try:
            while True:
                await self._account_once()
        finally:
            self._privacy_running = False

    async def _account_once(self) -> None:
        await self._privacy_dirty.wait()
        self._privacy_dirty.clear()
        snapshot = self.ledger.snapshot()
        try:
            level = await accountant_process.compute_level(self.spec, self.config.delta, snapshot)
        except ACCOUNTING_ERRORS:  # accounting must not stop the service
            logger.exception("cannot compute the central privacy level; retrying later")
            self._first_level.set()
            await asyncio.sleep(5.0)
            self._privacy_dirty.set()
            return
        self._adopt(level)
        self._first_level.set()
        self._publish()

    def _adopt(self, level: PrivacyLevel) -> None:
        """Show ``level`` from the next publication on, unless a newer one is shown."""
        if level.batches >= self._privacy.batches:
            self._privacy = level
        if level.batches == self.counters.batches:
            self._privacy_settled.set()
        self._unpublished = True

    async def _publish_loop(self) -> None:
        while True:
            await asyncio.sleep(self.config.publish_interval)
            self._publish()

    # -- MQTT ------------------------------------------------------------------------------

    def _client(self) -> aiomqtt.Client:
        cfg = self.config
        connection = mqtt_connection(
            cfg.broker, username=cfg.username, password=cfg.password, ca_file=cfg.ca_file
        )
        if self.config.mqtt_version == "3.1.1":
            client = aiomqtt.Client(
                **connection,
                identifier=self.config.mqtt_client_id,
                protocol=aiomqtt.ProtocolVersion.V311,
                clean_session=False,
                keepalive=30,
                timeout=10,
            )
        else:
            properties = Properties(PacketTypes.CONNECT)  # type: ignore[no-untyped-call]
            properties.SessionExpiryInterval = self.config.session_expiry
            client = aiomqtt.Client(
                **connection,
                identifier=self.config.mqtt_client_id,
                protocol=aiomqtt.ProtocolVersion.V5,
                clean_start=False,
                properties=properties,
                keepalive=30,
                timeout=10,
            )
        # aiomqtt 2.x does not expose paho's manual acknowledgement; the PUBACK must wait for
        # the checkpoint (module docs), so switch it on in the underlying paho client.
        client._client.manual_ack_set(True)
        return client

    def _taken_over(self, how: str) -> SessionTakenOverError:
        # Batches applied since the last checkpoint are not acknowledged: the broker
        # redelivers them to the session's new holder, so they must not be in our
        # checkpoint either (the two checkpoints stay disjoint).
        self._abandoned = True
        return SessionTakenOverError(
            f"another client took over this aggregator's MQTT session "
            f"({self.config.mqtt_client_id}; {how}): another aggregator of deployment "
            f"{self.config.deployment} is running; stopping instead of fighting for it"
        )

    async def _claim_lease(self, client: aiomqtt.Client, *, first: bool) -> bool:
        """Subscribe to the lease topic and, on the first connection of this run, claim it.

        Returns whether the lease is in use (``False`` where the broker refuses the topic,
        or over MQTT 3.1.1: then only a DISCONNECT 0x8E can tell a takeover)."""
        if self.config.mqtt_version != "5":
            return False
        lease = lease_topic(self.config.deployment)
        granted = await client.subscribe(lease, qos=1)
        codes = granted if isinstance(granted, list) else []
        if any(getattr(code, "value", code) >= 0x80 for code in codes):
            if not self._lease_refused_logged:
                self._lease_refused_logged = True
                logger.warning(
                    "the broker refuses the lease topic %s; a takeover of this session is "
                    "detected only from a DISCONNECT with reason 0x8E",
                    lease,
                )
            return False
        if first:
            await self._publish_lease(client)
        else:
            # Wait for the retained lease (module docs); claim it if there is none.
            self._lease_fallback = asyncio.create_task(
                self._claim_lease_later(client), name="coco-aggregator-lease"
            )
        return True

    async def _publish_lease(self, client: aiomqtt.Client) -> None:
        claim = json.dumps(
            {"instance": self._instance, "client_id": self.config.mqtt_client_id},
            separators=(",", ":"),
        )
        await client.publish(lease_topic(self.config.deployment), claim, qos=1, retain=True)

    async def _claim_lease_later(self, client: aiomqtt.Client) -> None:
        await asyncio.sleep(LEASE_WAIT)
        with contextlib.suppress(aiomqtt.MqttError):
            await self._publish_lease(client)

    def _lease_verdict(self, message: aiomqtt.Message, *, first: bool, own_seen: bool) -> bool:
        """Whether ``message`` (on the lease topic) is our own claim; raises
        :class:`SessionTakenOverError` if it shows another instance holding the lease.

        The broker delivers the claims in the order it receives them, so on the first
        connection of a run anything before our own claim is older than it (a previous
        holder's, or one left in the session) and is ignored, even once ``lease_timeout``
        has let batches through: behind a backlog of unacknowledged batches (the broker's
        in-flight window) the retained claim of the run before a crash arrives late. After
        our own claim, or on a reconnection, another instance's claim means it took over."""
        try:
            payload = message.payload
            text = bytes(payload).decode() if isinstance(payload, bytes | bytearray) else ""
            instance = json.loads(text).get("instance") if text else None
        except (ValueError, AttributeError):
            instance = None
        if instance == self._instance:
            return True
        if first and not own_seen:
            return False
        raise self._taken_over("its lease is held by another instance")

    async def _consume(
        self,
        client: aiomqtt.Client,
        held: list[aiomqtt.Message],
        *,
        first: bool,
        confirmed: bool,
    ) -> None:
        """Apply the batches of one connection; none before the lease is confirmed (they
        wait in ``held``, unacknowledged)."""
        lease = lease_topic(self.config.deployment)
        paho_client = client._client
        messages = client.messages
        deadline = time.monotonic() + self.config.lease_timeout
        own_seen = False  # our claim came back on this connection
        while True:
            if confirmed:
                message = await anext(messages)
            else:
                try:
                    # Not asyncio.wait_for: cancelled here (a stop right after the start),
                    # it never returned (Python 3.11, aiomqtt 2; tests/aggregator/
                    # test_service.py, a stop before the lease claim came back).
                    async with asyncio.timeout(max(0.0, deadline - time.monotonic())):
                        message = await anext(messages)
                except TimeoutError:
                    logger.warning(
                        "no claim on %s came back within %g s; applying batches without the "
                        "lease (only a DISCONNECT 0x8E can now show a takeover)",
                        lease,
                        self.config.lease_timeout,
                    )
                    confirmed = True
                    for waiting in held:
                        await self._on_message(paho_client, waiting)
                    held.clear()
                    continue
            if message.topic.matches(lease):
                if message.qos > 0:
                    paho_client.ack(message.mid, message.qos)
                if self._lease_verdict(message, first=first, own_seen=own_seen):
                    own_seen = confirmed = True
                    for waiting in held:
                        await self._on_message(paho_client, waiting)
                    held.clear()
            elif confirmed:
                await self._on_message(paho_client, message)
            else:
                held.append(message)

    async def _mqtt_loop(self) -> None:
        delay = self.config.reconnect_min
        topic = topics.batches_topic(self.config.deployment)
        client_id = self.config.mqtt_client_id
        while True:
            client = self._client()
            paho_client = client._client
            held: list[aiomqtt.Message] = []
            try:
                async with client:
                    first = self.connections == 0
                    confirmed = not await self._claim_lease(client, first=first)
                    await client.subscribe(topic, qos=1)
                    self.connections += 1
                    self._set_subscribed(True)
                    logger.info(
                        "subscribed to %s at %s as %s", topic, self.config.broker, client_id
                    )
                    delay = self.config.reconnect_min
                    try:
                        await self._consume(client, held, first=first, confirmed=confirmed)
                    except asyncio.CancelledError:
                        # Shutdown: checkpoint and send the PUBACKs while still connected.
                        self._count_unacknowledged("unprocessed", len(client.messages) + len(held))
                        await asyncio.shield(self.checkpoint())
                        raise
            except aiomqtt.MqttError as exc:
                if _session_taken_over(exc):
                    raise self._taken_over("the broker said so, reason 0x8E") from None
                logger.warning("broker connection lost (%s); reconnecting in %.2f s", exc, delay)
            finally:
                self._set_subscribed(False)
                if self._lease_fallback is not None:
                    self._lease_fallback.cancel()
                    self._lease_fallback = None
                # PUBACKs cannot cross connections; the broker redelivers those batches and
                # the seen ids turn them into acknowledged duplicates.
                lost = [p for p in self._pending if p[0] is paho_client]
                if lost:
                    reason = "taken_over" if self._abandoned else "connection_lost"
                    self._count_unacknowledged(reason, len(lost))
                    self._pending = [p for p in self._pending if p[0] is not paho_client]
            await asyncio.sleep(delay * random.uniform(0.5, 1.0))
            delay = min(2 * delay, self.config.reconnect_max)

    def _count_unacknowledged(self, reason: str, count: int) -> None:
        assert reason in UNACKED_REASONS
        if count <= 0:
            return
        unacked = self.counters.unacknowledged
        unacked[reason] = unacked.get(reason, 0) + count
        self.metrics.unacknowledged.labels(reason=reason).inc(count)
        self._dirty = True
        self._unpublished = True
        logger.info(
            "%d batches left unacknowledged (%s); the broker redelivers them", count, reason
        )

    async def _on_message(self, paho_client: paho.Client, message: aiomqtt.Message) -> None:
        payload = message.payload
        data = bytes(payload) if isinstance(payload, bytes | bytearray) else b""
        await self.handle_batch(data)
        if message.qos > 0:
            self._pending.append((paho_client, message.mid, message.qos))
        if self.config.checkpoint is None:
            self._flush_acks(list(self._pending))
        elif len(self._pending) >= self.config.max_unacked:
            await self.checkpoint()

    async def handle_batch(self, payload: bytes) -> str:
        """Verify, check and apply one sealed batch (``batch || signature``); returns
        ``"applied"``, ``"duplicate"`` or the reject reason."""
        self._bind_loop()
        try:
            batch = await self._check(payload)
        except _RejectedError as rejected:
            self._reject(rejected)
            return rejected.reason
        if batch is None or batch[0] in self._seen:
            self.counters.duplicates += 1
            self.metrics.duplicates.inc()
            self._dirty = True
            self._unpublished = True
            if _is_power_of_two(self.counters.duplicates - self._run_start.duplicates):
                logger.info(
                    "ignored a redelivered batch (%d so far this run; "
                    "coco_aggregator_batches_duplicate_total)",
                    self.counters.duplicates - self._run_start.duplicates,
                )
            return "duplicate"
        batch_id, round_, partial = batch
        if self._stale(round_):  # the horizon cannot move during _check; cheap to be sure
            self._reject(_RejectedError("stale_round", partial.n))
            return "stale_round"
        # From here to the end, no await: the sums and the id change together.
        self.state.merge(partial)
        self._remember(batch_id, round_)
        size = partial.n
        self.counters.reports += size
        self.counters.batches += 1
        self.metrics.reports.inc(size)
        self.metrics.batches.inc()
        self.smallest_batch = (
            size if self.smallest_batch is None else min(self.smallest_batch, size)
        )
        self.latest_batch = size
        self.last_batch_timestamp = time.time()
        self.metrics.last_batch.set(self.last_batch_timestamp)
        self.ledger.record(size)
        self._privacy_settled.clear()
        self._privacy_dirty.set()
        self._dirty = True
        self._unpublished = True  # published on the next interval, scrape or request
        return "applied"

    def _reject(self, rejected: _RejectedError) -> None:
        reason = rejected.reason
        count = self.counters.rejected.get(reason, 0) + 1
        self.counters.rejected[reason] = count
        self.metrics.rejected.labels(reason=reason).inc()
        if rejected.reports:
            reports = self.counters.rejected_reports
            reports[reason] = reports.get(reason, 0) + rejected.reports
            self.metrics.rejected_reports.labels(reason=reason).inc(rejected.reports)
        self._dirty = True
        self._unpublished = True
        if _is_power_of_two(count - self._run_start.rejected.get(reason, 0)):
            # 1st, 2nd, 4th, 8th... of a reason this run: a flood cannot flood the log
            logger.warning(
                "rejected a batch: %s (%d so far; coco_aggregator_batches_rejected_total)",
                reason,
                count,
            )

    def _stale(self, round_: int) -> bool:
        oldest = self.oldest_retained_round
        return oldest is not None and round_ < oldest

    def _future(self, round_: int) -> bool:
        round_seconds = self.config.round_seconds
        if round_seconds is None:
            return False
        try:
            now = current_round(round_seconds)
        except ClockError:  # a clock that is not set cannot judge
            return False
        return round_ > now + self.config.retention_rounds

    async def _check(self, payload: bytes) -> tuple[bytes, int, AggregateState] | None:
        """``(batch_id, round, partial sums)`` of a batch to apply, ``None`` for one already
        applied; :class:`_RejectedError` otherwise. The signature comes first: nothing of an
        unverified message is read."""
        try:
            inner = self.verifier.open(payload)
        except BatchAuthError as exc:
            raise _RejectedError(exc.reason) from None
        try:
            fingerprint, round_, batch_id, seeds, z = decode_batch_arrays(inner)
        except CodecError as exc:
            raise _RejectedError(exc.reason) from None
        size = int(seeds.size)
        if fingerprint != self.spec.fingerprint_int:
            raise _RejectedError("fingerprint_mismatch", size)
        if size == 0:
            raise _RejectedError("empty")
        if size < self.min_batch:
            raise _RejectedError("below_min_batch", size)
        if self._stale(round_):
            raise _RejectedError("stale_round", size)
        if self._future(round_):
            raise _RejectedError("future_round", size)
        if batch_id in self._seen:
            return None
        partial = AggregateState(self.spec)
        try:
            if size * self.spec.d <= INLINE_ELEMENTS:  # less than a thread hand-off costs
                partial.add(seeds, z)
            else:
                await asyncio.to_thread(partial.add, seeds, z)  # numpy releases the GIL
        except ReportError as exc:
            raise _RejectedError(exc.reason, size) from None
        return batch_id, round_, partial

    def _remember(self, batch_id: bytes, round_: int) -> None:
        self._seen[batch_id] = round_
        self._rounds.setdefault(round_, []).append(batch_id)
        if self.newest_round is None or round_ > self.newest_round:
            self.newest_round = round_
            self._evict()

    def _evict(self) -> None:
        """Forget the ids of rounds below the horizon (those batches are now stale)."""
        oldest = self.oldest_retained_round
        if oldest is None:
            return
        for round_ in [r for r in self._rounds if r < oldest]:
            for batch_id in self._rounds.pop(round_):
                self._seen.pop(batch_id, None)

    def _set_subscribed(self, subscribed: bool) -> None:
        if subscribed:
            self.subscribed.set()
        else:
            self.subscribed.clear()
        self._document = {**self._document, "subscribed": subscribed}

    def _bind_loop(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._loop_thread = threading.get_ident()

    def _refresh(self) -> None:
        """Bring the estimates, gauges and ``/estimates`` up to date, from any thread.

        The privacy level: while the privacy loop runs (:meth:`run`) a request is served at
        once with the level computed so far (``batches_accounted``). Without it (batches
        handed in directly, or after the service stopped) a request accounts for what is
        missing itself, in the requesting thread, but never on the event loop of a service
        that is entered. Then: on the event loop's thread, publish now; from another thread
        (the HTTP server, or a caller with no running loop), publish on the event loop if
        it runs (the state is the loop's, waiting up to :data:`REQUEST_WAIT`), else here.
        """
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            on_a_loop = False
        else:
            on_a_loop = True
        if (
            not self._privacy_running
            and not self._privacy_settled.is_set()
            and not (on_a_loop and self._entered)
        ):
            try:  # in the accountant's process, where its caches are; waits at most
                # LEVEL_WAIT, then serves the last level (the computation goes on)
                level = accountant_process.level_now(
                    self.spec, self.config.delta, self.ledger.snapshot()
                )
            except ACCOUNTING_ERRORS:
                logger.exception("cannot compute the central privacy level; serving the last")
            else:
                if level is not None:
                    self._adopt(level)
        if on_a_loop:
            self._publish()
            return
        loop = self._loop
        if loop is None or not loop.is_running() or self._loop_thread == threading.get_ident():
            self._publish()
            return
        done = threading.Event()

        def publish() -> None:
            try:
                self._publish()
            finally:
                done.set()

        try:
            loop.call_soon_threadsafe(publish)
        except RuntimeError:  # the loop closed meanwhile: serve what was published
            return
        done.wait(REQUEST_WAIT)

    def _publish(self) -> None:
        """Rebuild the estimates, the gauges and the ``/estimates`` document (a new dict: the
        HTTP thread reads the old one whole) if anything changed. O(d) plus at most
        :data:`MAX_METRICS_DIMS` gauges: on an interval, on request, never per batch. The
        central epsilons are the privacy ledger's latest level (computed in the
        accountant's process, :meth:`_privacy_loop`), each shown only while its batch size
        is still the current smallest or latest one."""
        if not self._unpublished:
            return
        self._unpublished = False  # before reading: a change from another thread re-marks it
        estimates = self.state.estimate(confidence=self.config.confidence)
        self.metrics.set_estimates(estimates)
        level = self._privacy.for_sizes(smallest=self.smallest_batch, latest=self.latest_batch)
        self.metrics.set_epsilon(**level.epsilon_central)
        self.metrics.set_epsilon_generic(**level.epsilon_central_generic)
        self.metrics.set_epsilon_total(level.epsilon_total)
        self.metrics.set_batch_size(smallest=self.smallest_batch, latest=self.latest_batch)
        self.metrics.set_retention(
            retained_ids=len(self._seen), oldest_round=self.oldest_retained_round
        )
        self._document = {
            "deployment": self.config.deployment,
            "spec": self.spec.to_dict(),
            "n": self.state.n,
            "estimates": estimates.to_dict(),
            "epsilon_local": self.spec.epsilon,
            **level.to_dict(),
            "batch_size": {"smallest": self.smallest_batch, "latest": self.latest_batch},
            "min_batch": self.min_batch,
            "delta": self.config.delta,
            "last_batch_timestamp": self.last_batch_timestamp,
            "subscribed": self.subscribed.is_set(),
            "counters": self.counters.to_dict(),
            "retention": self._retention_dict(),
        }

    @property
    def privacy(self) -> PrivacyLevel:
        """The central privacy level last computed (its ``batches`` says how many batches
        it covers; it trails the applied batches by one computation)."""
        return self._privacy

    def _retention_dict(self) -> dict[str, Any]:
        return {
            "rounds": self.config.retention_rounds,
            "newest_round": self.newest_round,
            "oldest_round": self.oldest_retained_round,
            "batch_ids": len(self._seen),
        }

    def _flush_acks(self, pending: list[tuple[paho.Client, int, int]]) -> None:
        for paho_client, mid, qos in pending:
            paho_client.ack(mid, qos)  # an error means the connection is gone: redelivered
        done = {id(p) for p in pending}
        self._pending = [p for p in self._pending if id(p) not in done]

    # -- checkpoints -----------------------------------------------------------------------

    def _checkpoint_snapshot(self) -> dict[str, Any]:
        """Copies of everything a checkpoint holds, taken with no await (O(d) for the sums,
        O(retained ids) for the ids; serialised later, in a thread)."""
        return {
            "version": CHECKPOINT_VERSION,
            "fingerprint": self.spec.fingerprint,
            "deployment": self.config.deployment,
            "delta": self.config.delta,
            "state": self.state.copy(),
            "batch_rounds": {r: tuple(ids) for r, ids in self._rounds.items()},
            "retention_rounds": self.config.retention_rounds,
            "counters": self.counters.to_dict(),
            "smallest_batch": self.smallest_batch,
            "latest_batch": self.latest_batch,
            "batch_sizes": {str(n): count for n, count in self.ledger.sizes.items()},
            "last_batch_timestamp": self.last_batch_timestamp,
            "written_at": time.time(),
        }

    async def checkpoint(self) -> None:
        """Write the checkpoint (if configured and anything changed), then send the PUBACKs
        of the batches it covers."""
        async with self._checkpoint_lock:
            if self._abandoned:
                return
            path = self.config.checkpoint
            pending = list(self._pending)
            if path is None:
                self._flush_acks(pending)
                return
            if self._dirty:
                # Snapshot and pending list are taken together, with no await in between.
                snapshot = self._checkpoint_snapshot()
                self._dirty = False
                write = asyncio.ensure_future(asyncio.to_thread(write_checkpoint, path, snapshot))
                try:
                    await asyncio.shield(write)
                except asyncio.CancelledError:
                    # A thread cannot be cancelled: keep the lock until the file is complete,
                    # so the final checkpoint of a shutdown neither races this write nor
                    # skips a write that failed.
                    await asyncio.wait([write])
                    if write.exception() is not None:
                        self._dirty = True
                    raise
                except (OSError, ValueError):
                    self._dirty = True
                    logger.exception(
                        "cannot write checkpoint %s; batches stay unacknowledged", path
                    )
                    return
                logger.debug("checkpoint written: n=%d", snapshot["counters"]["reports"])
            self._last_checkpoint = time.monotonic()
            self._flush_acks(pending)

    async def _checkpoint_loop(self) -> None:
        interval = self.config.checkpoint_interval
        while True:
            await asyncio.sleep(max(0.0, self._last_checkpoint + interval - time.monotonic()))
            if time.monotonic() - self._last_checkpoint >= interval:
                await self.checkpoint()

    def _restore(self, checkpoint: Checkpoint) -> None:
        path = checkpoint.path
        if checkpoint.fingerprint != self.spec.fingerprint:
            raise CheckpointError(
                f"checkpoint {path} is for spec {checkpoint.fingerprint}, not "
                f"{self.spec.fingerprint}; move it away or run with its spec"
            )
        if checkpoint.state.spec.canonical() != self.spec.canonical():
            raise CheckpointError(f"checkpoint {path}: field 'state' is for another spec")
        self.state = checkpoint.state
        self._seen.clear()
        self._rounds.clear()
        self.newest_round = None
        for round_, ids in sorted(checkpoint.batch_rounds.items()):
            for batch_id in ids:
                self._remember(batch_id, round_)
        restored = checkpoint.counters
        self.counters = restored
        self.smallest_batch = checkpoint.smallest_batch
        self.latest_batch = checkpoint.latest_batch
        self.ledger.restore(checkpoint.batch_sizes, checkpoint.latest_batch)
        self.last_batch_timestamp = checkpoint.last_batch_timestamp
        self.metrics.reports.inc(restored.reports)
        self.metrics.batches.inc(restored.batches)
        self.metrics.duplicates.inc(restored.duplicates)
        for reason, count in restored.rejected.items():
            self.metrics.rejected.labels(reason=reason).inc(count)
        for reason, count in restored.rejected_reports.items():
            self.metrics.rejected_reports.labels(reason=reason).inc(count)
        for reason, count in restored.unacknowledged.items():
            self.metrics.unacknowledged.labels(reason=reason).inc(count)
        if self.last_batch_timestamp is not None:
            self.metrics.last_batch.set(self.last_batch_timestamp)
        if checkpoint.version == 1:
            self._dirty = True  # rewrite it as the current version
            logger.info("checkpoint %s is version 1: its unsigned batch ids are dropped", path)
        logger.info(
            "resumed from %s: n=%d, %d batches, %d batch ids of rounds %s..%s",
            path,
            self.state.n,
            restored.batches,
            len(self._seen),
            self.oldest_retained_round,
            self.newest_round,
        )


async def run_aggregator(
    config: AggregatorConfig, *, registry: CollectorRegistry | None = None
) -> None:
    """``async with Aggregator(config) as agg: await agg.run()``."""
    async with Aggregator(config, registry=registry) as aggregator:
        await aggregator.run()
