"""What the parts of the shuffler's shell share: the attributes of
:class:`broker.service.shuffler.Shuffler` and the methods one part calls in another, declared once
so that each part (:mod:`broker.service.ingesting`, :mod:`broker.service.publishing`,
:mod:`broker.service.sharding`) type-checks on its own."""

from __future__ import annotations

import asyncio
import random

import aiomqtt

from broker.core.machine import BatchMaker, Effect, ShufflerCore
from broker.service.config import ShufflerConfig
from broker.service.ingest import GroupCommit
from broker.service.lease import ShardControl
from broker.service.metrics import ShufflerMetrics
from broker.store.wal import EffectLog, StateDir
from edge.batch_auth import BatchSigner
from edge.mqtt_url import BrokerList
from edge.mqtt_version import Negotiated
from edge.shards import ShardLayout, ShardPlan

__all__ = ["ShellState"]


class ShellState:
    """Attributes and cross-part methods of the shuffler's shell (set in its __init__)."""

    config: ShufflerConfig
    metrics: ShufflerMetrics
    core: ShufflerCore
    signer: BatchSigner | None
    failure: BaseException | None
    retired: bool
    _nodes: BrokerList
    """The broker's nodes (``--broker``, one URL or a cluster's list): every connection is
    made to the current one, and a lost or refused connection moves to the next."""
    _tls: bool
    _ingress: str
    _ingress_prefix: str
    _batches: str
    _manifests: str
    _plan: ShardPlan | None
    _layout: ShardLayout | None
    _shard_index: int
    _serves: dict[int, bool]
    _generations_seen: set[int]
    """The layouts' generations this shuffler knows (at start, or announced since)."""
    _control: ShardControl | None
    _owner: str
    _random: random.SystemRandom
    _lock: asyncio.Lock
    _state: StateDir | None
    _log: EffectLog | None
    _compacted_size: int
    _group: GroupCommit | None
    _token_key: bytes
    _recovered: bool
    _version: Negotiated | None
    _outbox_changed: asyncio.Event
    _client: aiomqtt.Client | None
    _connected: asyncio.Event
    _publisher_ready: asyncio.Event
    _stop_requested: asyncio.Event
    _consumption_done: asyncio.Event
    _closing: asyncio.Event
    _subscribed_at: float | None
    _had_session: bool
    _session_present: bool
    _late_offers: int
    _last_late: float
    _backlog_drained: float | None
    _paused: asyncio.Event
    _unlogged_acks: dict[bytes, bytes]

    def stop(self) -> None:
        raise NotImplementedError

    def _commit(self, effects: list[Effect], *, compact: bool = True) -> None:
        raise NotImplementedError

    def _settle(self) -> None:
        raise NotImplementedError

    def _maker(self) -> BatchMaker:
        raise NotImplementedError

    def _fail(self, exc: BaseException) -> None:
        raise NotImplementedError

    def _pause(self, exc: BaseException) -> None:
        raise NotImplementedError

    async def _negotiated(self) -> Negotiated:
        raise NotImplementedError

    def _on_announcement(self, announcement: dict[str, object]) -> None:
        raise NotImplementedError
