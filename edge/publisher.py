"""A device's MQTT publisher: sensor vector -> ledger charge -> eps-LDP report -> broker.

One :class:`DevicePublisher` per device. Through its link to the broker
(:class:`~edge.publisher_link.BrokerLink`: paho-mqtt; MQTT 5, or 3.1.1 where the broker
refuses 5 or on request) it learns the mechanism from the deployment's retained spec
announcement (or is given it, and then checks that it matches the announcement), and for
every vector:

1. encodes the readings with :class:`~edge.encoders.SensorEncoder` (or takes keys and signs
   that are already sparse),
2. charges the device's :class:`~edge.ledger.BudgetLedger` ``spec.epsilon`` *before* anything
   leaves the device (a crash after the charge wastes budget, never under-counts it), in the
   period holding the start of the report's round,
3. randomises on the device path (:meth:`LocalMechanism.randomise_keys` with the ``secrets``
   CSPRNG: the report's privacy rests on randomness the network cannot predict),
4. in a deployment that announces participation ``q < 1``, decides (before step 2) with the
   ``secrets`` CSPRNG whether it reports in this round at all (:mod:`edge.participation`;
   a round sat out is charged nothing),
5. encodes the 16-byte report (:func:`edge.codec.encode_report`) for the current round and
   publishes it to its own ingress topic ``coco/v1/<deployment>/ingress/<device-id>`` (in
   a sharded deployment ``.../ingress/<shard label>/<device-id>``, the shard of the
   report's round: :mod:`edge.shards`), waiting for the PUBACK.

Rounds come from the clock (:mod:`edge.rounds`): a report's round is
``floor(unix_time / round_seconds)`` at the moment it is sent, with ``round_seconds`` from the
latest announcement (or, when no announcement is retained, the ``round_seconds`` the caller
gives). A publisher sends at most one report per round: a second publish in the same round
waits for the next one. A clock that is not set (before 2025-01-01) raises
:class:`~edge.rounds.ClockError` before anything is charged or sent. A *restarted* device does
not know whether it already reported in the current round, and may report again: the
shuffler keeps the first and rejects the second as a duplicate (docs/protocol.md, "Rounds").

Why QoS 1: a report that is lost after its budget was charged spends privacy for nothing,
so the device wants delivery confirmed (and a clear failure when it is not). QoS 1 may
deliver a report twice (paho resends the same bytes, with the same round, after a
reconnect); the shuffler keeps one report per device per round, so a duplicate costs
nothing. (QoS 2 works too but buys nothing for that extra round trip; QoS 0 is
accepted for experiments and then "delivered" only means "written to the socket".)

Budget: when the ledger's period cap refuses a report, the publish waits for the next period
(saying so in one line that names when it starts) and then publishes; a clock set back does
not shorten the wait (:mod:`edge.budget`). When its lifetime cap refuses, that is an
expected, terminal state of a device, so the publish methods *return* ``False`` (and publish
nothing). Everything else raises a subclass of
:class:`~edge.errors.CocoError`: :class:`PublisherError` for the broker (not connected
within the timeout, no PUBACK within the timeout, PUBACK with an error reason),
:class:`~edge.errors.SpecError` for a spec that does not match the announcement,
:class:`~edge.errors.InputError` for readings outside the encoder's domain, and
:class:`~edge.ledger.LedgerError` for an unwritable ledger.

The connection, its client id and its reconnection are :mod:`edge.publisher_link`'s.
"""

from __future__ import annotations

import logging
import secrets
import threading
import time
from collections.abc import Callable, Sequence
from types import TracebackType
from typing import Any, Self

from edge import device
from edge._mechanism import LocalMechanism
from edge.announce import participation_of
from edge.codec import encode_report
from edge.encoders import SensorEncoder
from edge.errors import InputError
from edge.ledger import BudgetExhausted, BudgetLedger
from edge.participation import participates
from edge.publisher_link import BrokerLink, PublisherConfig, PublisherError
from edge.rounds import current_round, round_start, seconds_to_next_round
from edge.shards import ShardPlan
from edge.spec import MechanismSpec
from edge.topics import ingress_topic

__all__ = ["DevicePublisher", "LedgerOpener", "PublisherConfig", "PublisherError"]

LedgerOpener = Callable[[dict[str, Any] | None, float], BudgetLedger]
"""Opens a device's ledger given the resolved announcement (``None`` when none is retained)
and the spec's epsilon (one report's cost)."""

logger = logging.getLogger(__name__)

MAX_SLEEP = 60.0
"""The longest single sleep of a wait for the next period (the clock is read again after)."""


class DevicePublisher(BrokerLink):
    """Publishes one eps-LDP report per vector per round for one device (see module doc).

    Use as a context manager (or call :meth:`start` and :meth:`close`); the publish methods
    are thread-safe but serialised. ``lo``, ``hi`` and ``clip`` configure the
    :class:`SensorEncoder` of :meth:`publish_vector`; its ``s`` is the spec's and its
    dimension must be the spec's ``d``.

    ``round_seconds`` is the round length to use when no announcement is retained (it must
    equal the announced one when there is); ``clock`` returns Unix seconds (default
    :func:`time.time`; tests give a fixed or offset clock). ``on_wait`` receives the one line
    said when a period cap makes a publish wait for the next period (default: a warning in
    the log).

    ``ledger`` is the device's ledger, or a function that opens it from the announcement
    resolved by :meth:`start` (``None`` when none is retained): ``coco device`` opens its
    ledger with the announced period policy that way.
    """

    def __init__(
        self,
        config: PublisherConfig,
        *,
        ledger: BudgetLedger | LedgerOpener,
        spec: MechanismSpec | None = None,
        lo: Sequence[float] | None = None,
        hi: Sequence[float] | None = None,
        clip: bool = False,
        round_seconds: int | None = None,
        clock: Callable[[], float] = time.time,
        on_wait: Callable[[str], None] | None = None,
    ) -> None:
        if (lo is None) != (hi is None):
            raise ValueError("give both lo and hi, or neither")
        super().__init__(config, spec=spec, round_seconds=round_seconds)
        self._ledger = ledger if isinstance(ledger, BudgetLedger) else None
        self._open_ledger = None if isinstance(ledger, BudgetLedger) else ledger
        self._lo = None if lo is None else tuple(lo)
        self._hi = None if hi is None else tuple(hi)
        self._clip = clip
        self._clock = clock
        self._on_wait = on_wait or (lambda line: logger.warning("%s", line))
        self._last_round: int | None = None
        self.sat_out = 0
        """Rounds this publisher sat out by participation sampling (nothing charged or sent)."""
        self._topic = ingress_topic(config.deployment, config.device_id)
        """The unsharded ingress topic (a sharded deployment's depends on the round)."""
        self._publish_lock = threading.Lock()
        self._mechanism: LocalMechanism | None = None
        self._encoder: SensorEncoder | None = None

    # -- lifecycle -------------------------------------------------------------------------

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    @property
    def ledger(self) -> BudgetLedger:
        """The device's ledger (opened by :meth:`start` when given as a function)."""
        if self._ledger is None:
            raise PublisherError("the ledger is opened when the publisher starts")
        return self._ledger

    @property
    def opened_ledger(self) -> BudgetLedger | None:
        """The ledger if it is open (``None`` before :meth:`start` opened it)."""
        return self._ledger

    @property
    def participation(self) -> float:
        """The announced participation probability ``q`` (1 without an announcement or
        without the key)."""
        with self._cond:
            return participation_of(self._announcement)

    @property
    def last_round(self) -> int | None:
        """The round of the last report this publisher sent (``None`` before the first)."""
        return self._last_round

    def start(self) -> MechanismSpec:
        """Connect, resolve the spec, and return it. Raises on timeout or mismatch."""
        self._connect()
        assert self._spec is not None
        if self._ledger is None and self._open_ledger is not None:
            try:
                self._ledger = self._open_ledger(self.announcement, self._spec.epsilon)
            except BaseException:
                self.close()
                raise
        self._mechanism = LocalMechanism.from_spec(self._spec)
        if self._lo is not None and self._hi is not None:
            if len(self._lo) != self._spec.d:
                self.close()
                raise InputError(
                    f"{len(self._lo)} channel ranges given but the spec has d={self._spec.d}"
                )
            self._encoder = SensorEncoder(lo=self._lo, hi=self._hi, s=self._spec.s, clip=self._clip)
        logger.info(
            "device publisher ready: deployment %s, spec %s (%s, d=%d, s=%d, eps=%g), "
            "budget left %g",
            self.config.deployment,
            self._spec.fingerprint,
            self._spec.mechanism,
            self._spec.d,
            self._spec.s,
            self._spec.epsilon,
            self.ledger.remaining,
        )
        return self._spec

    # -- publishing ------------------------------------------------------------------------

    def publish_vector(self, values: Sequence[float]) -> bool:
        """Encode sensor readings, then as :meth:`publish_keys`.

        Returns ``False`` (publishing nothing) when the ledger refuses the charge.
        """
        if self._encoder is None:
            raise PublisherError("publish_vector needs channel ranges (lo and hi)")
        keys, signs = self._encoder.encode(values)
        return self.publish_keys(keys, signs)

    def publish_keys(self, keys: Sequence[int], signs: Sequence[int]) -> bool:
        """Publish the report of one sparse ternary vector in the current round; wait for
        the ack.

        The round is the clock's (:func:`edge.rounds.current_round`); if this publisher
        already sent a report in it, this waits for the next round first. Returns ``True``
        once the broker acknowledged the report, or when participation sampling (the
        announced ``q``, :mod:`edge.participation`) has this device sit the round out
        (nothing charged or sent; :attr:`sat_out` counts them), and ``False`` (publishing
        nothing) when the ledger has no budget left for it; raises otherwise (module doc),
        in particular :class:`~edge.rounds.ClockError` when the clock is not set.
        """
        spec = self.spec
        mechanism = self._mechanism
        client = self._client
        if mechanism is None or client is None:
            raise PublisherError("the publisher is not started")
        try:
            device.check_sparse(list(keys), list(signs), spec.d, spec.s)
        except ValueError as exc:
            raise InputError(str(exc)) from None
        with self._publish_lock:
            self._check_announcement(spec)
            self._round_now()  # an unset clock fails before anything else
            if not self._wait_for_budget(spec.epsilon):  # no wait for a round it cannot use
                return False
            self._next_round()  # wait (if need be) before the publish timeout starts
            deadline = time.monotonic() + self.config.publish_timeout
            self._wait_connected(self.config.publish_timeout)
            round_ = self._next_round()  # the round now, after any wait for the connection
            topic = self._topic_for(round_)  # before the charge: no budget for an unservable round
            if not participates(self.participation, secrets.randbits):
                self._last_round = round_  # sat out: nothing charged, nothing sent
                self.sat_out += 1
                logger.debug("not sampled in round %d", round_)
                return True
            try:  # the report is charged to the period holding its round's start
                self.ledger.charge(spec.epsilon, at=round_start(round_, self.round_seconds))
            except BudgetExhausted as exc:
                logger.info("report for round %d not published: %s", round_, exc)
                return False
            seed, z = mechanism.randomise_keys(keys, signs)  # secrets.randbits
            payload = encode_report(spec.fingerprint_int, round_, seed, z)
            self._last_round = round_
            self._send(client, topic, payload, round_, deadline)
        logger.debug("published round %d to %s", round_, topic)
        return True

    # -- internals -------------------------------------------------------------------------

    def _round_now(self) -> int:
        """The clock's round now (:class:`~edge.rounds.ClockError` if the clock is unset)."""
        return current_round(self.round_seconds, self._clock())

    def _wait_for_budget(self, epsilon: float) -> bool:
        """``True`` once the ledger affords a report in the current round; ``False`` when its
        lifetime cap refuses it (for good). A period cap that refuses it is waited out: one
        line (``on_wait``) names when the next period starts, then this sleeps until then."""
        while True:
            round_ = self._round_now()
            refusal = self.ledger.refusal(epsilon, at=round_start(round_, self.round_seconds))
            if refusal is None:
                return True
            if refusal.renews_at is None:
                logger.info("report not published: %s", refusal.message(epsilon))
                return False
            self._on_wait(f"{refusal.message(epsilon)}: waiting for it")
            while (remaining := refusal.renews_at - self._clock()) > 0:
                time.sleep(min(remaining, MAX_SLEEP))

    def _next_round(self) -> int:
        """The current round, after waiting for a round this publisher has not reported in."""
        round_ = self._round_now()
        last = self._last_round
        while last is not None and round_ <= last:
            wait = seconds_to_next_round(self.round_seconds, self._clock())
            logger.debug("already reported in round %d; waiting %.3f s", last, wait)
            time.sleep(max(wait, 0.001))
            round_ = self._round_now()
        return round_

    def _topic_for(self, round_: int) -> str:
        """The ingress topic of this device's report of ``round_``: its shard's in a sharded
        deployment (:class:`PublisherError` if no layout serves the round)."""
        with self._cond:
            announcement = self._announcement
        layouts = None if announcement is None else announcement.get("shards")
        if layouts is None:
            return self._topic
        label = ShardPlan.from_json(layouts).label_for(self.config.device_id, round_)
        if label is None:
            raise PublisherError(
                f"no shard layout of the announcement serves round {round_}; not reporting"
            )
        return ingress_topic(self.config.deployment, self.config.device_id, label)
