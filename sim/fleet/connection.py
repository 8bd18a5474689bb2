"""One MQTT connection of ``coco fleet`` (gmqtt): connect, publish QoS 1 reports with a
window of unacknowledged ones, resolve each on its PUBACK, close.

A connection carries one device's reports (``connections`` mode) or many devices' (a shared
connection in ``multiplexed`` mode); :class:`sim.fleet.run.Fleet` decides which, reconnects it
after a loss (exponential backoff with jitter, :func:`backoff_delay`) and counts the
outcomes. A report keeps its bytes from its first transmission to its outcome: after a lost
connection it is sent again unchanged (docs/protocol.md, section 12), never randomised
again.

gmqtt logs per connection (a broker restart makes every connection log the same lines, and
some name a client id, which is a device id): its records are logged at DEBUG only
(:class:`_AtDebug`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import ssl
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import gmqtt  # type: ignore[import-untyped]
from gmqtt.mqtt.constants import MQTTv50, MQTTv311  # type: ignore[import-untyped]
from gmqtt.storage import PersistentStorage  # type: ignore[import-untyped]

from edge.mqtt_version import Negotiated

__all__ = [
    "PERMANENT_CONNECT_FAILURES",
    "Connection",
    "Done",
    "Report",
    "backoff_delay",
    "connect_reason",
]

logger = logging.getLogger(__name__)


class _AtDebug(logging.Filter):
    """Every record of gmqtt's per-connection logger becomes a DEBUG record: one line per
    connection is a flood when a broker restarts, and a client id is a device id, which no
    line at INFO or above may hold."""

    def filter(self, record: logging.LogRecord) -> bool:
        record.levelno, record.levelname = logging.DEBUG, "DEBUG"
        return _CLIENT_LOG.isEnabledFor(logging.DEBUG)


_CLIENT_LOG = logging.getLogger(f"{__name__}.gmqtt")
_CLIENT_LOG.addFilter(_AtDebug())

_GMQTT_NO_AUTO_RECONNECT = -2  # the fleet reconnects by itself (sim.fleet.pool)
_KEEPALIVE = 60

Done = Callable[[str | None], None]
"""Outcome of one report: ``None`` (acknowledged, or written at QoS 0) or a failure reason."""

PERMANENT_CONNECT_FAILURES = frozenset({"bad_credentials", "not_authorized", "tls"})
"""Connect failures that trying again at once cannot fix: retried before the next round
only. The others (``network``, ``timeout``, ``refused``: a broker restarting or busy) are
retried with backoff (:func:`backoff_delay`)."""


@dataclass(slots=True, eq=False)
class Report:
    """One report on its way: its topic, its 16 bytes, what to call with its outcome."""

    topic: str
    payload: bytes
    done: Done
    sent: bool = False
    """Written to a connection at least once (its outcome, if it gets none: the connection
    was lost, not ``not_connected``)."""

    def fail(self) -> None:
        """Give up on it: ``connection_lost`` once sent, ``not_connected`` if never."""
        self.done("connection_lost" if self.sent else "not_connected")


def backoff_delay(attempt: int, low: float, high: float, rng: random.Random) -> float:
    """Seconds before reconnection attempt ``attempt`` (0, 1, ...): ``low * 2^attempt``
    capped at ``high``, times a uniform factor in [0.5, 1] (jitter, so that a fleet that lost
    its broker does not come back all at once)."""
    return min(high, low * 2.0 ** min(attempt, 62)) * rng.uniform(0.5, 1.0)


class AckTracker(PersistentStorage):  # type: ignore[misc]
    """gmqtt's in-flight store, extended to resolve each QoS 1 publish on its PUBACK.

    gmqtt's ``publish`` returns nothing; it pushes ``(mid, packet)`` here synchronously, so
    the report registered just before the call belongs to that ``mid``. The PUBACK's MQTT 5
    reason code is read by :meth:`Connection._on_puback` before gmqtt removes the ``mid``.
    """

    def __init__(self) -> None:
        super().__init__()
        self.next_report: Report | None = None
        self.reason = 0
        self.pending: dict[int, tuple[float, Report]] = {}

    def push_message(self, mid: int, raw_package: bytes) -> None:
        super().push_message(mid, raw_package)
        if self.next_report is not None:
            self.pending[mid] = (time.monotonic(), self.next_report)
            self.next_report = None

    def remove_message_by_mid(self, mid: int) -> None:
        super().remove_message_by_mid(mid)
        entry = self.pending.pop(mid, None)
        if entry is not None:
            reason, self.reason = self.reason, 0
            if reason < 0x80:
                entry[1].done(None)
            else:
                entry[1].done("not_authorized" if reason == 0x87 else "refused")

    def take_all(self) -> list[Report]:
        """Every unacknowledged report, forgotten here (and by gmqtt: nothing is replayed
        behind the fleet's back), in the order they were sent."""
        pending, self.pending = self.pending, {}
        self.clear()
        return [report for _, report in pending.values()]

    def expire(self, older_than: float) -> None:
        """Fail (``timeout``) every publish sent before ``older_than`` (monotonic)."""
        old = [mid for mid, (sent, _) in self.pending.items() if sent < older_than]
        for mid in old:
            _, report = self.pending.pop(mid)
            report.done("timeout")


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
            logger=_CLIENT_LOG,
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
        self.waiting: list[Report] = []
        """Reports to send once connected again (the fleet decides what waits)."""
        self.retrying = False
        """A reconnection with backoff is under way (the fleet's)."""
        self.closing = False
        self._on_lost = on_lost
        self._room = asyncio.Event()
        self._room.set()
        self._closed = asyncio.Event()
        """Set when the broker closes the connection (before a CONNACK too: gmqtt, told not
        to reconnect by itself, then waits for a CONNACK that never comes)."""

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
        """``None`` once connected, else the failure reason (never raises for the broker).

        A broker that closes the connection before its CONNACK (a NATS node that cannot
        load the session while its cluster elects a leader) fails the attempt at once
        (``network``), instead of after ``timeout``."""
        self._closed.clear()
        attempt = asyncio.ensure_future(
            self.client.connect(
                host,
                port,
                ssl=tls,
                keepalive=_KEEPALIVE,
                version=MQTTv50 if version == "5" else MQTTv311,
            )
        )
        closed = asyncio.ensure_future(self._closed.wait())
        try:
            async with asyncio.timeout(timeout):
                await asyncio.wait({attempt, closed}, return_when=asyncio.FIRST_COMPLETED)
            if not attempt.done():
                raise ConnectionResetError("the broker closed the connection before its CONNACK")
            attempt.result()
        except (OSError, TimeoutError, gmqtt.MQTTConnectError, ssl.CertificateError) as exc:
            await self._abandon()
            return connect_reason(exc)
        finally:
            closed.cancel()
            if not attempt.done():
                attempt.cancel()
                with contextlib.suppress(BaseException):
                    await attempt
        if not self.client.is_connected:  # closed again before this coroutine resumed
            await self._abandon()
            return "network"
        # The broker's MQTT 5 receive maximum bounds the in-flight ids gmqtt will allocate.
        id_max = getattr(getattr(self.client._package_handler, "id_generator", None), "_max", 0)
        if isinstance(id_max, int) and id_max >= 3:
            self.window = min(self.window, id_max - 2)
        self.connected = True
        return None

    def _on_disconnect(self, *_args: Any) -> None:
        self._closed.set()
        was = self.connected
        self.connected = False
        self._room.set()
        if was:
            self._on_lost(self)  # takes the unacknowledged reports (tracker.take_all)

    async def wait_room(self) -> None:
        """Until fewer than ``window`` reports are unacknowledged (or the connection is gone)."""
        while self.connected and self.in_flight >= self.window:
            self._room.clear()
            await self._room.wait()

    def acked(self) -> None:
        if self.in_flight < self.window:
            self._room.set()

    def publish(self, report: Report, qos: int) -> None:
        """Send one report; its ``done`` gets the outcome (QoS 0: at once)."""
        if not self.connected:
            report.fail()
            return
        try:
            if qos:
                self.tracker.next_report = report
            self.client.publish(report.topic, report.payload, qos=qos)
        except (OSError, OverflowError, AttributeError) as exc:
            self.tracker.next_report = None
            logger.debug("publish failed: %s", exc)
            report.sent = True
            report.fail()
            return
        report.sent = True
        if not qos:
            report.done(None)

    def fail_all(self) -> None:
        """Give up on every report in flight or waiting (:meth:`Report.fail`)."""
        waiting, self.waiting = self.waiting, []
        for report in [*self.tracker.take_all(), *waiting]:
            report.fail()

    async def close(self, timeout: float) -> None:
        self.closing = True
        was = self.connected
        self.connected = False
        if was:
            self._on_lost(self)
        self.fail_all()
        with contextlib.suppress(Exception):
            async with asyncio.timeout(timeout):
                await self.client.disconnect()

    async def _abandon(self) -> None:
        with contextlib.suppress(Exception):
            async with asyncio.timeout(1.0):
                await self.client.disconnect()
