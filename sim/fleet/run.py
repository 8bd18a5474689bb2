"""``coco fleet``: N simulated devices publishing privatised reports to an MQTT broker.

Each round, every device takes its vector of the model (:mod:`sim.fleet.models`),
randomises it with the spec's mechanism on the device path
(:meth:`~edge.LocalMechanism.randomise_keys`, its own generator's bits) and publishes the
16-byte report on its own ingress topic ``coco/v1/<deployment>/ingress/<device-id>`` (in a
sharded deployment, ``.../ingress/<shard label>/<device-id>`` with the shard of the round's
layout: :mod:`edge.shards`).

Rounds
------
Rounds are the wall clock's (:mod:`edge.rounds`): round ``r`` is the Unix-time interval
``[r L, (r + 1) L)`` with ``L = round_seconds`` (the announced one), and every report
published in it carries ``r``. ``rounds`` rounds run back to back: the fleet publishes a
round's reports from ``round_offset`` seconds after it starts, spread over ``round_spread``
seconds (device ``i`` of ``n`` at ``offset + spread i / n``; 0 = as fast as possible), waits
for every acknowledgement, then waits for the next round. It joins the round in progress
only if it is ready in its first half (or before its offset, if that is later): see
:func:`next_round`. A round the fleet cannot join (the previous one overran it) is skipped
and counted; a round whose publishing overruns its end is logged (its reports keep its
number). One report per device per round, so a shuffler that accepts each round once sees
no duplicate from a healthy fleet.

Connections
-----------
MQTT 5, or 3.1.1 where the broker speaks only that (``mqtt_version`` ``auto``: one probe
before the first connection, :func:`edge.mqtt_version.negotiate`), or as configured.

* ``connections`` (default): one MQTT connection per device, client id = device id
  (what a broker that binds client ids to accounts expects) and, with a credentials
  secret, user name = device id and password =
  :func:`sim.credentials.accounts.device_password` (what a broker ACL with ``%u`` expects). Needs
  one file descriptor per device: the soft ``RLIMIT_NOFILE`` is raised to the hard limit
  when needed (:func:`ensure_fd_limit`).
* ``multiplexed``: ``connections`` shared connections (one identity, e.g. a gateway), device
  ``i`` on connection ``i mod K``; each report still goes to its device's ingress topic.

Client library: gmqtt (an asyncio ``Protocol`` per connection, no thread, no task per
message), chosen by measurement against aiomqtt (bench/README.md, ``bench_fleet.py``).
A publish is counted when the broker acknowledges it (QoS 1: PUBACK with a success reason)
or when it is written to the socket (QoS 0). At most ``window`` QoS 1 reports are
unacknowledged per connection (and fewer if the broker's MQTT 5 receive maximum says so).

Failures never crash the fleet: a refused or failed connection and an unpublished report
are counted by reason (:mod:`sim.fleet.metrics`). A connection that closes, or fails for a
reason time may fix, is tried again as a device would, with exponential backoff and jitter
(``reconnect_min_delay`` to ``reconnect_max_delay``, docs/protocol.md section 12); its
unacknowledged report, and one whose time came meanwhile, wait for it until their round
ends and are then sent again unchanged (never randomised again). A refusal retrying cannot
fix (credentials, authorisation, TLS) is tried again before the next round. At most one log
line per round says what was not sent and what the connections did (counts only).

Reproducibility: device ``i``'s data and report in wall-clock round ``r`` depend on
``(seed, i, r)`` only (:class:`sim.fleet.models.DeviceStreams`): the same seed gives the same
reports in a round whatever the mode, the ramp-up or the failures, and new reports in new
rounds, so a rerun with the same seed is new data for the aggregator, never a replay.

Participation sampling: with the announced ``participation`` ``q < 1`` (``config.participation``)
each device decides at the start of each round whether it reports in it, as a real device
does (:mod:`edge.participation`: one 32-bit word of its randomiser lane in the round, below
``floor(q 2^32)``), before drawing its report; a device that sits the round out sends
nothing. With ``q = 1`` nothing is drawn, so a seed's reports are those it always gave. The
ground truth of a round is then the mean over the devices that reported in it (what the
aggregator estimates); the fleet-wide mean of the round (every device, reporting or not) is
kept beside it (:class:`sim.fleet.truth.GroundTruth`). An announced period policy
(``config.period``) is kept by every device (:mod:`sim.fleet.caps`): a device whose period's
budget is spent sits rounds out, drawing nothing, until the next period.

No device id is logged at INFO or above, exported as a metric label or written to the
ground-truth file. Simulated devices keep no budget ledger file: they are simulations
(they keep an announced period policy, above); a real device runs ``coco device``, whose
ledger persists every release before it is sent.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from typing import Any

from prometheus_client import CollectorRegistry

from edge.codec import encode_report
from edge.mqtt_version import Negotiated
from edge.rounds import round_start
from edge.shards import ShardLayout, ShardPlan
from edge.topics import ingress_topic
from sim.credentials.accounts import device_id
from sim.fleet.config import (
    FDS_RESERVED,
    FleetConfig,
    FleetError,
    Mode,
    ensure_fd_limit,
    next_round,
)
from sim.fleet.connection import Connection, Done, Report
from sim.fleet.draws import FleetDraws, RoundReport, present
from sim.fleet.layouts import watch_layouts
from sim.fleet.metrics import PUBLISH_FAILURE_REASONS, FleetMetrics
from sim.fleet.models import Sparse
from sim.fleet.pool import Connections
from sim.fleet.reporting import FleetStats, Tally, round_problems, summary_document
from sim.fleet.truth import GroundTruth

__all__ = [
    "Fleet",
    "FleetConfig",
    "FleetError",
    "Mode",
    "ReportHook",
    "RoundReport",
    "ensure_fd_limit",
    "next_round",
]

logger = logging.getLogger("sim.fleet")
"""The fleet's own lines (one per round at most) keep the name they had before this module
moved into the package, which is also the package's: ``sim.fleet: round ...``
(tests/sim/test_fleet_broker_kill.py reads it). The other modules' loggers are children."""

ReportHook = Callable[[str, bytes], None]
"""Called with ``(topic, payload)`` of every report just before it is published (tests)."""

_YIELD_EVERY = 200
"""Publishes between two yields to the event loop (so PUBACKs are read meanwhile)."""


# -- the fleet ------------------------------------------------------------------------------


class Fleet:
    """A simulated fleet: ``await fleet.run()`` publishes every round; :meth:`stop` ends it
    early (the current round's outstanding PUBACKs get ``drain_timeout`` seconds).

    ``registry`` receives the metrics (:class:`~sim.fleet.metrics.FleetMetrics`);
    ``on_report`` sees every report's topic and payload before it is published;
    ``on_acked`` gets ``(round, seed, z)`` of every report the broker acknowledged (QoS 1)
    or that was sent (QoS 0), the device's promise that a pipeline must keep;
    ``on_round`` gets the number of every round the fleet has finished publishing (its
    truth counted: ``coco fleet --ground-truth`` writes the file then).
    """

    def __init__(
        self,
        config: FleetConfig,
        *,
        registry: CollectorRegistry | None = None,
        on_report: ReportHook | None = None,
        on_acked: Callable[[int, int, int], None] | None = None,
        on_round: Callable[[int], None] | None = None,
    ) -> None:
        self.config = config
        self.spec = config.spec
        self.draws = FleetDraws(config)
        self.model = self.draws.model
        self.metrics = FleetMetrics(
            registry if registry is not None else CollectorRegistry(),
            d=config.spec.d,
            dims=config.metrics_dims,
        )
        self.truth = GroundTruth(d=config.spec.d)
        self.ids = [device_id(i, config.prefix) for i in range(config.devices)]
        self.topics = [ingress_topic(config.deployment, dev) for dev in self.ids]
        """Every device's unsharded ingress topic (:meth:`topics_for` gives a round's)."""
        self._shard_topics: dict[tuple[int, int, int], list[str]] = {}  # per layout
        self.plan = config.shards
        """The shard layouts in force (followed while the fleet runs: :meth:`adopt`)."""
        self._on_report = on_report
        self._on_acked = on_acked
        self._on_round = on_round
        self._stop = asyncio.Event()
        self.connections = Connections(config, self.metrics, self.ids, self._stop)
        self._outstanding = 0
        self._settled = asyncio.Event()
        self.stats = FleetStats()
        self.rounds_used: list[int] = []
        """The wall-clock round numbers the run published in, in order."""
        self.published = 0
        self.sat_out = 0
        """Device-rounds sat out (nothing sent): not sampled, or the period's budget spent."""
        self.publish_failures = dict.fromkeys(PUBLISH_FAILURE_REASONS, 0)
        self._logged = self._tally()  # counts at the last round's log line

    # -- public surface --

    @property
    def registry(self) -> CollectorRegistry:
        return self.metrics.registry

    @property
    def connected(self) -> int:
        """Devices that can publish now (own mode: connected devices; multiplexed: devices
        whose shared connection is up)."""
        return self.connections.connected

    @property
    def reconnecting(self) -> int:
        """Devices whose connection is being tried again with backoff."""
        return self.connections.reconnecting

    @property
    def version(self) -> Negotiated:
        """The MQTT version of the connections (negotiated when the run starts)."""
        return self.connections.version

    @property
    def connect_failures(self) -> dict[str, int]:
        """Failed connection attempts by reason."""
        return self.connections.connect_failures

    @property
    def connections_lost(self) -> int:
        return self.connections.connections_lost

    def stop(self) -> None:
        """End the run: no new round starts; the current one drains briefly."""
        self.stats.interrupted = True
        self._stop.set()

    @property
    def stopping(self) -> bool:
        return self._stop.is_set()

    def topics_for(self, round_: int) -> list[str] | None:
        """Every device's ingress topic in ``round_`` (its shard's, in a sharded deployment);
        ``None`` if no announced layout serves the round (the fleet then skips it)."""
        plan = self.plan
        if plan is None:
            return self.topics
        layout = plan.layout_for_round(round_)
        if layout is None:
            return None
        key = (layout.generation, layout.seed, layout.count)
        topics = self._shard_topics.get(key)
        if topics is None:
            topics = self._shard_topics[key] = self._layout_topics(layout)
        return topics

    def adopt(self, plan: ShardPlan) -> None:
        """Follow newly announced layouts (a reshard) from their first round on."""
        if plan != self.plan:
            logger.info(
                "the deployment announces shard layouts %s",
                [(layout.generation, layout.count, layout.from_round) for layout in plan.layouts],
            )
            self.plan = plan

    def _layout_topics(self, layout: ShardLayout) -> list[str]:
        deployment = self.config.deployment
        return [
            ingress_topic(deployment, dev, layout.label(layout.index_of(dev))) for dev in self.ids
        ]

    def reports(self, round_: int) -> list[RoundReport | None]:
        """``(keys, signs, seed, z)`` of every device in wall-clock round ``round_``, ``None``
        for a device that sits the round out (participation ``q < 1``).

        A function of the seed, the device and ``round_`` only: any round, in any order,
        gives the same reports again.
        """
        return self.round_data(round_)[1]

    def round_data(self, round_: int) -> tuple[list[Sparse], list[RoundReport | None]]:
        """Every device's vector in ``round_`` and its report (:class:`FleetDraws`)."""
        return self.draws.round(round_)

    def _sampled_round(self, round_: int) -> list[RoundReport | None]:
        """:meth:`reports` of ``round_``; with sampling, the round's fleet-wide truth and the
        devices that sat it out are counted."""
        vectors, reports = self.round_data(round_)
        if self.config.participation < 1 or self.draws.caps is not None:
            self.truth.add_fleet(round_, vectors)
            self.sat_out += reports.count(None)
        return reports

    async def run(self) -> dict[str, Any]:
        """Connect, publish every round, disconnect; returns :meth:`summary`."""
        cfg = self.config
        if cfg.mode == "connections":
            ensure_fd_limit(cfg.connection_count + FDS_RESERVED)
        self.stats = FleetStats()
        sweeper = asyncio.create_task(self._sweep(), name="fleet-timeouts")
        pool = self.connections
        watcher: asyncio.Task[None] | None = None
        try:
            await pool.negotiate()
            if cfg.shards is not None and cfg.credentials_secret is None:
                watcher = asyncio.create_task(
                    watch_layouts(
                        broker=cfg.broker,
                        deployment=cfg.deployment,
                        fingerprint=self.spec.fingerprint,
                        version=lambda: pool.version,
                        username=cfg.username,
                        password=cfg.password,
                        ca_file=cfg.ca_file,
                        on_plan=self.adopt,
                    ),
                    name="fleet-layouts",
                )
            conns = pool.make(self._lost)
            t0 = time.monotonic()
            await pool.connect_all(conns)
            self.stats.connect_seconds = time.monotonic() - t0
            self.stats.connected_first = pool.connected
            self.stats.connections_first = sum(c.connected for c in conns)
            index = 0
            previous: int | None = None
            while not self.stopping and (cfg.rounds == 0 or index < cfg.rounds):
                if index:
                    await pool.reconnect_missing()
                round_ = next_round(
                    time.time(),
                    cfg.round_seconds,
                    cfg.round_offset,
                    previous,
                    join_current=cfg.join_current_round,
                )
                if previous is not None and round_ > previous + 1:
                    skipped = round_ - previous - 1
                    self.stats.rounds_skipped += skipped
                    logger.warning(
                        "skipped %d round(s) after round %d: it ended after the next one's "
                        "first half (raise round_seconds or lower the offset and spread)",
                        skipped,
                        previous,
                    )
                start = round_start(round_, cfg.round_seconds)
                if not await self._sleep_until(start + cfg.round_offset):
                    break
                await self._round(round_)
                previous = round_
                index += 1
        finally:
            self.stats.connected_at_end = pool.connected
            if watcher is not None:
                watcher.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await watcher
            sweeper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await sweeper
            await pool.close(2.0)
            self.metrics.set_truth(self.truth)
        return self.summary()

    def summary(self) -> dict[str, Any]:
        """The run's counts and rates (the ``--json`` document of ``coco fleet``)."""
        return summary_document(
            self.config,
            self.stats,
            self._tally(),
            rounds_used=self.rounds_used,
            peak_connected=self.connections.peak_connected,
            sat_out=self.sat_out,
            version=self.version,
            fingerprint=self.spec.fingerprint,
        )

    def ground_truth(self) -> dict[str, Any]:
        """The SIMULATION-ONLY ground-truth document (``--ground-truth``)."""
        return self.truth.to_dict(
            spec=self.spec,
            seed=self.config.seed,
            model=self.config.model,
            round_seconds=self.config.round_seconds,
            day_seconds=self.config.day_seconds,
            participation=self.config.participation,
            run={
                "devices": self.config.devices,
                "first_round": self.rounds_used[0] if self.rounds_used else None,
                "last_round": self.rounds_used[-1] if self.rounds_used else None,
                "rounds_completed": self.stats.rounds_completed,
                "reports_published": self.published,
            },
        )

    def _tally(self) -> Tally:
        return Tally(
            publish=dict(self.publish_failures),
            connect=dict(self.connect_failures),
            lost=self.connections_lost,
            published=self.published,
        )

    def _log_round(self, round_: int) -> None:
        """At most one line per round (:func:`~sim.fleet.reporting.round_problems`)."""
        now, before = self._tally(), self._logged
        self._logged = now
        line = round_problems(
            round_,
            before,
            now,
            connected=self.connected,
            devices=self.config.devices,
            reconnecting=self.reconnecting,
        )
        if line is not None:
            logger.warning("%s", line)

    # -- rounds --

    def _count(self, reason: str | None) -> None:
        if reason is None:
            self.published += 1
            self.metrics.published.inc()
        else:
            self.publish_failures[reason] += 1
            self.metrics.publish_failure(reason)

    async def _sleep_until(self, unix_time: float) -> bool:
        """Until the wall clock reads ``unix_time``; ``False`` if the fleet was stopped."""
        while not self.stopping:
            delay = unix_time - time.time()
            if delay <= 0:
                return True
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stop.wait(), delay)
        return False

    def _lost(self, conn: Connection) -> None:
        """A connection closed (:meth:`Connections.lost`)."""
        self.connections.lost(conn)

    async def _round(self, round_: int) -> None:
        """Publish every device's report of wall-clock round ``round_``."""
        cfg = self.config
        self.rounds_used.append(round_)
        reports = self._sampled_round(round_)  # every device, connected or not: reproducible
        topics = self.topics_for(round_)
        if topics is None:
            logger.warning("no announced shard layout serves round %d: not reporting", round_)
            self.stats.rounds_skipped += 1
            return
        begin = round_start(round_, cfg.round_seconds) + cfg.round_offset
        end = round_start(round_ + 1, cfg.round_seconds)
        self.connections.deadline = end  # a report may wait for its connection until then
        n = len(reports)
        fingerprint = self.spec.fingerprint_int
        conns = self.connections.conns
        k = len(conns)
        own = cfg.mode == "connections"
        start = time.monotonic()
        self._outstanding = 0
        self._settled.clear()
        for i, (keys, signs, seed, z) in present(reports):  # not those sampled out
            due = begin + cfg.round_spread * i / n
            if cfg.round_spread > 0 and not await self._sleep_until(due):
                break
            if self.stopping:
                break
            conn = conns[i] if own else conns[i % k]
            if not own and conn.in_flight >= conn.window:
                await conn.wait_room()
            payload = encode_report(fingerprint, round_, seed, z)
            if self._on_report is not None:
                self._on_report(topics[i], payload)
            self._outstanding += 1
            self._settled.clear()
            done = self._outcome(conn, round_, keys, signs, (seed, z))
            self.connections.send(conn, Report(topics[i], payload, done))
            if i % _YIELD_EVERY == _YIELD_EVERY - 1:
                await asyncio.sleep(0)
        sent_late = time.time() >= end
        expired = False
        if self._outstanding > 0:
            expired = await self._await_settled()
        self.stats.publish_seconds += time.monotonic() - start
        complete = not self.stopping and self._outstanding == 0
        if complete:
            self.stats.rounds_completed += 1
            self.metrics.rounds.inc()
        self._log_round(round_)
        if sent_late or (time.time() >= end and not expired):
            self.stats.rounds_late += 1
            logger.warning(
                "round %d was still publishing when it ended (raise round_seconds or lower the "
                "offset and spread)",
                round_,
            )
        self._round_done(round_)

    def _round_done(self, round_: int) -> None:
        """The truth of a round the fleet finished publishing: its gauges, ``on_round``."""
        self.metrics.set_truth(self.truth)
        self.metrics.set_round_truth(self.truth, round_)
        if self._on_round is not None:
            self._on_round(round_)

    def _outcome(
        self,
        conn: Connection,
        round_: int,
        keys: list[int],
        signs: list[int],
        report: tuple[int, int],
    ) -> Done:
        """The callback that settles one report: counts, truth, ``on_acked``, the window."""

        def done(reason: str | None) -> None:
            self._count(reason)
            if reason is None:
                self.truth.add(round_, keys, signs)
                if self._on_acked is not None:
                    self._on_acked(round_, *report)
            self._outstanding -= 1
            if self._outstanding == 0:
                self._settled.set()
            conn.acked()

        return done

    async def _await_settled(self) -> bool:
        """Until every report of the round is acknowledged or failed (the sweeper fails
        them after ``publish_timeout``); after :meth:`stop`, ``drain_timeout`` at most.

        Reports still waiting for a connection when the round ends are failed then
        (``not_connected``, or ``connection_lost`` once sent): returns whether that happened.
        """
        drain = self.config.drain_timeout
        if self.stopping:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._settled.wait(), drain)
            return False
        stop = asyncio.ensure_future(self._stop.wait())
        settled = asyncio.ensure_future(self._settled.wait())
        expired = False
        try:
            timeout = max(self.connections.deadline - time.time(), 0.0)
            done, _ = await asyncio.wait(
                {stop, settled}, timeout=timeout, return_when=asyncio.FIRST_COMPLETED
            )
            if not done:  # the round ended: what waits for a connection is not sent
                expired = self.connections.expire_waiting()
                await asyncio.wait({stop, settled}, return_when=asyncio.FIRST_COMPLETED)
            if not settled.done():
                await asyncio.wait({settled}, timeout=drain)
        finally:
            stop.cancel()
            settled.cancel()
        return expired

    async def _sweep(self) -> None:
        """Fail (``timeout``) QoS 1 publishes unacknowledged for ``publish_timeout`` s."""
        period = min(1.0, self.config.publish_timeout / 4)
        while True:
            await asyncio.sleep(period)
            horizon = time.monotonic() - self.config.publish_timeout
            for conn in self.connections.conns:
                if conn.tracker.pending:
                    conn.tracker.expire(horizon)
