"""An HTTP server handed to the aggregator (``Aggregator(http=...)``, what ``coco demo
--serve`` does): the service serves on it while entered, leaves it running, and it goes on
serving the stopped service's final state on the same port."""

from __future__ import annotations

import asyncio
import json
import urllib.error
import urllib.request
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from aggregator.service.http import MetricsServer
from aggregator.service.service import Aggregator
from tests.aggregator.test_service import batch, config, publish, reports, run
from tests.conftest import Broker
from tests.waiting import until

pytestmark = pytest.mark.integration


def status_and_body(url: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            return int(response.status), response.read()
    except urllib.error.HTTPError as exc:
        body = exc.read()
        exc.close()
        return exc.code, body


def test_a_lent_server_outlives_the_service(mosquitto: Broker) -> None:
    server = MetricsServer(
        host="127.0.0.1",
        port=0,
        registry=CollectorRegistry(),
        estimates=lambda: {"before": True},
        recovered=lambda: False,
    )
    server.start()
    base = f"http://127.0.0.1:{server.port}/"
    seen: dict[str, Any] = {}

    async def main() -> None:
        cfg = config(mosquitto, None, http_port=None)
        async with Aggregator(cfg, http=server) as agg:
            assert agg.http_port == server.port
            task = asyncio.create_task(agg.run())
            try:
                await asyncio.wait_for(agg.subscribed.wait(), 10)
                await publish(mosquitto, batch(reports(300, 1), 1))
                await until(lambda: agg.counters.batches == 1 and agg.privacy_settled)
                seen["during"] = await asyncio.to_thread(status_and_body, base + "estimates")
                seen["ready"] = await asyncio.to_thread(status_and_body, base + "ready")
            finally:
                task.cancel()
                with pytest.raises(asyncio.CancelledError):
                    await task
        seen["after"] = await asyncio.to_thread(status_and_body, base + "estimates")
        seen["ready after"] = await asyncio.to_thread(status_and_body, base + "ready")

    try:
        assert status_and_body(base + "estimates")[0] == 503  # not recovered: nothing yet
        run(main())
        seen["after the loop"] = status_and_body(base + "estimates")
        seen["metrics"] = status_and_body(base + "metrics")
    finally:
        server.stop()
    assert seen["ready"][0] == 200
    for when in ("during", "after", "after the loop"):
        code, body = seen[when]
        assert code == 200, when
        assert json.loads(body)["n"] == 300, when
    assert seen["ready after"][0] == 503  # the service stopped: not subscribed any more
    assert b"coco_aggregator_reports_total 300.0" in seen["metrics"][1]
