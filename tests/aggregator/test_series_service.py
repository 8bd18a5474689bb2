"""``/series``, ``/estimates?window=W`` and the window gauges of a running aggregator (a real
Mosquitto, the real HTTP server)."""

from __future__ import annotations

import asyncio
import csv
import io
import json
import math
import time
import urllib.error
import urllib.request
from typing import Any

import pytest
from prometheus_client import CollectorRegistry
from typer.testing import CliRunner

from aggregator.accountant.history import epsilon_total_rounds
from aggregator.series.documents import COLUMNS, ESTIMATE_FIELDS
from aggregator.service.cli import aggregator_app
from aggregator.service.service import Aggregator
from tests.aggregator.test_service import (
    DELTA,
    SPEC,
    batch,
    config,
    moving,
    offline,
    publish,
    reports,
    run,
    with_aggregator,
)
from tests.conftest import Broker
from tests.waiting import until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

R = 60


def get(url: str) -> tuple[int, str, bytes]:
    """Status, content type and body of ``GET url`` (an HTTP error's too)."""
    try:
        with urllib.request.urlopen(url, timeout=30) as response:
            return response.status, response.headers["Content-Type"], response.read()
    except urllib.error.HTTPError as exc:
        with exc:
            return exc.code, exc.headers["Content-Type"], exc.read()


BAD = [
    ("/series?from=abc", "series"),
    ("/series?from=20&to=10", "series"),
    ("/series?dims=99", "series"),
    ("/series?dims=1,x", "series"),
    ("/series?step=0", "series"),
    ("/series?format=xml", "series"),
    ("/series?foo=1", "series"),
    ("/estimates?window=1y", "estimates"),
    ("/estimates?window=r0", "estimates"),
    ("/estimates?window=", "estimates"),
    ("/estimates?window=1h&window=2h", "estimates"),
]


def test_series_windows_and_gauges(mosquitto: Broker) -> None:  # noqa: PLR0915 (one run)
    registry = CollectorRegistry()
    newest = int(time.time()) // R - 1  # three rounds that ended before now
    rounds = [newest - 2, newest - 1, newest]
    reps = [reports(300, 1), reports(120, 2), reports(200, 3)]
    fetched: dict[str, Any] = {}

    async def body(agg: Aggregator) -> None:
        await publish(
            mosquitto,
            *(
                batch(rep, i + 1, round_=r)
                for i, (rep, r) in enumerate(zip(reps, rounds, strict=True))
            ),
        )
        await until(lambda: agg.counters.batches == 3, progress=moving(agg))
        base = f"http://127.0.0.1:{agg.http_port}"

        def fetch(path: str) -> tuple[int, str, bytes]:
            return get(base + path)

        async def ask(path: str) -> tuple[int, str, bytes]:
            return await asyncio.to_thread(fetch, path)

        fetched["series"] = await ask("/series")
        fetched["csv"] = await ask("/series?dims=3,0&format=csv")
        fetched["hourly"] = await ask(f"/series?step=1h&from={rounds[0] * R - 1}")
        fetched["range"] = await ask(f"/series?from={rounds[0] * R}&to={rounds[1] * R + R}")
        fetched["bad"] = [(await ask(path), endpoint) for path, endpoint in BAD]

        # the configured windows' levels are computed in the background, with no request
        gauge = registry.get_sample_value

        def computed(window: str) -> bool:
            value = gauge("coco_aggregator_window_epsilon_total", {"window": window})
            return value is not None and not math.isnan(value)

        await until(lambda: computed("1h") and computed("r2"), 120, progress=moving(agg))

        def period(label: str) -> float | None:
            return gauge("coco_aggregator_epsilon_total_period", {"period": label})

        # the level that covers every batch (an earlier one may hold fewer rounds)
        await until(
            lambda: agg.privacy_settled and not math.isnan(period("1h") or math.nan),
            120,
            progress=moving(agg),
        )
        fetched["periods"] = {label: period(label) for label in ("1h", "1m")}
        fetched["estimates"] = json.loads((await ask("/estimates"))[2])
        fetched["r2"] = json.loads((await ask("/estimates?window=r2"))[2])
        fetched["1h"] = json.loads((await ask("/estimates?window=1h"))[2])
        fetched["metrics"] = {
            (name, tuple(sorted(labels.items()))): gauge(name, labels)
            for name, labels in [
                ("coco_aggregator_window_n", {"window": "1h"}),
                ("coco_aggregator_window_n", {"window": "r2"}),
                ("coco_aggregator_window_epsilon_total", {"window": "1h"}),
            ]
        }
        fetched["dims"] = {
            j: (
                gauge("coco_aggregator_window_estimate_mean", {"window": "1h", "dim": str(j)}),
                gauge(
                    "coco_aggregator_window_estimate_mean_halfwidth",
                    {"window": "1h", "dim": str(j)},
                ),
            )
            for j in range(SPEC.d)
        }
        # the malformed queries harmed nothing: it serves and applies on
        assert (await ask("/ready"))[0] == 200
        await publish(mosquitto, batch(reports(100, 4), 9, round_=newest))
        await until(lambda: agg.counters.batches == 4, progress=moving(agg))
        fetched["after"] = await ask("/series?dims=0")
        # `coco aggregator series` prints the same answer; a malformed query, its one line
        fetched["cli"] = await asyncio.to_thread(
            CliRunner().invoke, aggregator_app, ["series", "--url", base, "--dims", "2,0"]
        )
        fetched["cli_doc"] = await ask("/series?dims=2,0")
        fetched["cli_csv"] = await asyncio.to_thread(
            CliRunner().invoke,
            aggregator_app,
            ["series", "--url", base + "/", "--step", "1h", "--format", "csv"],
        )
        fetched["csv_doc"] = await ask("/series?step=1h&format=csv")
        fetched["cli_bad"] = await asyncio.to_thread(
            CliRunner().invoke, aggregator_app, ["series", "--url", base, "--dims", "99"]
        )

    cfg = config(
        mosquitto,
        None,
        round_seconds=R,
        windows=("1h", "r2"),
        metrics_dims=SPEC.d,
        privacy_periods=("1h", "1m"),
    )
    run(with_aggregator(cfg, body, registry))

    # the rolling periods: the last hour holds every round, so its level is the total; the
    # last minute at most the newest round (a round ends at the start of the next)
    everything = epsilon_total_rounds(SPEC, {300: 1, 120: 1, 200: 1}, delta=DELTA)
    assert fetched["periods"]["1h"] == pytest.approx(everything, rel=1e-9)  # float order
    assert fetched["estimates"]["epsilon_total"] == pytest.approx(everything, rel=1e-9)
    shown = fetched["estimates"]["epsilon_total_period"]
    assert set(shown) == {"1h", "1m"}
    newest_only = epsilon_total_rounds(SPEC, {200: 1}, delta=DELTA)
    minute = fetched["periods"]["1m"]
    assert minute is not None
    assert math.isnan(minute) or minute == pytest.approx(newest_only, rel=1e-9)

    # /series: one row per round, each the round's own estimate
    status, content_type, data = fetched["series"]
    assert (status, content_type) == (200, "application/json")
    document = json.loads(data)
    assert document["columns"] == list(COLUMNS)
    assert document["dims"] == list(range(SPEC.d))
    assert document["round_seconds"] == R
    assert document["step"] == "round"
    assert [row[:7] for row in document["rows"]] == [
        [r, r * R, r * R + R, 1, 300 if i == 0 else 120 if i == 1 else 200, 1, rep[0].size]
        for i, (r, rep) in enumerate(zip(rounds, reps, strict=True))
    ]
    for row, rep in zip(document["rows"], reps, strict=True):
        assert row[7] == offline(rep).estimate().to_dict()
    # a range: rows whose end lies in (from, to]
    assert [row[0] for row in json.loads(fetched["range"][2])["rows"]] == rounds[:2]
    # steps of an hour hold every round once, merged exactly
    hourly = json.loads(fetched["hourly"][2])
    assert hourly["step"] == 3600
    assert sum(row[4] for row in hourly["rows"]) == 620
    if len(hourly["rows"]) == 1:
        assert hourly["rows"][0][7] == offline(*reps).estimate().to_dict()
    # CSV, restricted to dims 3 and 0
    status, content_type, data = fetched["csv"]
    assert (status, content_type) == (200, "text/csv; charset=utf-8")
    table = list(csv.reader(io.StringIO(data.decode())))
    assert table[0][:7] == list(COLUMNS[:7])
    assert table[0][7:10] == ["mean_3", "mean_lo_3", "mean_hi_3"]
    assert len(table) == 4
    for line, rep in zip(table[1:], reps, strict=True):
        est = offline(rep).estimate()
        assert float(line[7]) == est.mean[3]
        assert float(line[13]) == est.mean[0]

    # every malformed query: a 400 of one line, counted by endpoint
    for (status, content_type, data), _ in fetched["bad"]:
        assert status == 400
        assert content_type == "text/plain; charset=utf-8"
        assert data.decode().count("\n") == 1
        assert len(data) > 10
    for endpoint in ("series", "estimates"):
        count = sum(1 for _, e in BAD if e == endpoint) + (endpoint == "series")  # the CLI's
        got = registry.get_sample_value(
            "coco_aggregator_http_bad_requests_total", {"endpoint": endpoint}
        )
        assert got == count
    assert fetched["cli"].exit_code == 0
    assert json.loads(fetched["cli"].stdout) == json.loads(fetched["cli_doc"][2])
    assert fetched["cli_csv"].exit_code == 0
    assert fetched["cli_csv"].stdout == fetched["csv_doc"][2].decode()
    assert fetched["cli_bad"].exit_code == 1
    assert "HTTP 400: unknown dimension 99" in fetched["cli_bad"].stderr
    after = json.loads(fetched["after"][2])
    assert [row[4] for row in after["rows"]] == [300, 120, 300]

    # a window of the two newest rounds: their merge, their level
    r2 = fetched["r2"]
    assert r2["n"] == 320
    assert r2["estimates"] == offline(reps[1], reps[2]).estimate().to_dict()
    sizes = {120: 1, 200: 1}
    assert (
        r2["epsilon_total"]
        == r2["window"]["epsilon_total"]
        == epsilon_total_rounds(SPEC, sizes, delta=DELTA)
    )
    assert r2["batch_size"] == {"smallest": 120, "latest": 200}
    assert r2["window"]["rounds"] == 2
    assert r2["window"]["from"] == rounds[1] * R
    assert r2["window"]["to"] == rounds[2] * R + R
    assert r2["delta"] == DELTA
    assert r2["spec"] == SPEC.to_dict()
    one_hour = fetched["1h"]
    assert one_hour["n"] == 620
    assert one_hour["estimates"] == offline(*reps).estimate().to_dict()
    assert one_hour["epsilon_total"] == epsilon_total_rounds(
        SPEC, {120: 1, 200: 1, 300: 1}, delta=DELTA
    )

    # the gauges are the windowed documents' numbers
    metrics = fetched["metrics"]
    assert metrics[("coco_aggregator_window_n", (("window", "1h"),))] == 620
    assert metrics[("coco_aggregator_window_n", (("window", "r2"),))] == 320
    assert (
        metrics[("coco_aggregator_window_epsilon_total", (("window", "1h"),))]
        == (one_hour["epsilon_total"])
    )
    est = one_hour["estimates"]
    for j, (mean, halfwidth) in fetched["dims"].items():
        assert mean == est["mean"][j]
        assert halfwidth == pytest.approx((est["mean_hi"][j] - est["mean_lo"][j]) / 2)
    assert set(ESTIMATE_FIELDS) <= set(est)


def test_no_round_length_no_series(mosquitto: Broker) -> None:
    """Without a round length the service keeps no series: 404, and everything else serves."""
    fetched: dict[str, Any] = {}

    async def body(agg: Aggregator) -> None:
        base = f"http://127.0.0.1:{agg.http_port}"
        for path in ("/series", "/estimates?window=1h", "/estimates", "/ready"):
            fetched[path] = await asyncio.to_thread(get, base + path)

    run(with_aggregator(config(mosquitto, None), body))
    assert fetched["/series"][0] == 404
    assert fetched["/estimates?window=1h"][0] == 404
    assert fetched["/estimates"][0] == 200
    assert fetched["/ready"][0] == 200
    with pytest.raises(ValueError, match="round length"):
        config(mosquitto, None, windows=("1h",))
    with pytest.raises(ValueError, match="at most 8"):
        config(mosquitto, None, round_seconds=R, windows=[f"{k}m" for k in range(1, 10)])
