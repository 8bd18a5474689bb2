"""docs/estimates.md documents the ``/estimates`` document: a live aggregator's document has
exactly the documented keys, of the documented types, and its ``estimates`` object exactly
the documented estimate fields."""

from __future__ import annotations

import asyncio
import json
import re
import urllib.request
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from aggregator.service.service import Aggregator
from sim.demo.pipeline import sensor_channels
from tests.aggregator.test_service import (
    ROOT,
    batch,
    config,
    moving,
    publish,
    reports,
    run,
    with_aggregator,
)
from tests.conftest import Broker
from tests.waiting import until

pytestmark = pytest.mark.integration

TYPES: dict[str, tuple[type, ...]] = {
    "string": (str,),
    "object": (dict,),
    "integer": (int,),
    "number": (int, float),
    "number or null": (int, float, type(None)),
    "integer or null": (int, type(None)),
    "string or null": (str, type(None)),
    "boolean": (bool,),
    "array": (list,),
}


def documented_table(heading: str) -> dict[str, list[str]]:
    """``key -> [cells after the key]`` of the first table under ``## heading``."""
    text = (ROOT / "docs" / "estimates.md").read_text()
    section = text.split(f"## {heading}\n", 1)[1].split("\n## ", 1)[0]
    rows: dict[str, list[str]] = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if not line.startswith("|") or len(cells) < 2 or set(cells[0]) <= {"-", " "}:
            continue
        for key in re.findall(r"`([a-z0-9_]+)`", cells[0]):
            rows[key] = cells[1:]
    rows.pop("key", None)
    rows.pop("field", None)
    return rows


OPTIONAL = {"channels"}
"""Keys only a configuration with sensor channels has."""


@pytest.mark.parametrize("channels", [False, True], ids=["dimensions", "sensor-channels"])
def test_a_live_document_has_exactly_the_documented_keys(
    mosquitto: Broker, tmp_path: Path, channels: bool
) -> None:
    fetched: dict[str, Any] = {}

    async def body(agg: Aggregator) -> None:
        await publish(mosquitto, batch(reports(80, 1), 1), batch(reports(60, 2), 2))
        await until(lambda: agg.counters.batches == 2 and agg.privacy_settled, progress=moving(agg))
        url = f"http://127.0.0.1:{agg.http_port}/estimates"

        def get() -> Any:
            with urllib.request.urlopen(url, timeout=5) as response:
                return json.loads(response.read())

        fetched.update(await asyncio.to_thread(get))

    cfg = config(mosquitto, tmp_path)
    if channels:
        cfg = replace(cfg, channels=sensor_channels(cfg.spec.d))
    run(with_aggregator(cfg, body))
    documented = documented_table("The `/estimates` document")
    assert set(fetched) == set(documented) - (set() if channels else OPTIONAL)
    if channels:
        assert [c["name"] for c in fetched["channels"]][:2] == ["temperature", "humidity"]
        assert all(c["value_lo"] < c["value"] < c["value_hi"] for c in fetched["channels"])
    history = fetched["privacy_history"]
    assert [p[1] for p in history["points"]][-1] == fetched["batches_accounted"]
    for key, (kind, _meaning) in documented.items():
        if key in fetched:
            assert isinstance(fetched[key], TYPES[kind]), (key, fetched[key])
    # two batches without a manifest: a participation each, since nothing tells which
    # rounds their reports were sent in (aggregator/ledger/privacy_ledger.py)
    assert fetched["counters"]["batches"] == 2
    assert fetched["batches_accounted"] == 2
    assert fetched["epsilon_total"] >= fetched["epsilon_central"]["smallest"] > 0
    fields = documented_table("The estimates")
    assert set(fetched["estimates"]) == set(fields)
