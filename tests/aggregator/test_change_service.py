"""The change detector in a running aggregator (a real Mosquitto): a step in the published
batches' data raises ``coco_aggregator_change_alarm`` for the changed dimensions and not for
the others, and a restart recomputes the same state from the recovered series."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pytest
from prometheus_client import CollectorRegistry

from aggregator.series.cusum import CusumDesign
from aggregator.series.detector import DEFAULT_ARL
from aggregator.service.service import Aggregator
from edge import LocalMechanism
from tests.aggregator.test_service import SPEC, Reports, batch, config, moving, publish, run
from tests.aggregator.test_service import with_aggregator as serve
from tests.conftest import Broker
from tests.waiting import until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

R = 60
CYCLE = 4 * R
"""Four rounds a cycle: the detector learns in four rows."""
CHANGED = (1, 4)
PER_ROUND = 2000
QUIET, STEPPED = 8, 10
"""Rows before the step (the first cycle learns), rows after it."""


def reports(n: int, rng: np.random.Generator, *, stepped: bool) -> Reports:
    """``n`` reports of ``s`` random channels, signs +-1 at random; after the step every
    sign on a changed channel is +1 (its mean moves by ``s / d`` times its share, 1/6)."""
    keys = np.array([rng.choice(SPEC.d, size=SPEC.s, replace=False) for _ in range(n)])
    signs = rng.choice([-1, 1], size=(n, SPEC.s))
    if stepped:
        signs[np.isin(keys, CHANGED)] = 1
    return LocalMechanism.from_spec(SPEC).randomise_sparse(keys, signs, rng)


def gauges(registry: CollectorRegistry) -> dict[str, list[float | None]]:
    return {
        name: [
            registry.get_sample_value(f"coco_aggregator_change_{name}", {"dim": str(j)})
            for j in range(SPEC.d)
        ]
        for name in ("statistic", "alarm")
    }


def charted(agg: Aggregator) -> int:
    watch = agg.publisher.series.watch
    return -1 if watch is None else watch.detector.rows


def test_a_step_raises_the_alarm_of_the_changed_dims(mosquitto: Broker, tmp_path: Path) -> None:
    rng = np.random.default_rng(23)
    newest = int(time.time()) // R - 2  # every row settled (ended a round before now)
    rounds = list(range(newest - QUIET - STEPPED + 1, newest + 1))
    payloads = [
        batch(reports(PER_ROUND, rng, stepped=i >= QUIET), i + 1, round_=r)
        for i, r in enumerate(rounds)
    ]
    cfg = config(mosquitto, tmp_path, round_seconds=R, cycle_seconds=CYCLE, metrics_dims=SPEC.d)
    seen: dict[str, dict[str, list[float | None]]] = {}

    async def first(agg: Aggregator) -> None:
        await publish(mosquitto, *payloads)
        await until(lambda: agg.counters.batches == len(payloads), progress=moving(agg))
        await until(lambda: charted(agg) == len(rounds), progress=moving(agg))
        seen["first"] = gauges(registries[0])

    async def again(agg: Aggregator) -> None:
        await until(lambda: charted(agg) == len(rounds), progress=moving(agg))
        seen["again"] = gauges(registries[1])

    registries = [CollectorRegistry(), CollectorRegistry()]
    run(serve(cfg, first, registries[0]))
    run(serve(cfg, again, registries[1]))  # recovered from the checkpoint and series file
    alarm = seen["first"]["alarm"]
    statistic = seen["first"]["statistic"]
    print(f"statistic {statistic}, alarm {alarm}")
    assert [j for j in range(SPEC.d) if alarm[j] == 1] == list(CHANGED)
    assert all(alarm[j] == 0 for j in range(SPEC.d) if j not in CHANGED)
    threshold = CusumDesign.for_arl(DEFAULT_ARL).h
    assert all(value is not None and 0 <= value <= threshold for value in statistic)
    assert seen["again"] == seen["first"]  # derived from the rows alone
