"""The shard lease: one shuffler per shard, and the announcement watched while it runs.

A sharded shuffler (``coco shuffler --shard g0s1``) holds a retained lease on
``coco/v1/<dep>/shards/<label>/lease`` (DESIGN D5); an unsharded deployment is one shard
whose lease is ``coco/v1/<dep>/shards/-/lease``, held by the shuffler of a state directory
(one without, in-process only, takes none: it has no persistent owner)::

    {"instance": <random, this process>, "owner": <the state directory's id>,
     "renewed": <unix time>, "ttl": <seconds>}

* **acquire** (before the ingest subscribes): read the retained lease from a fresh
  subscription; another owner's lease renewed less than ``ttl`` ago refuses the start (one
  line naming the shard and the owner); the same owner (a restart of the same state
  directory) takes over at once; a stale lease may be taken. Where the deployment's
  announcement is retained (``announced``), the read subscribes to it too: a node that
  delivers neither within ``settle`` seconds serves no retained messages yet (a NATS node
  just restarted), so its silence is not taken for "no lease" and the claim goes to the
  next node (:class:`LeaseUnconfirmedError`) instead of over a running owner. The claim is
  published, the claimant waits ``settle`` seconds, then re-reads the retained value from
  another fresh subscription: only the process whose instance is there goes on (two claims
  that raced: the broker kept one);
* **hold**: renew every ``ttl / 3``, and watch the topic: a claim by another instance means
  another process took the shard over (a restart of this state directory elsewhere, or a
  stale lease taken): this one stops at once. A lease of another instance renewed *before*
  this one's claim, of the same owner or already stale then, is not a claim: it is a late
  copy of the value this claim replaced (a NATS node delivered the previous instance's
  last renewal 0.4 s after a restarted shuffler had acquired the shard, which then
  stopped); it is logged and ignored. Hosts' clocks must agree to well within ``ttl``;
* **release** (a retired shard only): a lease with ``ttl`` 0, free for anyone.

The same connection watches the retained announcement, so a reshard announced while the
shuffler runs reaches it (:attr:`ShardControl.on_announcement`). The lease works on MQTT
3.1.1 as on 5: it needs only retained QoS 1 messages, no session takeover signal.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import secrets
import ssl
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import aiomqtt
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from edge.announce import decode_announcement
from edge.announcement_reader import NODE_WAIT
from edge.errors import CocoError
from edge.mqtt_url import BrokerList
from edge.topics import shard_lease_topic, spec_topic

__all__ = ["Lease", "LeaseLostError", "LeaseRefusedError", "LeaseUnconfirmedError", "ShardControl"]

logger = logging.getLogger("broker.lease")  # a fixed name: broker/__init__.py, "Loggers"


class LeaseRefusedError(CocoError):
    """Another shuffler holds the shard (a fresh lease of another owner), or won the race."""


class LeaseUnconfirmedError(CocoError):
    """The broker node kept no lease at all after the claim: a node that does not serve its
    retained messages yet (a NATS node just restarted), or an ACL that drops the lease
    topic. The shuffler tries the next node (:mod:`broker.service.sharding`)."""


class LeaseLostError(CocoError):
    """Another process claimed the shard while this one held it."""


@dataclass(frozen=True)
class Lease:
    owner: str
    instance: str
    renewed: float
    ttl: float

    def encode(self) -> bytes:
        return json.dumps(
            {
                "instance": self.instance,
                "owner": self.owner,
                "renewed": self.renewed,
                "ttl": self.ttl,
            },
            sort_keys=True,
            separators=(",", ":"),
        ).encode()

    @classmethod
    def decode(cls, payload: bytes) -> Lease | None:
        """The lease in ``payload``, or ``None`` for anything else (an empty retained
        message, garbage: both count as no lease, never as a reason to crash)."""
        try:
            data = json.loads(payload)
            return cls(
                owner=str(data["owner"]),
                instance=str(data["instance"]),
                renewed=float(data["renewed"]),
                ttl=float(data["ttl"]),
            )
        except (ValueError, KeyError, TypeError):
            return None

    def fresh(self, now: float) -> bool:
        return now - self.renewed < self.ttl


class ShardControl:
    """Acquire, hold and release one shard's lease; watch the announcement (module docs)."""

    def __init__(
        self,
        *,
        nodes: BrokerList,
        tls: bool,
        ca_file: str | None,
        username: str | None,
        password: str | None,
        client_id: str,
        deployment: str,
        shard: str | None,
        owner: str,
        ttl: float = 30.0,
        settle: float = 1.0,
        mqtt5: bool = True,
        timeout: float = 10.0,
        announced: bool = False,
    ) -> None:
        self._nodes = nodes
        self._tls = ssl.create_default_context(cafile=ca_file) if tls else None
        self._username, self._password = username, password
        self._client_id = client_id
        self.topic = shard_lease_topic(deployment, shard)
        self._spec = spec_topic(deployment)
        self.shard = shard
        self.name = f"deployment {deployment} (unsharded)" if shard is None else f"shard {shard}"
        """What the log lines and errors call the lease's shard."""
        self.owner = owner
        self.instance = secrets.token_hex(8)
        self.ttl = ttl
        self.settle = settle
        self.mqtt5 = mqtt5
        self.timeout = timeout
        self.announced = announced
        """The deployment's announcement is retained: a node must deliver it with the lease
        for its "no lease" to be believed (module docs)."""
        self.on_announcement: Callable[[dict[str, Any]], None] | None = None
        self.claimed_at: float | None = None
        """``renewed`` of this instance's first claim (``acquire``): a lease of another
        instance renewed before it is a late copy, not a takeover (module docs)."""

    def _client(self, identifier: str | None) -> aiomqtt.Client:
        kwargs: dict[str, Any] = {}
        if self.mqtt5:
            kwargs["protocol"] = aiomqtt.ProtocolVersion.V5
            properties = Properties(PacketTypes.CONNECT)  # type: ignore[no-untyped-call]
            properties.SessionExpiryInterval = 0
            kwargs["properties"] = properties
            kwargs["clean_start"] = True
        else:
            kwargs["protocol"] = aiomqtt.ProtocolVersion.V311
            kwargs["clean_session"] = True
        return aiomqtt.Client(
            self._nodes.current.host,
            self._nodes.current.port,
            username=self._username,
            password=self._password,
            identifier=identifier,
            tls_context=self._tls,
            timeout=self.timeout,
            **kwargs,
        )

    async def read(self) -> Lease | None:
        """The retained lease, from a fresh subscription (``None``: none within
        ``settle`` seconds, or not a lease). With ``announced``, :class:`LeaseUnconfirmedError`
        when the node delivered neither the lease nor the announcement (module docs).

        The lease is subscribed first: a node that holds both retained messages sends the
        lease before the announcement, so an announcement with no lease before it means
        there is none. A node is given :data:`NODE_WAIT` seconds (at least ``settle``) to
        deliver the announcement, as the announcement reader gives it: a just-restarted NATS
        node may take that long to serve its retained messages."""
        heard_announcement = False
        patience = max(self.settle, NODE_WAIT) if self.announced else self.settle
        loop = asyncio.get_running_loop()
        async with self._client(None) as client:
            await client.subscribe(self.topic, qos=1)
            if self.announced:
                await client.subscribe(self._spec, qos=1)
            settled = loop.time() + self.settle
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(patience) as deadline:
                    async for message in client.messages:
                        if message.topic.matches(self._spec):
                            heard_announcement = True
                            deadline.reschedule(max(settled, loop.time()))
                            continue
                        payload = message.payload
                        if isinstance(payload, bytes | bytearray):
                            return Lease.decode(bytes(payload))
        if self.announced and not heard_announcement:
            raise LeaseUnconfirmedError(
                f"{self.name}: the node delivered neither the lease nor the retained "
                f"announcement within {patience:g} s (it serves no retained messages yet): "
                "its silence is not taken for a free shard"
            )
        return None

    async def _claim(self, client: aiomqtt.Client, ttl: float | None = None) -> None:
        lease = Lease(self.owner, self.instance, time.time(), self.ttl if ttl is None else ttl)
        if self.claimed_at is None:
            self.claimed_at = lease.renewed
        await client.publish(self.topic, lease.encode(), qos=1, retain=True)

    async def acquire(self) -> None:
        """Claim the shard or raise :class:`LeaseRefusedError` (module docs)."""
        current = await self.read()
        now = time.time()
        if current is not None and current.owner != self.owner and current.fresh(now):
            raise LeaseRefusedError(
                f"{self.name} is held by another shuffler (state directory id "
                f"{current.owner}, renewed {now - current.renewed:.0f} s ago, ttl "
                f"{current.ttl:g} s): refusing to start; stop it, or wait until its lease "
                "expires"
            )
        async with self._client(None) as client:
            await self._claim(client)
        await asyncio.sleep(self.settle)
        again = await self.read()
        if again is None:
            raise LeaseUnconfirmedError(
                f"{self.name}: the broker kept no lease after the claim (a node that does not "
                "serve retained messages yet, or an ACL without the lease topic)"
            )
        if self._late_copy(again):
            raise LeaseUnconfirmedError(
                f"{self.name}: the broker still served a lease renewed before the claim (a "
                "node behind the cluster's retained messages)"
            )
        if again.instance != self.instance:
            raise LeaseRefusedError(
                f"{self.name}: another shuffler claimed it at the same moment and "
                f"the broker kept its claim ({again.owner}): refusing to start"
            )
        logger.info("%s: lease acquired (ttl %g s)", self.name, self.ttl)

    async def hold(self, stop: asyncio.Event) -> None:
        """Renew the lease and watch it (and the announcement) until ``stop``; raises
        :class:`LeaseLostError` when another instance claims the shard."""
        backoff = 0.5
        while not stop.is_set():
            try:
                async with self._client(f"{self._client_id}-lease") as client:
                    await client.subscribe(self.topic, qos=1)
                    await client.subscribe(self._spec, qos=1)
                    backoff = 0.5
                    await self._watch(client, stop)
                    return
            except aiomqtt.MqttError as exc:
                self._nodes.failed()  # a cluster's next node (the lost one may have died)
                logger.warning("%s: lease connection lost (%s); retrying", self.name, exc)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), backoff)
            backoff = min(backoff * 2, 10.0)

    async def _watch(self, client: aiomqtt.Client, stop: asyncio.Event) -> None:
        """Renew every ``ttl / 3`` s and take what arrives meanwhile.

        One pending read of the messages at a time, never cancelled while the connection
        lives: a cancelled read can drop the message it had just taken (aiomqtt's iterator
        takes it off its queue before it returns), and the message it drops may be the
        announcement that ends this shard's rounds. And each renewal subscribes to the
        announcement again, so the broker sends the retained one anew (MQTT: a SUBSCRIBE
        that replaces a subscription re-sends the retained messages): an announcement whose
        live delivery was lost (seen on a NATS cluster: two of three shufflers never heard
        of a reshard, and never retired) arrives within one renewal. The same announcement
        again changes nothing (:meth:`broker.service.sharding.ShardMixin._set_plan` logs a
        change of the shard's last round only, and the layouts' warnings once each)."""
        renew_every = max(self.ttl / 3, 0.1)
        await self._claim(client)
        next_renewal = time.monotonic() + renew_every
        messages = aiter(client.messages)
        stopped = asyncio.ensure_future(stop.wait())
        message: asyncio.Future[aiomqtt.Message] | None = None
        try:
            while not stop.is_set():
                if message is None:
                    message = asyncio.ensure_future(anext(messages))
                wait = max(next_renewal - time.monotonic(), 0.0)
                either: set[asyncio.Future[Any]] = {stopped, message}
                await asyncio.wait(either, timeout=wait, return_when=asyncio.FIRST_COMPLETED)
                if message.done():
                    taken, message = message, None
                    self._received(taken.result())  # MqttError: the connection is lost
                if time.monotonic() >= next_renewal:
                    await self._claim(client)
                    await client.subscribe(self._spec, qos=1)
                    next_renewal = time.monotonic() + renew_every
        finally:
            stopped.cancel()
            if message is not None and not message.done():
                message.cancel()
                with contextlib.suppress(asyncio.CancelledError, aiomqtt.MqttError):
                    await message

    def _late_copy(self, lease: Lease) -> bool:
        """Another instance's lease renewed before this one's claim, of this owner (the
        previous process of the same state directory) or already stale at the claim (module
        docs). A lease of another owner still fresh at the claim is not one: this instance
        claimed over a live owner, and stops. Times of different hosts are compared, so
        their clocks must agree to well within ``ttl`` (NTP)."""
        claimed = self.claimed_at
        return (
            lease.instance != self.instance
            and claimed is not None
            and lease.renewed < claimed
            and (lease.owner == self.owner or not lease.fresh(claimed))
        )

    def _received(self, message: aiomqtt.Message) -> None:
        payload = message.payload
        if not isinstance(payload, bytes | bytearray):
            return
        if message.topic.matches(self._spec):
            if self.on_announcement is not None:
                try:
                    announcement = decode_announcement(bytes(payload))
                except (CocoError, ValueError) as exc:
                    logger.warning("an announcement that does not decode is ignored (%s)", exc)
                else:
                    self.on_announcement(announcement)
            return
        lease = Lease.decode(bytes(payload))
        if lease is None or lease.instance == self.instance:
            return
        if self._late_copy(lease):
            logger.info(
                "%s: a lease of another instance (state directory id %s) renewed before "
                "this one's claim arrived late: ignored",
                self.name,
                lease.owner,
            )
            return
        raise LeaseLostError(
            f"{self.name}: another shuffler (state directory id {lease.owner}) claimed it: stopping"
        )

    async def release(self) -> None:
        """A lease with ``ttl`` 0 (a retired shard, or a shuffler that stopped and keeps
        nothing: free for anyone)."""
        with contextlib.suppress(aiomqtt.MqttError, OSError):
            async with self._client(None) as client:
                await self._claim(client, ttl=0.0)
