"""A shuffler's shard: its lease, the announcement watched while it runs, and its
retirement once a newer layout serves its devices (DESIGN D2, D5; broker/service/lease.py).

An unsharded deployment is one shard: its shuffler holds the lease of
``coco/v1/<dep>/shards/-/lease`` when it has a state directory (its persistent owner id), so
a second ``coco shuffler`` of the deployment is refused at start. One without a state
directory (in-process only: ``coco demo``, tests, benches; ``coco shuffler`` always has one)
takes no unsharded lease: nothing would let its restart take over, and it keeps nothing.

The lease is claimed at start, often right after a crash and while a node of the broker
cluster is down too: a node that cannot be reached, or that keeps no claim (a NATS node just
restarted serves no retained message for a while), gives way to the next one of
``--broker``, with the reconnections' backoff, for ``lease_start_window`` seconds; only then
does the shuffler give up (at once for a refusal that another try cannot change: not
authorized, a refused protocol version, a TLS error:
:func:`edge.announcement_reader.final_refusal`). A shuffler restarted while the first node
was down once exited at once, with the other two nodes up."""

from __future__ import annotations

import asyncio
import logging
import time

import aiomqtt

from broker.service.lease import LeaseLostError, LeaseUnconfirmedError, ShardControl
from broker.service.shell import ShellState
from edge.announcement_reader import final_refusal
from edge.errors import SpecError
from edge.rounds import current_round
from edge.shards import ShardPlan

logger = logging.getLogger("broker.shuffler")


class ShardMixin(ShellState):
    """The shard part of :class:`broker.service.shuffler.Shuffler`."""

    # --- shards: lease, announcement, retirement --------------------------------------

    def _needs_lease(self) -> bool:
        """A shard's shuffler, or an unsharded one with a state directory (module docs)."""
        return self._layout is not None or (
            self.config.shard is None and self.config.state_dir is not None
        )

    async def _acquire_shard(self) -> None:
        """Claim the lease, walking the nodes while they cannot be reached (module docs);
        :class:`broker.service.lease.LeaseRefusedError` when another shuffler holds it."""
        cfg = self.config
        backoff = cfg.reconnect_min
        deadline = time.monotonic() + cfg.lease_start_window
        while True:
            try:
                control = await self._claim_lease()
            except (OSError, aiomqtt.MqttError, LeaseUnconfirmedError) as exc:  # TimeoutError too
                if final_refusal(exc) or time.monotonic() + backoff > deadline:
                    raise
                node = self._nodes.current
                logger.warning(
                    "lease: %s:%d cannot be reached, serves no retained messages yet or kept "
                    "no claim (%s); trying the next node in %.2f s",
                    node.host,
                    node.port,
                    exc,
                    backoff,
                )
                self._nodes.failed()
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, cfg.reconnect_max)
                continue
            self._control = control
            return

    async def _claim_lease(self) -> ShardControl:
        cfg = self.config
        version = await self._negotiated()
        control = ShardControl(
            nodes=self._nodes,
            tls=self._tls,
            ca_file=cfg.ca_file,
            username=cfg.username,
            password=cfg.password,
            client_id=cfg.ingest_client_id,
            deployment=cfg.deployment,
            shard=cfg.shard,
            owner=self._owner,
            ttl=cfg.lease_ttl,
            settle=cfg.lease_settle,
            mqtt5=version == "5",
            timeout=cfg.publish_timeout,
            announced=cfg.announced,
        )
        control.on_announcement = self._on_announcement
        await control.acquire()
        return control

    async def _hold_shard(self) -> None:
        assert self._control is not None
        try:
            await self._control.hold(self._closing)
        except LeaseLostError as exc:
            self._fail(exc)

    def _set_plan(self, plan: ShardPlan) -> None:
        """The layouts in force; this shard's rounds end where a newer layout starts."""
        shard = self.config.shard
        assert shard is not None
        layout = plan.layout_of_label(shard)
        if layout is None:
            return  # this shard's layout was dropped from the announcement: keep the last
        self._plan, self._layout = plan, layout
        self._serves.clear()
        end = plan.rounds_of(layout)[1]
        if end != self.core.end_round:
            self.core.end_round = end
            if end is not None:
                logger.info(
                    "shard %s serves rounds before %d: a layout of generation %d takes over "
                    "from there",
                    shard,
                    end,
                    plan.layout_for_round(end).generation,  # type: ignore[union-attr]
                )

    def _on_announcement(self, announcement: dict[str, object]) -> None:
        shards = announcement.get("shards")
        if shards is None:
            return
        try:
            plan = ShardPlan.from_json(shards)
        except (SpecError, ValueError) as exc:
            logger.warning("an announced shard plan is ignored (%s)", exc)
            return
        self._warn_late_layouts(plan)
        if self.config.shard is not None:
            self._set_plan(plan)

    def _warn_late_layouts(self, plan: ShardPlan) -> None:
        """One WARNING per layout first seen here whose first round has begun already
        (``coco announce`` refuses such a layout; another publisher of the retained
        announcement may not): its devices sent that round's reports under the layout before,
        and the shuffler of the other layout rejects them as ``wrong_shard``. It is installed
        all the same: the announcement is the deployment's single source of truth."""
        now = current_round(self.config.round_seconds)
        for layout in plan.layouts:
            if layout.generation in self._generations_seen:
                continue
            self._generations_seen.add(layout.generation)
            if layout.from_round <= now:
                logger.warning(
                    "the announced layout of generation %d starts at round %d, which has "
                    "begun (current round %d): reports of rounds %d-%d sent under the layout "
                    "before are rejected as wrong_shard; announce layouts a few rounds ahead",
                    layout.generation,
                    layout.from_round,
                    now,
                    layout.from_round,
                    now,
                )

    def _check_retired(self) -> None:
        """A shard whose rounds are over, all released and acknowledged, retires: its
        manifests are published (they are in the outbox), one INFO line, exit 0."""
        end = self.core.end_round
        if end is None or self.retired or self.core.closed < end * self.config.round_seconds:
            return
        core = self.core
        if core.pool_sizes() or core.outbox() or core.pending or self._unlogged_acks:
            return
        self.retired = True
        logger.info(
            "shard %s retired: every round before %d is released and acknowledged; exiting",
            self.config.shard,
            end,
        )
        self.stop()
