"""The live page's chart over time and ``coco aggregator plot`` against a real aggregator:
sealed batches of six recent rounds through Mosquitto, ``/series`` from the service, the
simulation truth from ``--truth FILE`` at ``/truth``; headless Chromium draws the estimate
with its band and the truth beside it (tests/deploy/test_live_page.py runs the browser)."""

from __future__ import annotations

import asyncio
import json
import math
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from aggregator.service.service import Aggregator
from sim.cli import app
from tests.aggregator.test_service import (
    SPEC,
    batch,
    config,
    moving,
    publish,
    reports,
    run,
    with_aggregator,
)
from tests.conftest import Broker
from tests.deploy.test_live_page import _Attributes, chromium, chromium_binary, get
from tests.waiting import until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

R = 10
"""Round length of the test's deployment (seconds)."""


def truth_document(rounds: list[int]) -> dict[str, Any]:
    """A ground-truth file (coco fleet's format) with a made-up truth for ``rounds``."""
    d = SPEC.d
    return {
        "simulation_only": True,
        "note": "SIMULATION ONLY",
        "spec": SPEC.to_dict(),
        "seed": 1,
        "model": "sensors",
        "round_seconds": R,
        "day_seconds": 60,
        "runs": [],
        "overall": {},
        "rounds": [
            {
                "round": r,
                "n": 100,
                "mean": [round(0.2 * math.cos(r + j), 6) for j in range(d)],
                "freq": [0.5] * d,
                "total": [0] * d,
                "present": [0] * d,
            }
            for r in rounds
        ],
    }


def test_the_page_draws_the_series_with_its_band_and_the_simulation_truth(
    mosquitto: Broker, tmp_path: Path
) -> None:
    binary = chromium_binary()
    now_round = int(time.time() // R)
    rounds = [now_round - 6 + k for k in range(6)]
    truth = tmp_path / "truth.json"
    truth.write_text(json.dumps(truth_document(rounds)))
    seen: dict[str, Any] = {}

    async def body(agg: Aggregator) -> None:
        for k, r in enumerate(rounds, start=1):
            await publish(mosquitto, batch(reports(150, k), k, round_=r))
        await until(lambda: agg.counters.batches == len(rounds), progress=moving(agg))
        url = f"http://127.0.0.1:{agg.http_port}/"
        seen["series"] = json.loads(
            (await asyncio.to_thread(get, url + f"series?from={rounds[0] * R - 1}&dims=0"))[0]
        )
        seen["dom"] = await asyncio.to_thread(
            chromium, binary, tmp_path / "profile", "--dump-dom", url
        )
        await asyncio.to_thread(
            chromium,
            binary,
            tmp_path / "profile",
            "--window-size=1000,1800",
            f"--screenshot={tmp_path / 'live_page_series.png'}",
            url,
        )
        out = tmp_path / "series.png"
        result = await asyncio.to_thread(
            CliRunner().invoke,
            app,
            ["aggregator", "plot", "--url", url, "--dims", "0,2", "-o", str(out)],
        )
        seen["plot"] = (result.exit_code, result.output, out)

    cfg = replace(config(mosquitto, None), round_seconds=R, truth_file=truth)
    run(with_aggregator(cfg, body))

    series = seen["series"]
    assert [row[0] for row in series["rows"]] == rounds
    chart = _Attributes("series-chart")
    chart.feed(seen["dom"])
    drawn = json.loads(chart.attributes.get("data-rows") or "null")
    at = {name: series["columns"].index(name) for name in ("start", "end", "estimates")}
    expected = [
        [
            (row[at["start"]] + row[at["end"]]) / 2,
            *(row[at["estimates"]][key][0] for key in ("mean", "mean_lo", "mean_hi")),
        ]
        for row in series["rows"]
    ]
    assert drawn == expected  # the rows of /series, dimension 0, each with its interval
    assert all(lo < mean < hi for _, mean, lo, hi in drawn)
    doc = truth_document(rounds)
    assert json.loads(chart.attributes.get("data-truth") or "null") == [
        [(r + 0.5) * R, x["mean"][0]] for r, x in zip(rounds, doc["rounds"], strict=True)
    ]
    dom: str = seen["dom"]
    for name in ("band", "estimate", "truth"):
        assert f'data-series="{name}"' in dom, name
    key = _Attributes("series-truth-key")
    key.feed(dom)
    assert "hidden" not in key.attributes  # the legend names the simulation truth
    assert "simulation truth" in dom

    code, output, out = seen["plot"]
    assert code == 0, output
    assert output.strip() == f"wrote {out}: 6 rows, dims 0,2, with the simulation truth"
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
