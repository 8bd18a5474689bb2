"""The aggregator's dashboard metrics: the certified epsilon curve, the target, the service's
export of both (real Mosquitto; no mocks); the HTTP routes of the live page."""

from __future__ import annotations

import asyncio
import itertools
import json
import math
import re
import urllib.error
import urllib.request

import pytest
from prometheus_client import CollectorRegistry

from aggregator.accountant import amplify_spec
from aggregator.ledger.levels import epsilon_curve
from aggregator.page.live_page import CONTENT_SECURITY_POLICY, PAGE
from aggregator.service.config import AggregatorConfig
from aggregator.service.http import MetricsServer
from aggregator.service.metrics import (
    CURVE_DEFAULT_START,
    CURVE_MAX_N,
    MAX_CURVE_POINTS,
    AggregatorMetrics,
    epsilon_curve_grid,
)
from aggregator.service.service import Aggregator
from edge import MechanismSpec
from edge.batch_auth import BatchSigner
from tests.asyncutil import run, wait_until
from tests.conftest import Broker

SPEC = MechanismSpec(mechanism="coco", d=12, s=2, epsilon=2.0)
DELTA = 1e-6
KEY = BatchSigner.generate("t").public_key_hex


@pytest.mark.parametrize("min_batch", [1, 2, 7, 50, 100, 1000, 2500, 10**7, 10**8])
def test_grid_starts_at_min_batch_and_is_bounded(min_batch: int) -> None:
    grid = epsilon_curve_grid(min_batch)
    assert grid[0] == min_batch
    assert list(grid) == sorted(set(grid))
    assert len(grid) <= MAX_CURVE_POINTS
    assert all(n <= CURVE_MAX_N for n in grid[1:])
    if min_batch < CURVE_MAX_N:
        assert grid[-1] == CURVE_MAX_N


def test_grid_default_and_invalid() -> None:
    assert epsilon_curve_grid(None)[0] == CURVE_DEFAULT_START
    assert epsilon_curve_grid(1000) == (
        1000,
        3000,
        10**4,
        3 * 10**4,
        10**5,
        3 * 10**5,
        10**6,
        3 * 10**6,
        10**7,
    )
    with pytest.raises(ValueError, match="min_batch must be >= 1, got 0"):
        epsilon_curve_grid(0)


def test_curve_is_the_certified_bound_and_falls_with_n() -> None:
    grid = epsilon_curve_grid(300)[:5]  # the small end: cheap
    curve = epsilon_curve(SPEC, delta=DELTA, grid=grid)
    assert list(curve) == list(grid)
    for n, epsilon in curve.items():
        # the certified mechanism-specific (blanket) bound, never the paper's invalid number
        assert epsilon == amplify_spec(SPEC, n=n, delta=DELTA).epsilon_central
        assert 0 < epsilon <= SPEC.epsilon_effective
    values = list(curve.values())
    assert all(a >= b for a, b in itertools.pairwise(values))
    assert values[-1] < values[0]


def test_batch_sizes_of_the_epsilon() -> None:
    registry = CollectorRegistry()
    metrics = AggregatorMetrics(registry, spec=SPEC, dims=())
    metrics.set_batch_size(smallest=None, latest=None)
    unset = registry.get_sample_value("coco_aggregator_batch_size", {"batch": "latest"})
    assert unset is not None
    assert math.isnan(unset)
    metrics.set_batch_size(smallest=120, latest=300)
    assert registry.get_sample_value("coco_aggregator_batch_size", {"batch": "smallest"}) == 120
    assert registry.get_sample_value("coco_aggregator_batch_size", {"batch": "latest"}) == 300


def test_target_is_exported_only_when_set() -> None:
    registry = CollectorRegistry()
    AggregatorMetrics(registry, spec=SPEC, dims=())
    assert registry.get_sample_value("coco_aggregator_epsilon_target") is None
    registry = CollectorRegistry()
    AggregatorMetrics(registry, spec=SPEC, dims=(), epsilon_target=0.5)
    assert registry.get_sample_value("coco_aggregator_epsilon_target") == 0.5


def test_curve_labels_are_bounded() -> None:
    registry = CollectorRegistry()
    metrics = AggregatorMetrics(registry, spec=SPEC, dims=())
    metrics.set_epsilon_curve({100: 1.5, 1000: 0.5})
    value = registry.get_sample_value
    assert value("coco_aggregator_epsilon_central_curve", {"n": "100"}) == 1.5
    assert value("coco_aggregator_epsilon_central_curve", {"n": "1000"}) == 0.5
    with pytest.raises(ValueError, match="at most"):
        metrics.set_epsilon_curve(dict.fromkeys(range(1, MAX_CURVE_POINTS + 2), 1.0))


@pytest.mark.parametrize("target", [0.0, -1.0, math.inf, math.nan])
def test_invalid_target_is_refused(target: float) -> None:
    with pytest.raises(ValueError, match="epsilon_target must be finite and > 0"):
        AggregatorConfig(
            broker="mqtt://127.0.0.1:1",
            deployment="t",
            spec=SPEC,
            delta=DELTA,
            min_batch=10,
            batch_public_key=KEY,
            epsilon_target=target,
        )


@pytest.mark.integration
@pytest.mark.timeout(60)
def test_service_exports_curve_and_target(mosquitto: Broker) -> None:
    registry = CollectorRegistry()
    config = AggregatorConfig(
        broker=mosquitto.url,
        deployment="t",
        spec=SPEC,
        delta=DELTA,
        http_port=None,
        min_batch=50_000,  # a short grid keeps the test quick
        batch_public_key=KEY,
        epsilon_target=0.25,
        client_id=f"agg-metrics-{mosquitto.port}",
    )

    def exported() -> bool:
        labels = {"n": str(CURVE_MAX_N)}
        sample = registry.get_sample_value("coco_aggregator_epsilon_central_curve", labels)
        return sample is not None

    async def main() -> None:
        async with Aggregator(config, registry=registry) as agg:
            task = asyncio.create_task(agg.run())
            try:
                await wait_until(exported, 30)
            finally:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)

    run(main(), timeout=50)
    grid = epsilon_curve_grid(50_000)
    for n in grid:
        got = registry.get_sample_value("coco_aggregator_epsilon_central_curve", {"n": str(n)})
        assert got == amplify_spec(SPEC, n=n, delta=DELTA).epsilon_central
    samples = [
        s
        for metric in registry.collect()
        if metric.name == "coco_aggregator_epsilon_central_curve"
        for s in metric.samples
    ]
    assert len(samples) == len(grid)
    assert registry.get_sample_value("coco_aggregator_epsilon_target") == 0.25
    nan = registry.get_sample_value("coco_aggregator_batch_size", {"batch": "smallest"})
    assert nan is not None
    assert math.isnan(nan)  # no batch applied yet


def test_live_page_routes_and_a_page_that_loads_nothing_from_outside() -> None:
    server = MetricsServer(
        host="127.0.0.1", port=0, registry=CollectorRegistry(), estimates=lambda: {"n": 3}
    )
    server.start()
    base = f"http://127.0.0.1:{server.port}"
    try:
        with urllib.request.urlopen(base + "/", timeout=5) as response:
            assert response.status == 200
            assert response.headers["Content-Type"] == "text/html; charset=utf-8"
            assert response.headers["Content-Security-Policy"] == CONTENT_SECURITY_POLICY
            assert response.read() == PAGE
        with urllib.request.urlopen(base + "/favicon.ico", timeout=5) as response:
            assert response.status == 204
        with urllib.request.urlopen(base + "/estimates?x=1", timeout=5) as response:
            assert json.load(response) == {"n": 3}
        with pytest.raises(urllib.error.HTTPError) as excinfo:
            urllib.request.urlopen(base + "/nothing", timeout=5)
        assert excinfo.value.code == 404
        excinfo.value.close()
    finally:
        server.stop()
    html = PAGE.decode()
    # one document: no linked script, style, font or image; the one URL is the SVG namespace
    assert not re.search(r"<(script|link|img|iframe)\b[^>]*\b(src|href)=", html)
    assert re.findall(r"https?://[^\s\"']+", html) == ["http://www.w3.org/2000/svg"]
    assert "@import" not in html
    assert "url(" not in html
    assert 'fetch("estimates"' in html
