"""Publishing off the batch path: estimates rebuilt on request, the privacy level off the loop.

:meth:`Aggregator.handle_batch` is driven directly (no broker); the HTTP endpoint is real."""

from __future__ import annotations

import asyncio
import json
import urllib.request

import pytest

from aggregator.accountant import amplify_spec
from aggregator.service.service import Aggregator
from tests.aggregator.test_batch_rules import agg_config
from tests.aggregator.test_service import DELTA, MIN_BATCH, SPEC, batch, reports


def test_batches_are_published_on_request_not_per_batch() -> None:
    seen: dict[str, object] = {}

    async def main() -> None:
        async with Aggregator(agg_config(http_port=0)) as agg:
            before = agg.publisher.document["n"]
            assert await agg.handle_batch(batch(reports(MIN_BATCH, 1), 1)) == "applied"
            assert agg.publisher.document["n"] == before == 0  # nothing rebuilt by the batch itself
            url = f"http://127.0.0.1:{agg.http_port}/estimates"

            def get() -> object:
                with urllib.request.urlopen(url, timeout=10) as response:
                    return json.loads(response.read())

            seen["http"] = await asyncio.to_thread(get)  # the loop stays free meanwhile
            seen["gauge"] = agg.registry.get_sample_value("coco_aggregator_n")

    asyncio.run(main())
    document = seen["http"]
    assert isinstance(document, dict)
    assert document["n"] == MIN_BATCH
    epsilon = amplify_spec(SPEC, n=MIN_BATCH, delta=DELTA).epsilon_central
    assert document["epsilon_central"] == {"smallest": epsilon, "latest": epsilon}
    assert seen["gauge"] == MIN_BATCH


def test_publish_interval_must_be_positive() -> None:
    assert agg_config().publish_interval == 1.0
    with pytest.raises(ValueError, match="publish_interval must be > 0, got 0"):
        agg_config(publish_interval=0)
