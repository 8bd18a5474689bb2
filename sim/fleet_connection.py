"""One MQTT connection of ``coco fleet`` (gmqtt): connect, publish QoS 1 reports with a
window of unacknowledged ones, resolve each on its PUBACK, close.

A connection carries one device's reports (``connections`` mode) or many devices' (a shared
connection in ``multiplexed`` mode); :class:`sim.fleet.Fleet` decides which and counts the
outcomes.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
import time
from collections.abc import Callable
from typing import Any

import gmqtt  # type: ignore[import-untyped]
from gmqtt.mqtt.constants import MQTTv50, MQTTv311  # type: ignore[import-untyped]
from gmqtt.storage import PersistentStorage  # type: ignore[import-untyped]

from edge.mqtt_version import Negotiated

__all__ = ["Connection", "Done", "connect_reason"]

logger = logging.getLogger(__name__)

_GMQTT_NO_AUTO_RECONNECT = -2  # the fleet reconnects by itself, at the next round
_KEEPALIVE = 60

Done = Callable[[str | None], None]
"""Outcome of one QoS 1 publish: ``None`` (acknowledged) or a failure reason."""


class AckTracker(PersistentStorage):  # type: ignore[misc]
    """gmqtt's in-flight store, extended to resolve each QoS 1 publish on its PUBACK.

    gmqtt's ``publish`` returns nothing; it pushes ``(mid, packet)`` here synchronously, so
    the callback registered just before the call belongs to that ``mid``. The PUBACK's MQTT 5
    reason code is read by :meth:`Connection._on_puback` before gmqtt removes the ``mid``.
    """

    def __init__(self) -> None:
        super().__init__()
        self.next_done: Done | None = None
        self.reason = 0
        self.pending: dict[int, tuple[float, Done]] = {}

    def push_message(self, mid: int, raw_package: bytes) -> None:
        super().push_message(mid, raw_package)
        if self.next_done is not None:
            self.pending[mid] = (time.monotonic(), self.next_done)
            self.next_done = None

    def remove_message_by_mid(self, mid: int) -> None:
        super().remove_message_by_mid(mid)
        entry = self.pending.pop(mid, None)
        if entry is not None:
            reason, self.reason = self.reason, 0
            if reason < 0x80:
                entry[1](None)
            else:
                entry[1]("not_authorized" if reason == 0x87 else "refused")

    def fail_all(self, reason: str) -> None:
        pending, self.pending = self.pending, {}
        self.clear()
        for _, done in pending.values():
            done(reason)

    def expire(self, older_than: float) -> None:
        """Fail (``timeout``) every publish sent before ``older_than`` (monotonic)."""
        old = [mid for mid, (sent, _) in self.pending.items() if sent < older_than]
        for mid in old:
            _, done = self.pending.pop(mid)
            done("timeout")


def connect_reason(exc: BaseException) -> str:
    if isinstance(exc, gmqtt.MQTTConnectError):
        code = getattr(exc, "_code", None)
        if code in (4, 0x86):
            return "bad_credentials"
        if code in (5, 0x87):
            return "not_authorized"
        return "refused"
    if isinstance(exc, ssl.SSLError | ssl.CertificateError):
        return "tls"
    if isinstance(exc, TimeoutError):
        return "timeout"
    return "network"


class Connection:
    """One gmqtt client: connect, publish with a window of unacknowledged reports, close."""

    def __init__(
        self,
        client_id: str,
        *,
        username: str | None,
        password: str | None,
        window: int,
        on_lost: Callable[[Connection], None],
    ) -> None:
        self.tracker = AckTracker()
        self.client = gmqtt.Client(
            client_id,
            clean_session=True,
            persistent_storage=self.tracker,
            logger=logging.getLogger(f"{__name__}.gmqtt"),
            session_expiry_interval=0,
        )
        self.client.set_config({"reconnect_retries": _GMQTT_NO_AUTO_RECONNECT})
        if username is not None:
            self.client.set_auth_credentials(username, password)
        self.client.on_disconnect = self._on_disconnect
        handler = self.client._package_handler
        original = handler._handle_puback_packet

        def on_puback(cmd: int, packet: bytes) -> None:
            # MQTT 5: a reason code follows the packet id (absent = success).
            self.tracker.reason = packet[2] if len(packet) > 2 else 0
            original(cmd, packet)

        handler._handle_puback_packet = on_puback  # looked up by name on the instance
        self.window = window
        self.connected = False
        self.node = 0
        """Index of the broker node this connection uses (moves on after a failure)."""
        self._on_lost = on_lost
        self._room = asyncio.Event()
        self._room.set()

    @property
    def in_flight(self) -> int:
        return len(self.tracker.pending)

    async def connect(
        self,
        host: str,
        port: int,
        tls: ssl.SSLContext | bool,
        timeout: float,
        version: Negotiated = "5",
    ) -> str | None:
        """``None`` once connected, else the failure reason (never raises for the broker)."""
        try:
            async with asyncio.timeout(timeout):
                await self.client.connect(
                    host,
                    port,
                    ssl=tls,
                    keepalive=_KEEPALIVE,
                    version=MQTTv50 if version == "5" else MQTTv311,
                )
        except (OSError, TimeoutError, gmqtt.MQTTConnectError, ssl.CertificateError) as exc:
            await self._abandon()
            return connect_reason(exc)
        # The broker's MQTT 5 receive maximum bounds the in-flight ids gmqtt will allocate.
        id_max = getattr(getattr(self.client._package_handler, "id_generator", None), "_max", 0)
        if isinstance(id_max, int) and id_max >= 3:
            self.window = min(self.window, id_max - 2)
        self.connected = True
        return None

    def _on_disconnect(self, *_args: Any) -> None:
        was = self.connected
        self.connected = False
        self.tracker.fail_all("connection_lost")
        self._room.set()
        if was:
            self._on_lost(self)

    async def wait_room(self) -> None:
        """Until fewer than ``window`` reports are unacknowledged (or the connection is gone)."""
        while self.connected and self.in_flight >= self.window:
            self._room.clear()
            await self._room.wait()

    def acked(self) -> None:
        if self.in_flight < self.window:
            self._room.set()

    def publish(self, topic: str, payload: bytes, qos: int, done: Done) -> None:
        """Send one report; ``done`` gets its outcome (QoS 0: at once)."""
        if not self.connected:
            done("not_connected")
            return
        try:
            if qos:
                self.tracker.next_done = done
            self.client.publish(topic, payload, qos=qos)
        except (OSError, OverflowError, AttributeError) as exc:
            self.tracker.next_done = None
            logger.debug("publish failed: %s", exc)
            done("connection_lost")
            return
        if not qos:
            done(None)

    async def close(self, timeout: float) -> None:
        was = self.connected
        self.connected = False
        self.tracker.fail_all("connection_lost")
        if was:
            self._on_lost(self)
        with contextlib.suppress(Exception):
            async with asyncio.timeout(timeout):
                await self.client.disconnect()

    async def _abandon(self) -> None:
        with contextlib.suppress(Exception):
            async with asyncio.timeout(1.0):
                await self.client.disconnect()
