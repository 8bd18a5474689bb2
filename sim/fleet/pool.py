"""The MQTT connections of a simulated fleet (:class:`Connections`): made, connected at the
configured ramp-up, and, when one closes or fails for a reason time may fix, tried again as a
device would (docs/protocol.md, section 12): after ``reconnect_min_delay * 2^k`` seconds, at
most ``reconnect_max_delay``, with jitter, on the next node of a broker list each time. A
report whose connection is down waits for it until :attr:`Connections.deadline` (its round's
end) and is then sent again, the same bytes; after that it is failed
(:meth:`sim.fleet.connection.Report.fail`). Counts only: no device id is logged.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import secrets
import ssl
import time
from collections.abc import Callable
from typing import Any

from edge.mqtt_url import parse_broker_urls
from edge.mqtt_version import Negotiated, negotiate
from sim.credentials.accounts import device_password
from sim.fleet.config import FleetConfig
from sim.fleet.connection import (
    PERMANENT_CONNECT_FAILURES,
    Connection,
    Report,
    backoff_delay,
)
from sim.fleet.metrics import CONNECT_FAILURE_REASONS, FleetMetrics

__all__ = ["CONNECT_CONCURRENCY", "Connections"]

logger = logging.getLogger(__name__)

CONNECT_CONCURRENCY = 200
"""At most this many connection attempts at once (keeps the broker's listen backlog short)."""
_YIELD_EVERY = 200
"""Reports sent between two yields to the event loop."""


class Connections:
    """Every connection of one fleet run (``conns``), and what they did: devices
    ``connected`` now and at most (``peak_connected``), ``connect_failures`` by reason,
    ``connections_lost``."""

    def __init__(
        self, config: FleetConfig, metrics: FleetMetrics, ids: list[str], stop: asyncio.Event
    ) -> None:
        self.config = config
        self.metrics = metrics
        self.ids = ids
        self._stop = stop
        self.nodes = parse_broker_urls(config.broker)
        """The broker's nodes: connection ``k`` starts on node ``k mod n`` and moves to the
        next node each time it fails (a cluster node that died)."""
        tls = self.nodes[0][2]
        self._tls: ssl.SSLContext | bool = (
            ssl.create_default_context(cafile=config.ca_file) if tls else False
        )
        self.version: Negotiated = "3.1.1" if config.mqtt_version == "3.1.1" else "5"
        self.conns: list[Connection] = []
        self.connected = 0
        self.peak_connected = 0
        self.connect_failures = dict.fromkeys(CONNECT_FAILURE_REASONS, 0)
        self.connections_lost = 0
        self.deadline = 0.0
        """Unix time until which a report may wait for its connection to come back."""
        self._gate = asyncio.Semaphore(CONNECT_CONCURRENCY)
        self._tasks: set[asyncio.Task[None]] = set()
        """Reconnections and flushes under way (cancelled by :meth:`close`)."""
        self._jitter = random.Random()  # timing only: never a report's randomness

    @property
    def stopping(self) -> bool:
        return self._stop.is_set()

    @property
    def reconnecting(self) -> int:
        """Devices whose connection is being tried again with backoff."""
        return sum(self.devices_on(c) for c in self.conns if c.retrying and not c.connected)

    def make(self, on_lost: Callable[[Connection], None]) -> list[Connection]:
        """The run's connections (``on_lost`` is called when one closes: it calls
        :meth:`lost`), spread over the broker's nodes."""
        cfg = self.config
        if cfg.mode == "connections":
            secret = cfg.credentials_secret
            conns = [
                Connection(
                    dev,
                    username=dev if secret is not None else cfg.username,
                    password=device_password(secret, dev) if secret is not None else cfg.password,
                    window=cfg.window,
                    on_lost=on_lost,
                )
                for dev in self.ids
            ]
        else:
            run = secrets.token_hex(4)
            conns = [
                Connection(
                    f"coco-fleet-{run}-{k}",
                    username=cfg.username,
                    password=cfg.password,
                    window=cfg.window,
                    on_lost=on_lost,
                )
                for k in range(cfg.connection_count)
            ]
        for k, conn in enumerate(conns):
            conn.node = k  # spread over the nodes of a cluster
        self.conns = conns
        return conns

    async def negotiate(self) -> Negotiated:
        """The MQTT version of every connection (a probe for ``auto``; MQTT 5 if the
        broker cannot be probed: the connections then count the failure)."""
        host, port, _ = self.nodes[0]
        tls = self._tls if isinstance(self._tls, ssl.SSLContext) else None
        try:
            self.version = await negotiate(
                self.config.mqtt_version, host, port, tls=tls, timeout=self.config.connect_timeout
            )
        except (OSError, TimeoutError, ssl.SSLError) as exc:
            logger.debug("MQTT version probe failed: %s", exc)
            self.version = "5"
        return self.version

    def devices_on(self, conn: Connection) -> int:
        if self.config.mode == "connections":
            return 1
        k, n = self.conns.index(conn), self.config.devices
        return len(range(k, n, len(self.conns)))

    def lost(self, conn: Connection) -> None:
        """A connection closed: its unacknowledged reports wait for it to come back (within
        their round), and it is tried again with backoff, as a device would."""
        conn.node += 1  # reconnect to the next node (the lost one may have died)
        self.connected -= self.devices_on(conn)
        self.metrics.connected.set(self.connected)
        if conn.closing:  # the run's end: close() fails what is left
            return
        self.connections_lost += 1
        self.metrics.connections_lost.inc()
        self._retry(conn)
        for report in conn.tracker.take_all():
            self._hold(conn, report)

    def expire_waiting(self) -> bool:
        """Fail every report that waits for a connection; whether there was one."""
        expired = False
        for conn in self.conns:
            waiting, conn.waiting = conn.waiting, []
            for report in waiting:
                report.fail()
                expired = True
        return expired

    async def close(self, timeout: float) -> None:
        """End every reconnection, then close every connection (what is left unsent fails)."""
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await asyncio.gather(*(c.close(timeout) for c in self.conns))
        self.metrics.reconnecting.set(0)

    def _may_wait(self, conn: Connection) -> bool:
        """Whether a report of ``conn`` may wait for a reconnection: it is being tried
        again and the report's round has not ended."""
        return conn.retrying and not self.stopping and time.time() < self.deadline

    def _hold(self, conn: Connection, report: Report) -> None:
        if self._may_wait(conn):
            conn.waiting.append(report)
        else:
            report.fail()

    def send(self, conn: Connection, report: Report) -> None:
        if conn.connected:
            conn.publish(report, self.config.qos)
        else:
            self._hold(conn, report)

    def _spawn(self, coro: Any, name: str) -> None:
        task: asyncio.Task[None] = asyncio.create_task(coro, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _retry(self, conn: Connection) -> None:
        if conn.retrying or conn.closing or self.stopping:
            return
        conn.retrying = True
        self.metrics.reconnecting.inc(self.devices_on(conn))
        self._spawn(self._reconnect(conn), "fleet-reconnect")

    async def _reconnect(self, conn: Connection) -> None:
        """Try ``conn`` again after ``reconnect_min_delay * 2^k`` s (at most
        ``reconnect_max_delay``, with jitter) until it connects, the run ends, or the
        broker refuses it for good (then it is tried again before the next round)."""
        cfg = self.config
        attempt = 0
        permanent = False
        try:
            while not self.stopping and not conn.closing:
                delay = backoff_delay(
                    attempt, cfg.reconnect_min_delay, cfg.reconnect_max_delay, self._jitter
                )
                attempt += 1
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._stop.wait(), delay)
                if self.stopping:
                    break
                reason = await self._connect(conn)
                if reason is None:
                    if conn.waiting:
                        self._spawn(self._flush(conn), "fleet-flush")
                    break
                if reason in PERMANENT_CONNECT_FAILURES:
                    permanent = True
                    break
        finally:  # also when cancelled: close() then fails what waits
            conn.retrying = False
            self.metrics.reconnecting.dec(self.devices_on(conn))
        if conn.connected:
            return
        if permanent or self.stopping or conn.closing:
            waiting, conn.waiting = conn.waiting, []
            for report in waiting:
                report.fail()
        else:  # lost again the moment it connected: start over
            self._retry(conn)

    async def _flush(self, conn: Connection) -> None:
        """Send the reports that waited for ``conn``, the same bytes (window permitting)."""
        sent = 0
        while conn.waiting and conn.connected:
            if conn.in_flight >= conn.window:
                await conn.wait_room()
                continue
            conn.publish(conn.waiting.pop(0), self.config.qos)
            sent += 1
            if sent % _YIELD_EVERY == 0:
                await asyncio.sleep(0)

    async def _connect(self, conn: Connection) -> str | None:
        """One connection attempt (at most :data:`CONNECT_CONCURRENCY` at once): ``None``
        once connected, else the failure reason, counted."""
        cfg = self.config
        async with self._gate:
            host, port, _ = self.nodes[conn.node % len(self.nodes)]
            reason = await conn.connect(host, port, self._tls, cfg.connect_timeout, self.version)
        if reason is None:
            self.connected += self.devices_on(conn)
            self.peak_connected = max(self.peak_connected, self.connected)
            self.metrics.connected.set(self.connected)
            if self.stopping:
                await conn.close(1.0)
            return None
        conn.node += 1  # the next attempt goes to the next node of a cluster
        self.connect_failures[reason] += 1
        self.metrics.connect_failure(reason)
        logger.debug("connection refused or failed: %s", reason)
        return reason

    async def connect_all(self, conns: list[Connection]) -> None:
        """Connect ``conns`` (``ramp_up`` per second); one that fails for a reason time may
        fix is tried again with backoff (:meth:`_retry`)."""
        cfg = self.config
        start = time.monotonic()

        async def one(i: int, conn: Connection) -> None:
            if cfg.ramp_up > 0:
                delay = start + i / cfg.ramp_up - time.monotonic()
                if delay > 0:
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(self._stop.wait(), delay)
            if self.stopping or conn.connected or conn.retrying:
                return
            reason = await self._connect(conn)
            if reason is not None and reason not in PERMANENT_CONNECT_FAILURES:
                self._retry(conn)

        await asyncio.gather(*(one(i, c) for i, c in enumerate(conns)))

    async def reconnect_missing(self) -> None:
        """Before a round: one attempt for every connection that is down and not being
        tried again (the broker refused it for good last time)."""
        missing = [c for c in self.conns if not c.connected and not c.retrying]
        if missing:
            await self.connect_all(missing)
