"""The shuffler's ingest: the gmqtt connection with its persistent session, and the
checks of each report before the core sees it (topic, retain, codec, shard)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
import struct
import time

import gmqtt  # type: ignore[import-untyped]
from gmqtt.mqtt.constants import MQTTv50, MQTTv311  # type: ignore[import-untyped]

from broker.service.config import INGEST_MAX_PACKET
from broker.service.ingest import (
    MQTT_LOGGER,
    Acks,
    GroupCommit,
    IngestError,
    SessionTakenOverError,
    ack_after_handling,
)
from broker.service.shell import ShellState
from broker.store.wal import StoreError, token_of
from edge.codec import KIND_REPORT, REPORT_SIZE, VERSION, CodecError, decode_report
from edge.mqtt_version import Negotiated, negotiate
from edge.topics import MAX_NAME

# gmqtt reconnects by itself while ``failed_connections <= reconnect_retries`` (-1 means
# unlimited); -2 disables that, so the shuffler's own loop (backoff, metrics) is in charge.
_GMQTT_NO_AUTO_RECONNECT = -2
_GMQTT_KEEPALIVE = 60
_SESSION_TAKEN_OVER = 0x8E
_REPORT = struct.Struct(">2xIIIH")  # (version, kind,) fingerprint, round, seed, z
_QUICK_LOSS_SECONDS = 2.0
_QUICK_LOSSES = 3
"""A subscribed session lost within 2 s, three times in a row, means another client keeps
taking the client id over (Mosquitto 2.0 closes the old connection without a reason)."""


try:  # the C XXH32 (same values as edge.device.xxh32, the protocol's reference)
    from xxhash import xxh32_intdigest as _xxh32_c

    def xxh32(data: bytes, seed: int) -> int:
        return int(_xxh32_c(data, seed))
except ImportError:  # pragma: no cover
    from edge.device import xxh32


logger = logging.getLogger("broker.shuffler")


class IngestMixin(ShellState):
    """The ingest part of :class:`broker.service.shuffler.Shuffler`."""

    # --- ingest (gmqtt) -----------------------------------------------------------------

    async def _negotiated(self) -> Negotiated:
        """The MQTT version to speak, probed once for ``auto`` (raises ``OSError`` or
        ``TimeoutError`` while the broker cannot be reached: the callers retry)."""
        if self._version is None:
            tls = ssl.create_default_context(cafile=self.config.ca_file) if self._tls else None
            self._version = await negotiate(
                self.config.mqtt_version,
                self._nodes.current.host,
                self._nodes.current.port,
                tls=tls,
                timeout=self.config.publish_timeout,
            )
        return self._version

    def _make_gmqtt_client(self) -> gmqtt.Client:
        cfg = self.config
        kwargs: dict[str, object] = {}
        if self._version == "5":
            kwargs["session_expiry_interval"] = cfg.session_expiry
            kwargs["maximum_packet_size"] = INGEST_MAX_PACKET
        client = gmqtt.Client(
            cfg.ingest_client_id, clean_session=False, logger=MQTT_LOGGER, **kwargs
        )
        client.set_config({"reconnect_retries": _GMQTT_NO_AUTO_RECONNECT})
        if cfg.username is not None:
            client.set_auth_credentials(cfg.username, cfg.password)
        self._group = GroupCommit(client, self._flush_log, self._fail, self._pause)
        ack_after_handling(client, self._on_message, self._group)
        client.on_message = self._on_unacknowledged_message
        self._session_present = False
        client.on_connect = self._on_connack
        return client

    def _on_connack(self, _client: object, flags: object, _rc: object, _props: object) -> None:
        self._session_present = bool(flags)

    def _flush_log(self) -> None:
        """Settle and write what this read offered; raises if the state failed before (then
        nothing may be acknowledged)."""
        if self.failure is not None:
            raise OSError(f"the shuffler state failed earlier: {self.failure}")
        self._settle()

    def _gmqtt_ssl(self) -> ssl.SSLContext | bool:
        if not self._tls:
            return False
        return ssl.create_default_context(cafile=self.config.ca_file)

    async def _ingest_loop(self) -> None:
        """Receive reports, reconnecting with backoff, until consumption stops."""
        cfg = self.config
        backoff = cfg.reconnect_min
        first = True
        quick_losses = 0
        while not self._closing.is_set():
            if self._stop_requested.is_set():
                self._consumption_done.set()
                return
            if not first:
                self.metrics.reconnects.inc()
            first = False
            self._subscribed_at = None
            try:
                await self._ingest_session()
                if self._consumption_done.is_set():
                    return
                backoff = cfg.reconnect_min
            except SessionTakenOverError as exc:
                self._fail(exc)
                self._consumption_done.set()
                return
            except (OSError, TimeoutError, gmqtt.MQTTConnectError, IngestError) as exc:
                self._nodes.failed()  # a cluster's next node (the lost one may have died)
                subscribed = self._subscribed_at
                quick = (
                    subscribed is not None and time.monotonic() - subscribed < _QUICK_LOSS_SECONDS
                )
                quick_losses = quick_losses + 1 if quick else 0
                if quick_losses >= _QUICK_LOSSES:
                    self._fail(
                        SessionTakenOverError(
                            f"the session {cfg.ingest_client_id} at {cfg.broker} was lost "
                            f"{quick_losses} times within {_QUICK_LOSS_SECONDS:g} s of "
                            "subscribing: another client is using this client id (a second "
                            "shuffler for this deployment?)"
                        )
                    )
                    self._consumption_done.set()
                    return
                if not self._paused.is_set():
                    logger.warning(
                        "broker %s: connection lost or refused (%s); retry in %.1f s",
                        cfg.broker,
                        exc,
                        backoff,
                    )
            if self._stop_requested.is_set():
                self._consumption_done.set()
                return
            stop = asyncio.ensure_future(self._stop_requested.wait())
            try:
                await asyncio.wait({stop}, timeout=backoff)
                while self._paused.is_set() and not self._stop_requested.is_set():
                    await asyncio.wait({stop}, timeout=self.config.flush_interval)
            finally:
                stop.cancel()
            backoff = min(backoff * 2, cfg.reconnect_max)

    async def _ingest_session(self) -> None:
        """One gmqtt connection: subscribe, receive until stop or loss, disconnect.

        Every report is handled synchronously in gmqtt's read loop, in arrival order, and
        acknowledged after it is logged; the DISCONNECT at stop keeps the session, so the
        broker queues what arrives while the shuffler is away.
        """
        cfg = self.config
        await self._negotiated()
        client = self._make_gmqtt_client()
        acks = Acks(cfg.publish_timeout)
        client.on_subscribe = acks.on_ack
        client.on_disconnect = acks.on_disconnect
        version = MQTTv311 if self._version == "3.1.1" else MQTTv50
        try:
            async with asyncio.timeout(cfg.publish_timeout):
                await client.connect(
                    self._nodes.current.host,
                    self._nodes.current.port,
                    ssl=self._gmqtt_ssl(),
                    keepalive=_GMQTT_KEEPALIVE,
                    version=version,
                )
            if acks.lost.is_set():
                raise IngestError("connection lost")
            logger.info("connected to %s as %s", cfg.broker, cfg.ingest_client_id)
            # Retain As Published (MQTT 5): a report a device publishes with the retain
            # flag keeps it on the way here and is rejected (``retained``), as is a retained
            # report delivered on subscription (with either protocol version).
            codes = await acks.wait(
                client.subscribe(
                    self._ingress, qos=cfg.qos, retain_as_published=self._version == "5"
                )
            )
            if not codes or codes[0] >= 0x80:
                raise IngestError(f"subscription to {self._ingress} refused {codes!r}")
            self._subscribed()
            self._subscribed_at = time.monotonic()
            self._connected.set()
            self.metrics.connected.set(1)
            self.metrics.ready.set(1 if self._recovered and not self._paused.is_set() else 0)
            stop = asyncio.ensure_future(self._stop_requested.wait())
            gone = asyncio.ensure_future(acks.lost.wait())
            paused = asyncio.ensure_future(self._paused.wait())
            try:
                await asyncio.wait({stop, gone, paused}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                stop.cancel()
                gone.cancel()
                paused.cancel()
            if self._paused.is_set() and not acks.lost.is_set():
                await self._disconnect_gmqtt(client)  # the session keeps what is not acked
                raise IngestError("paused: the state directory's disk is full")
            if acks.lost.is_set():
                if acks.reason == _SESSION_TAKEN_OVER:
                    raise SessionTakenOverError(
                        f"another client connected as {cfg.ingest_client_id} to {cfg.broker}: "
                        "is a second shuffler running for this deployment?"
                    )
                raise IngestError("connection lost")
            await self._disconnect_gmqtt(client)
            self._consumption_done.set()
            logger.info("stopped consuming ingress")
        finally:
            self._connected.clear()
            self.metrics.connected.set(0)
            self.metrics.ready.set(0)
            if not acks.lost.is_set() and not self._consumption_done.is_set():
                await self._disconnect_gmqtt(client)

    def _subscribed(self) -> None:
        logger.info("subscribed to %s", self._ingress)
        self._note_session(self._session_present)

    def _note_session(self, present: bool) -> None:
        """The CONNACK said whether the broker kept this shuffler's session. Without one it
        queued nothing for it: reports published to the ingress topic while no session
        existed were acknowledged to their devices and dropped, and nothing downstream can
        count them. That is expected at a first start (INFO); it is a loss after an earlier
        session of this state directory (the broker lost it: WARNING) or once the first
        round of a shard's layout began (a shard of a reshard started late: WARNING;
        docs/operations.md, "Sharded shufflers"). A first layout (``from_round`` 0) has no
        such start to compare with."""
        self._remember_session()
        if present:
            self._had_session = True
            return
        self.metrics.sessions_new.inc()
        layout = self._layout
        late = (
            layout is not None
            and layout.from_round > 0
            and time.time() >= layout.from_round * self.config.round_seconds
        )
        if self._had_session or late:
            logger.warning(
                "the broker held no session for %s (%s): reports published to %s while there "
                "was none were not queued for this shuffler and are lost uncounted",
                self.config.ingest_client_id,
                "its shard's first round had begun" if late else "it lost the session",
                self._ingress,
            )
        else:
            logger.info("a new session on the broker (first start)")
        self._had_session = True

    def _remember_session(self) -> None:
        """Note in the state directory that the broker held a session for it, so that a
        later start without one is told from a first start. Best effort: a directory that
        cannot take the note (a full disk) only makes a later warning an INFO line."""
        if self._state is not None:
            with contextlib.suppress(StoreError):
                self._state.note_session()

    async def _disconnect_gmqtt(self, client: gmqtt.Client) -> None:
        if self._group is not None:
            self._group.flush()  # the PUBACKs of the last read go before the DISCONNECT
        with contextlib.suppress(Exception):
            async with asyncio.timeout(self.config.publish_timeout):
                await client.disconnect()

    # --- validation and pooling (synchronous: no await between check and update) ----------

    def _on_unacknowledged_message(
        self, _client: object, topic: object, payload: object, _qos: object, properties: object
    ) -> int:
        """A report delivered at QoS 0 (published so): handled like any other, with no
        PUBACK to hold back. One that cannot be stored is lost, as QoS 0 allows."""
        with contextlib.suppress(OSError):
            self._on_message(topic, payload, properties)
        return 0

    def _on_message(self, topic: object, payload: object, properties: object) -> bool:
        retain = bool(properties.get("retain")) if isinstance(properties, dict) else False
        return self._handle_report(topic, payload, retain=retain)

    def _handle_report(self, topic: object, payload: object, *, retain: bool) -> bool:
        """Validate, log and pool one report; ``True`` once it is durable (or rejected),
        when it may be acknowledged. ``False`` (or raising) leaves it unacknowledged."""
        if self._stop_requested.is_set() or self._paused.is_set():
            # Stopping (or paused: the log cannot be written): the DISCONNECT may already
            # be on its way, so a PUBACK now could be lost and the report, once logged,
            # come back as a duplicate. Leave it to the session: the next connection gets
            # it (or, at QoS 0, nobody: QoS 0 allows that).
            return False
        reason = self._offer(topic, payload, retain=retain)
        if reason is not None:
            self.metrics.reject(reason)
            return True
        self.metrics.live.received += 1
        group = self._group
        if group is not None:
            group.note()  # settled, written and acknowledged after this read
        return True

    def _offer(self, topic: object, payload: object, *, retain: bool) -> str | None:
        """Offer the report to the core (settled after this read) and return ``None``, or
        return the rejection reason."""
        reason = self._topic_reason(topic)
        if reason is not None:
            return reason
        if retain:
            return "retained"  # a retained report would be replayed on every subscription
        report = self._decode(payload)
        if isinstance(report, str):
            return report
        assert isinstance(topic, str)  # checked by _topic_reason
        device = topic[len(self._ingress_prefix) :]
        token = token_of(self._token_key, device)
        if self._layout is not None and not self._in_shard(device, report[1]):
            return "wrong_shard"
        del device  # the id is not needed past this point
        return self.core.offer(time.time(), token, report)

    def _in_shard(self, device: str, round_: int) -> bool:
        """Whether ``device``'s report of ``round_`` is this shard's: the layout in force
        for that round is this shard's layout, and it puts the device in this shard."""
        layout = self._layout
        plan = self._plan
        if layout is None or plan is None:
            return True
        serves = self._serves.get(round_)
        if serves is None:
            if len(self._serves) > 4096:  # hostile round numbers cannot grow it
                self._serves.clear()
            serves = self._serves[round_] = plan.layout_for_round(round_) is layout
        if not serves:
            return False
        digest = xxh32(device.encode(), layout.seed)
        return (digest * layout.count) >> 32 == self._shard_index

    def _topic_reason(self, topic: object) -> str | None:
        """``None`` for an ingress topic with a valid device id, else the reason."""
        if not isinstance(topic, str) or not topic.startswith(self._ingress_prefix):
            return "bad_topic"
        device = topic[len(self._ingress_prefix) :]
        if not device or "/" in device:
            return "bad_topic"
        if len(device) > MAX_NAME:
            return "bad_device_id"
        return None

    @staticmethod
    def _decode(payload: object) -> tuple[int, int, int, int] | str:
        """``(fingerprint, round, seed, z)`` of a valid report, else the codec's reason."""
        if not isinstance(payload, bytes | bytearray):
            return "bad_length"
        if len(payload) == REPORT_SIZE and payload[0] == VERSION and payload[1] == KIND_REPORT:
            fields: tuple[int, int, int, int] = _REPORT.unpack(payload)  # the common case
            return fields
        try:
            return decode_report(payload)[1:]  # raises with the codec's reason
        except CodecError as exc:
            return exc.reason
