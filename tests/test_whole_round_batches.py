"""Each round leaves the shuffler whole: the README's lab example (rounds of 1,000 devices,
min_batch 100) gives batches of 1,000, and the aggregator's certified epsilon_central is
the one of n = 1,000, not of the floor."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry

from aggregator.accountant import amplify_spec
from aggregator.service.config import AggregatorConfig
from aggregator.service.service import Aggregator
from broker.service.shuffler import Shuffler, ShufflerConfig
from edge.batch_auth import BatchSigner
from edge.spec import MechanismSpec
from sim.fleet.run import Fleet, FleetConfig
from tests import pipeline
from tests.asyncutil import run, value, wait_until
from tests.conftest import Broker

pytestmark = pytest.mark.integration

SPEC = MechanismSpec(mechanism="coco", d=6, s=2, epsilon=1.0)
DEP, DEVICES, ROUNDS, MIN_BATCH, L = "lab", 1_000, 3, 100, 2


def test_rounds_of_a_thousand_arrive_as_batches_of_a_thousand(mosquitto: Broker) -> None:
    signer = BatchSigner.generate(DEP)
    shuffler_registry = CollectorRegistry()

    async def scenario() -> Aggregator:
        shuffler = Shuffler(
            ShufflerConfig(
                broker=mosquitto.url,
                deployment=DEP,
                spec=SPEC,
                min_batch=MIN_BATCH,
                round_seconds=L,
                max_skew=0.5,
                flush_interval=0.1,
                signer=signer,
            ),
            registry=shuffler_registry,
        )
        aggregator = Aggregator(
            AggregatorConfig(
                broker=mosquitto.url,
                deployment=DEP,
                spec=SPEC,
                delta=1e-6,
                batch_public_key=signer.public_key_hex,
                min_batch=MIN_BATCH,
                round_seconds=L,
                http_port=None,
            ),
            registry=CollectorRegistry(),
        )
        fleet = Fleet(
            FleetConfig(
                broker=mosquitto.url,
                deployment=DEP,
                spec=SPEC,
                devices=DEVICES,
                rounds=ROUNDS,
                round_seconds=L,
                mode="multiplexed",
                connections=4,
                seed=3,
            )
        )
        async with pipeline.services(shuffler, aggregator):
            summary = await fleet.run()
            assert summary["reports_published"] == DEVICES * ROUNDS
            # every round closes (L + skew after its end) and is applied
            await wait_until(
                lambda: aggregator.state.n == DEVICES * ROUNDS,
                30,
                progress=lambda: aggregator.state.n,
            )
        return aggregator

    aggregator = run(scenario(), 90)
    assert value(shuffler_registry, "coco_shuffler_batches_released_total") == ROUNDS
    assert value(shuffler_registry, "coco_shuffler_batch_size_sum") == DEVICES * ROUNDS
    assert aggregator.counters.batches == ROUNDS
    snapshot = aggregator.snapshot()
    assert snapshot["batch_size"] == {"smallest": DEVICES, "latest": DEVICES}
    certified = amplify_spec(SPEC, n=DEVICES, delta=1e-6).epsilon_central
    assert snapshot["epsilon_central"]["smallest"] == certified
    floor = amplify_spec(SPEC, n=MIN_BATCH, delta=1e-6).epsilon_central
    assert certified < floor / 2  # what whole rounds buy over batches of the floor
