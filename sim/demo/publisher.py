"""The demo's simulated devices: each round's sensor readings, encoded and randomised as a
device does (the batch path, :meth:`~edge.LocalMechanism.randomise_sparse`), published on
each device's own ingress topic over a few shared MQTT connections (QoS 1), with at most
``window`` reports in flight between them and the shuffler so that the broker's per-client
queue (Mosquitto's ``max_queued_messages``) never overflows.

The devices' ids appear only in ingress topics; nothing here logs or prints them.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiomqtt
import numpy as np
from numpy.typing import NDArray

from broker.service.shuffler import parse_broker_url
from edge import LocalMechanism, MechanismSpec
from edge.codec import encode_report
from edge.rounds import current_round, seconds_to_next_round
from edge.topics import ingress_topic
from sim.demo.config import DemoConfig, ReportSink
from sim.fleet.truth import GroundTruth, write_onto
from sim.models.day import DAY_SECONDS, hour_of_day
from sim.models.sensors import SensorFleet
from sim.models.synthetic import sparse_totals

__all__ = ["DemoFleet", "connections", "publish_round"]


@dataclass
class DemoFleet:
    """The simulated devices' side: reports per round and what was sent."""

    config: DemoConfig
    spec: MechanismSpec
    sensors: SensorFleet
    ids: list[str]
    sent: int = 0
    total: NDArray[np.int64] = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    truth_sum: NDArray[np.float64] = field(default_factory=lambda: np.zeros(0))
    truth_path: Path | None = None
    """Where to write :meth:`truth_document` after every round (``None``: nowhere)."""
    truth: GroundTruth = field(init=False)
    """SIMULATION-ONLY: the sums of the ternary vectors sent, per wall-clock round (the
    document of ``coco fleet --ground-truth``: :meth:`truth_document`)."""

    def __post_init__(self) -> None:
        self.truth = GroundTruth(d=self.spec.d)
        self._latest_truth: dict[str, Any] | None = None

    def latest_truth(self) -> dict[str, Any] | None:
        """The truth document of the rounds published so far (``None`` before the first)."""
        return self._latest_truth

    def truth_document(self) -> dict[str, Any]:
        """The per-round ground truth so far, as ``coco fleet --ground-truth`` writes it."""
        config = self.config
        return self.truth.to_dict(
            spec=self.spec,
            seed=config.seed,
            model="sensors",
            round_seconds=config.round_seconds,
            day_seconds=DAY_SECONDS if config.day_seconds is None else config.day_seconds,
            run={"devices": config.devices, "rounds": config.rounds},
        )

    def reports(
        self, index: int, round_: int, rng: np.random.Generator
    ) -> list[tuple[str, int, int, int]]:
        """The ``index``-th round of readings, randomised, as reports of ``round_`` (at the
        hour of ``round_``'s start in a compressed day, with ``day_seconds``)."""
        config = self.config
        day = config.day_seconds
        hour = None if day is None else hour_of_day(round_ * config.round_seconds, day)
        readings = self.sensors.readings(index, hour=hour)
        keys, signs = self.sensors.encoder(self.config.s).encode_batch(readings, rng)
        seeds, z = LocalMechanism.from_spec(self.spec).randomise_sparse(keys, signs, rng)
        total, present = sparse_totals(keys, signs, self.spec.d)
        self.total = total if self.total.size == 0 else self.total + total
        self.truth.add_sums(round_, total.tolist(), present.tolist(), len(readings))
        truth = readings.sum(axis=0)
        self.truth_sum = truth if self.truth_sum.size == 0 else self.truth_sum + truth
        return [(self.ids[i], round_, int(seeds[i]), int(z[i])) for i in range(self.config.devices)]

    async def publish_all(
        self,
        clients: list[aiomqtt.Client],
        deployment: str,
        rng: np.random.Generator,
        *,
        in_flight: Callable[[], int],
        sink: ReportSink | None,
    ) -> float:
        """Publish every round's reports; returns the seconds it took."""

        def sent_one() -> None:
            self.sent += 1

        start = time.monotonic()
        length = self.config.round_seconds
        for index in range(self.config.rounds):
            if index:  # the next wall-clock round: one report per device per round
                await asyncio.sleep(seconds_to_next_round(length) + 0.01)
            reports = self.reports(index, current_round(length), rng)
            if sink is not None:
                for report in reports:
                    sink(*report)
            await publish_round(
                clients,
                deployment,
                self.spec.fingerprint_int,
                reports,
                in_flight=in_flight,
                window=self.config.window,
                on_sent=sent_one,
            )
            self._latest_truth = self.truth_document()  # one reference: read by HTTP threads
            if self.truth_path is not None:
                write_onto(self.truth_path, None, self._latest_truth)
        return time.monotonic() - start


async def publish_round(
    clients: list[aiomqtt.Client],
    deployment: str,
    fingerprint: int,
    reports: list[tuple[str, int, int, int]],
    *,
    in_flight: Callable[[], int],
    window: int,
    on_sent: Callable[[], None],
) -> None:
    """Each report on its device's ingress topic, spread over ``clients`` (QoS 1)."""

    async def worker(k: int) -> None:
        client = clients[k]
        pending: set[asyncio.Task[None]] = set()
        for device, round_, seed, z in reports[k :: len(clients)]:
            while in_flight() >= window:  # backpressure: keep the broker queue short
                await asyncio.sleep(0.005)
            payload = encode_report(fingerprint, round_, seed, z)
            task = asyncio.create_task(
                client.publish(ingress_topic(deployment, device), payload, qos=1, timeout=30)
            )
            task.add_done_callback(lambda _t: on_sent())
            pending.add(task)
            task.add_done_callback(pending.discard)
            if len(pending) >= 100:
                await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
        if pending:
            await asyncio.gather(*pending)

    async with asyncio.TaskGroup() as tg:
        for k in range(len(clients)):
            tg.create_task(worker(k), name=f"demo-publisher-{k}")


@contextlib.asynccontextmanager
async def connections(url: str, count: int) -> AsyncIterator[list[aiomqtt.Client]]:
    """``count`` MQTT connections to the broker at ``url``, open while the block runs."""
    host, port, _ = parse_broker_url(url)
    async with contextlib.AsyncExitStack() as stack:
        clients = [
            aiomqtt.Client(host, port, timeout=30, max_inflight_messages=100) for _ in range(count)
        ]
        for client in clients:
            client.pending_calls_threshold = 1_000  # many publishes in flight is the plan
            await stack.enter_async_context(client)
        yield clients
