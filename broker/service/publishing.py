"""The shuffler's publishing connection (aiomqtt): the outbox's batches and manifests,
in release order, each removed from the log once the broker acknowledged it."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
import time

import aiomqtt
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from broker.core.effects import is_manifest
from broker.core.machine import (
    Acked,
    batch_count_of,
    batch_id_of,
    batch_round_of,
)
from broker.service.shell import ShellState
from broker.store.wal import LogFullError

logger = logging.getLogger("broker.shuffler")


class PublishMixin(ShellState):
    """The publishing part of :class:`broker.service.shuffler.Shuffler`."""

    # --- publishing (aiomqtt) -----------------------------------------------------------

    def _make_client(self) -> aiomqtt.Client:
        """The publishing connection: clean start, its own client id, no subscription."""
        cfg = self.config
        tls_context = ssl.create_default_context(cafile=cfg.ca_file) if self._tls else None
        session: dict[str, object]
        if self._version == "3.1.1":
            session = {"protocol": aiomqtt.ProtocolVersion.V311, "clean_session": True}
        else:
            properties = Properties(PacketTypes.CONNECT)  # type: ignore[no-untyped-call]
            properties.SessionExpiryInterval = 0
            session = {
                "protocol": aiomqtt.ProtocolVersion.V5,
                "clean_start": True,
                "properties": properties,
            }
        return aiomqtt.Client(
            self._nodes.current.host,
            self._nodes.current.port,
            username=cfg.username,
            password=cfg.password,
            identifier=f"{cfg.ingest_client_id}-out",
            tls_context=tls_context,
            timeout=cfg.publish_timeout,
            **session,  # type: ignore[arg-type]
        )

    async def _connection_loop(self) -> None:
        """Keep the publishing connection up until closing."""
        backoff = self.config.reconnect_min
        while not self._closing.is_set():
            try:
                await self._negotiated()
                async with self._make_client() as client:
                    self._client = client
                    self._publisher_ready.set()
                    backoff = self.config.reconnect_min
                    await self._watch_publisher(client)
                    return
            except (aiomqtt.MqttError, OSError, TimeoutError) as exc:
                self._nodes.failed()  # a cluster's next node (the lost one may have died)
                logger.warning(
                    "broker %s: publishing connection lost or refused (%s); retry in %.1f s",
                    self.config.broker,
                    exc,
                    backoff,
                )
            finally:
                self._client = None
                self._publisher_ready.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._closing.wait(), backoff)
            backoff = min(backoff * 2, self.config.reconnect_max)

    async def _watch_publisher(self, client: aiomqtt.Client) -> None:
        """Until closing; raises :class:`aiomqtt.MqttError` when the connection is lost.

        The connection subscribes to nothing, yet a broker may deliver a message on it: the
        embedded amqtt broker of ``coco demo`` once delivered the aggregator's retained
        lease to it. Such a message is ignored (counted in the log, its topic never shown:
        a topic can name a device), not taken for the end of the connection, which would
        have stopped publishing for good (a demo run released 3,000 reports and published
        none)."""
        closing = asyncio.ensure_future(self._closing.wait())
        stray = 0
        try:
            while not closing.done():
                lost = asyncio.ensure_future(anext(aiter(client.messages)))
                try:
                    await asyncio.wait({closing, lost}, return_when=asyncio.FIRST_COMPLETED)
                finally:
                    if not lost.done():
                        lost.cancel()
                if lost.done() and not lost.cancelled():
                    lost.result()  # raises MqttError on a lost connection
                    stray += 1
                    if stray & (stray - 1) == 0:  # 1, 2, 4, ...
                        logger.info(
                            "ignored %d message(s) the broker delivered on the publishing "
                            "connection, which subscribes to nothing",
                            stray,
                        )
        finally:
            closing.cancel()

    async def _publish_loop(self) -> None:
        while True:
            outbox = [m for m in self.core.outbox() if batch_id_of(m) not in self._unlogged_acks]
            if not outbox:
                self._outbox_changed.clear()
                await self._outbox_changed.wait()
                continue
            await self._publisher_ready.wait()
            client = self._client
            if client is None:
                await asyncio.sleep(self.config.reconnect_min)
                continue
            message = outbox[0]
            try:
                await client.publish(
                    self._manifests if is_manifest(message) else self._batches,
                    message,
                    qos=self.config.qos,
                    timeout=self.config.publish_timeout,
                )
            except aiomqtt.MqttError as exc:
                logger.warning("batch publish failed (%s); will retry", exc)
                await asyncio.sleep(self.config.reconnect_min)
                continue
            self._on_batch_acked(message)

    def _on_batch_acked(self, message: bytes) -> None:
        batch_id = batch_id_of(message)
        try:
            self._commit([Acked(batch_id)])
        except LogFullError as exc:  # published; its Acked is written once there is space
            self._unlogged_acks[batch_id] = message
            self._pause(exc)
            return
        except OSError as exc:
            self._fail(exc)
            return
        self._count_ack(batch_id, message)

    def _count_ack(self, batch_id: bytes, message: bytes | None = None) -> None:
        message = message or self._unlogged_acks[batch_id]
        if is_manifest(message):
            self.metrics.manifests_published.inc()
            self._outbox_changed.set()
            return
        count = batch_count_of(message)
        round_ = batch_round_of(message)
        self.metrics.batches_released.inc()
        self.metrics.reports_released.inc(count)
        self.metrics.batch_size.observe(count)
        end = (round_ + 1) * self.config.round_seconds
        self.metrics.release_latency.observe(max(time.time() - end, 0.0))
        self._outbox_changed.set()
