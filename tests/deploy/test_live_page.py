"""The live page at ``/`` in a real headless browser, against a real aggregator.

A real Mosquitto (tests/conftest.py) carries sealed batches to an
:class:`~aggregator.service.service.Aggregator`; Debian's ``chromium`` then loads the page with
``--headless=new --dump-dom`` under a virtual-time budget (the page's first read of
``/estimates`` completes within it: virtual time waits for pending fetches) and prints the
DOM after the script ran. Every element with ``data-field`` carries the raw number in
``data-value``; the test compares those with ``/estimates`` (exactly where the page copies
a value, within 1e-12 where it derives one: the interval half-width) and checks that the
human-readable text renders the same number. A screenshot lands in the test's tmp dir.
A second test serves a sequence of ``/estimates`` documents, one per read, and checks the
epsilon time series the page keeps while it stays open.

Chromium is installed by scripts/test in CI (``apt-get install chromium``); where it is
missing the test is skipped, except under ``CI=true``, where it fails.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import math
import subprocess
import urllib.request
from dataclasses import replace
from html.parser import HTMLParser
from pathlib import Path
from statistics import NormalDist
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from aggregator.estimation.estimators import AggregateState
from aggregator.page.live_page import CONTENT_SECURITY_POLICY, POLL_SECONDS
from aggregator.page.page_data import Channel
from aggregator.service.http import MetricsServer
from aggregator.service.publishing import estimates_document
from aggregator.service.service import Aggregator
from edge.batch_auth import BatchSigner
from sim.demo.pipeline import sensor_channels
from tests.aggregator.test_service import (
    DELTA,
    DEPLOYMENT,
    SPEC,
    batch,
    config,
    moving,
    publish,
    raw_batch,
    reports,
    run,
    with_aggregator,
)
from tests.conftest import Broker
from tests.deploy.debian_tools import debian_binary
from tests.waiting import until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

VIRTUAL_TIME_MS = 5000
"""Virtual time the page runs before the DOM is dumped: two polls (one every 2 s)."""


def chromium_binary() -> str:
    """The Chromium executable (``$COCO_CHROMIUM``, else on the PATH)."""
    return debian_binary("chromium", env="COCO_CHROMIUM")


def chromium(binary: str, profile: Path, *args: str, budget_ms: int = VIRTUAL_TIME_MS) -> str:
    """Run headless Chromium with a throw-away profile; its stdout. ``--no-sandbox``: tests
    run as root in CI, where Chromium's sandbox refuses to start."""
    command = [
        binary,
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--no-first-run",
        "--disable-extensions",
        "--hide-scrollbars",
        f"--user-data-dir={profile}",
        f"--virtual-time-budget={budget_ms}",
        *args,
    ]
    done = subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


class _Attributes(HTMLParser):
    """The attributes of the element with ``id``."""

    def __init__(self, element_id: str) -> None:
        super().__init__()
        self.element_id = element_id
        self.attributes: dict[str, str | None] = {}

    def handle_starttag(
        self,
        tag: str,  # noqa: ARG002 (HTMLParser's signature; any element may hold the id)
        attrs: list[tuple[str, str | None]],
    ) -> None:
        if dict(attrs).get("id") == self.element_id:
            self.attributes = dict(attrs)


class _Fields(HTMLParser):
    """``(data-field, data-dim) -> (data-value, text)`` of a dumped DOM."""

    def __init__(self) -> None:
        super().__init__()
        self.fields: dict[tuple[str, int | None], tuple[str | None, str]] = {}
        self._open: list[tuple[str, tuple[str, int | None], str | None]] = []
        self._text: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        name = a.get("data-field")
        if name is not None:
            dim = a.get("data-dim")
            key = (name, None if dim is None else int(dim))
            self._open.append((tag, key, a.get("data-value")))
            self._text = []

    def handle_data(self, data: str) -> None:
        self._text.append(data)

    def handle_endtag(self, tag: str) -> None:
        if self._open and self._open[-1][0] == tag:
            _, key, value = self._open.pop()
            assert key not in self.fields, f"{key} appears twice"
            self.fields[key] = (value, "".join(self._text).strip())


def page_fields(dom: str) -> dict[tuple[str, int | None], tuple[str | None, str]]:
    parser = _Fields()
    parser.feed(dom)
    return parser.fields


def number(raw: str | None) -> float | None:
    assert raw is not None
    return None if raw == "null" else float(raw)


def assert_rendered(key: tuple[str, int | None], raw: str | None, text: str) -> None:
    """The text is the value with 4 significant digits (integers in full), '-' for none."""
    value = number(raw)
    if value is None:
        assert text == "-", key
    elif value == int(value) and abs(value) < 1e15:
        assert text == str(int(value)), key
    else:
        assert float(text) == pytest.approx(value, rel=5e-4), key


def halfwidths(estimates: dict[str, Any], name: str) -> list[float | None]:
    """What the page shows: ``(hi - lo) / 2`` where ``/estimates`` has bounds, else ``z SE``."""
    lo, hi = estimates.get(f"{name}_lo"), estimates.get(f"{name}_hi")
    if lo is not None and hi is not None:
        pairs = zip(lo, hi, strict=True)
        return [None if a is None or b is None else (b - a) / 2 for a, b in pairs]
    z = NormalDist().inv_cdf(0.5 + estimates["confidence"] / 2)
    return [None if se is None else z * se for se in estimates[f"{name}_se"]]


def get(url: str) -> tuple[bytes, dict[str, str]]:
    with urllib.request.urlopen(url, timeout=5) as response:
        body: bytes = response.read()
        return body, dict(response.headers)


def assert_page_matches(
    fields: dict[tuple[str, int | None], tuple[str | None, str]], doc: dict[str, Any]
) -> None:
    """The page's numbers are ``doc``'s: counts, privacy, every estimate and half-width."""
    assert fields[("status", None)][1] == "live"
    counters = doc["counters"]
    expected: dict[str, Any] = {
        "n": doc["n"],
        "reports": counters["reports"],
        "batches": counters["batches"],
        "rejected": sum(counters["rejected"].values()),
        "duplicates": counters["duplicates"],
        "delta": doc["delta"],
        "epsilon_local": doc["epsilon_local"],
        "epsilon_total": doc["epsilon_total"],
        "batches_accounted": doc["batches_accounted"],
    }
    for name in ("epsilon_central", "epsilon_central_generic", "batch_size"):
        for which in ("smallest", "latest"):
            expected[f"{name}.{which}"] = doc[name][which]
    for name, value in expected.items():
        raw, text = fields[(name, None)]
        assert number(raw) == value, name  # the raw JSON number, exactly
        assert_rendered((name, None), raw, text)
    # epsilon_total per rolling period: the document's map, each shown (or "pending")
    raw, text = fields[("epsilon_total_period", None)]
    assert raw is not None
    periods = doc["epsilon_total_period"]  # the default period, 24h
    assert periods
    assert json.loads(raw) == periods
    for period, level in periods.items():
        # JavaScript's toPrecision(4) is Python's "#.4g" for these magnitudes
        label = f"last {period}: " + ("pending" if level is None else f"{level:#.4g}")
        assert label in text, (period, text)

    estimates = doc["estimates"]
    d = len(estimates["mean"])
    assert d == 12
    widths = {name: halfwidths(estimates, name) for name in ("mean", "freq")}
    for j in range(d):
        for name in ("mean", "freq"):
            raw, text = fields[(name, j)]
            assert number(raw) == estimates[name][j], (name, j)
            assert_rendered((name, j), raw, text)
            raw, text = fields[(f"{name}_halfwidth", j)]
            shown, want = number(raw), widths[name][j]
            assert shown is not None
            assert want is not None
            assert math.isclose(shown, want, rel_tol=1e-12), (name, j)
            assert_rendered((f"{name}_halfwidth", j), raw, text)
    assert not any(key[1] is not None and key[1] >= d for key in fields)


def test_the_page_shows_what_estimates_holds(mosquitto: Broker, tmp_path: Path) -> None:
    binary = chromium_binary()
    r1, r2, r3 = reports(300, 1), reports(120, 2), reports(200, 3)
    outsider = BatchSigner.generate(DEPLOYMENT)
    payloads = [
        batch(r1, 1),
        batch(r2, 2),
        batch(r1, 1),  # a redelivery: a duplicate
        raw_batch(r3, 7),  # not sealed: bad_signature
        batch(r3, 8, signer=outsider),  # sealed by a key nobody trusts: bad_signature
        batch(r3, 3),
    ]
    seen: dict[str, Any] = {}

    async def body(agg: Aggregator) -> None:
        await publish(mosquitto, *payloads)
        await until(
            lambda: agg.counters.batches == 3 and agg.counters.duplicates == 1, progress=moving(agg)
        )
        await until(lambda: sum(agg.counters.rejected.values()) == 2, progress=moving(agg))
        # accounted off the event loop
        await until(lambda: agg.privacy_settled, progress=moving(agg))
        url = f"http://127.0.0.1:{agg.http_port}/"
        before, _ = await asyncio.to_thread(get, url + "estimates")
        seen["html"], seen["headers"] = await asyncio.to_thread(get, url)
        seen["dom"] = await asyncio.to_thread(
            chromium, binary, tmp_path / "profile", "--dump-dom", url
        )
        shot = tmp_path / "live_page.png"
        await asyncio.to_thread(
            chromium,
            binary,
            tmp_path / "profile",
            "--window-size=1000,1400",
            f"--screenshot={shot}",
            url,
        )
        after, _ = await asyncio.to_thread(get, url + "estimates")
        assert before == after  # nothing changed while the browser looked
        seen["doc"] = json.loads(after)
        seen["shot"] = shot

    run(with_aggregator(config(mosquitto, None), body))
    doc: dict[str, Any] = seen["doc"]

    # self-contained: its own origin only, no device anywhere
    html: bytes = seen["html"]
    assert seen["headers"]["Content-Security-Policy"] == CONTENT_SECURITY_POLICY
    assert b"https://" not in html
    assert html.count(b"http://") == html.count(b"http://www.w3.org/2000/svg") == 1
    assert "device" not in json.dumps(doc)

    counters = doc["counters"]
    assert (doc["n"], counters["batches"], counters["duplicates"]) == (620, 3, 1)
    assert counters["rejected"] == {"bad_signature": 2}
    # one round, one participation (aggregator/ledger/privacy_ledger.py): epsilon_total is that
    # round's level
    assert doc["epsilon_total"] >= doc["epsilon_central"]["smallest"] > 0
    assert_page_matches(page_fields(seen["dom"]), doc)

    png = Path(seen["shot"]).read_bytes()
    assert png.startswith(b"\x89PNG\r\n\x1a\n")
    assert len(png) > 20_000  # a rendered page, not a blank one


def test_the_page_keeps_the_epsilon_history_while_open(tmp_path: Path) -> None:
    """Three documents, as after the first, second and third batch (of 300, 120 and 200
    reports), served one per read of /estimates, then the third again: the page's series
    holds one point per batch, with each document's latest and total epsilon."""
    binary = chromium_binary()
    state = AggregateState(SPEC)
    docs = []
    sizes: dict[int, int] = {}
    for size, seed in ((300, 1), (120, 2), (200, 3)):
        state.add(*reports(size, seed))
        sizes[size] = 1
        docs.append(estimates_document(state, delta=DELTA, batch_sizes=sizes, latest_batch=size))
    reads: list[int] = []

    def next_document() -> dict[str, Any]:
        reads.append(1)
        return docs[min(len(reads), len(docs)) - 1]

    server = MetricsServer(
        host="127.0.0.1", port=0, registry=CollectorRegistry(), estimates=next_document
    )
    server.start()
    try:
        url = f"http://127.0.0.1:{server.port}/"
        budget_ms = (len(docs) + 1) * POLL_SECONDS * 1000  # a read or more after the last
        dom = chromium(binary, tmp_path / "profile", "--dump-dom", url, budget_ms=budget_ms)
    finally:
        server.stop()
    assert len(reads) >= len(docs)
    parser = _Attributes("eps-chart")
    parser.feed(dom)
    raw = parser.attributes.get("data-points")
    assert raw is not None
    expected = [
        [
            doc["batches_accounted"],
            doc["epsilon_central"]["smallest"],
            doc["epsilon_central"]["latest"],
            doc["epsilon_total"],
        ]
        for doc in docs
    ]
    assert [row[0] for row in expected] == [1, 2, 3]
    assert json.loads(raw) == expected
    assert parser.attributes.get("data-source") == "page"  # no privacy_history offline


class _Texts(HTMLParser):
    """The text of every element with an ``id`` and of every SVG ``text`` under one."""

    def __init__(self) -> None:
        super().__init__()
        self.ids: list[str] = []
        self.texts: dict[str, list[str]] = {}

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        element_id = dict(attrs).get("id")
        if element_id is not None and tag != "text":
            self.ids.append(element_id)
        self.tag = tag

    def handle_endtag(self, tag: str) -> None:
        if tag in ("svg", "g") and self.ids:
            self.ids.pop()

    def handle_data(self, data: str) -> None:
        if getattr(self, "tag", None) == "text":
            for element_id in self.ids:
                self.texts.setdefault(element_id, []).append(data)


def test_the_page_speaks_the_channels_units_and_keeps_the_service_history(
    mosquitto: Broker, tmp_path: Path
) -> None:
    """With sensor channels configured (the demo's sensor model, 12 channels), the page
    labels each dimension with its channel's name and unit and shows its mean in that
    unit; the epsilon chart draws /estimates' privacy_history (smallest, latest and total
    epsilon, one point per level) on a time axis of clock times."""
    binary = chromium_binary()
    channels = sensor_channels(SPEC.d)
    seen: dict[str, Any] = {}

    async def body(agg: Aggregator) -> None:
        for k, (size, seed) in enumerate(((300, 1), (120, 2), (200, 3)), start=1):
            await publish(mosquitto, batch(reports(size, seed), k))
            await until(lambda k=k: agg.counters.batches == k)  # type: ignore[misc]
            await until(lambda k=k: agg.privacy.batches == k)  # type: ignore[misc]
        await until(lambda: agg.privacy_settled)
        url = f"http://127.0.0.1:{agg.http_port}/"
        seen["dom"] = await asyncio.to_thread(
            chromium, binary, tmp_path / "profile", "--dump-dom", url
        )
        await asyncio.to_thread(
            chromium,
            binary,
            tmp_path / "profile",
            "--window-size=1000,1400",
            f"--screenshot={tmp_path / 'live_page_channels.png'}",
            url,
        )
        seen["doc"] = json.loads((await asyncio.to_thread(get, url + "estimates"))[0])

    cfg = replace(config(mosquitto, None), channels=channels)
    run(with_aggregator(cfg, body))
    doc: dict[str, Any] = seen["doc"]
    dom: str = seen["dom"]
    assert "device" not in json.dumps(doc)

    assert_channels_shown(dom, doc, channels)
    assert_history_shown(dom, doc)


def assert_channels_shown(dom: str, doc: dict[str, Any], channels: tuple[Channel, ...]) -> None:
    """Names and units in the table, each mean in its unit, the chart labelled alike."""
    assert [c["name"] for c in doc["channels"]] == [c.name for c in channels]
    fields = page_fields(dom)
    for j, ch in enumerate(channels):
        assert fields[("label", j)][1] == ch.name
        assert fields[("unit", j)][1] == ch.unit
        value, lo, hi = (doc["channels"][j][k] for k in ("value", "value_lo", "value_hi"))
        assert lo < value < hi
        raw, text = fields[("value", j)]
        assert number(raw) == value
        assert_rendered(("value", j), raw, text)
        raw, text = fields[("value_halfwidth", j)]
        assert math.isclose(number(raw) or 0.0, (hi - lo) / 2, rel_tol=1e-12)
        assert number(fields[("channel_lo", j)][0]) == ch.lo
        assert number(fields[("channel_hi", j)][0]) == ch.hi
    assert ("mean", 0) not in fields  # no ternary columns where the units are known
    texts = _Texts()
    texts.feed(dom)
    labels = texts.texts["est-chart"]
    assert "temperature" in labels
    assert f"{fmt4(doc['channels'][0]['value'])} degC" in labels
    assert "x0" not in labels


def assert_history_shown(dom: str, doc: dict[str, Any]) -> None:
    """The service's privacy history, three series, on a clock-time axis."""
    history = doc["privacy_history"]
    assert history["columns"] == [
        "time", "batches_accounted", "smallest", "latest", "epsilon_total",
    ]  # fmt: skip
    points = history["points"]
    assert [p[1] for p in points] == [1, 2, 3]  # one level per batch accounted
    assert all(a[0] <= b[0] for a, b in itertools.pairwise(points))
    assert points[-1][2:] == [
        doc["epsilon_central"]["smallest"], doc["epsilon_central"]["latest"],
        doc["epsilon_total"],
    ]  # fmt: skip
    assert points[1][2] > points[0][2]  # a 120-report batch: every report's guarantee weakened
    chart = _Attributes("eps-chart")
    chart.feed(dom)
    assert chart.attributes.get("data-source") == "service"
    assert json.loads(chart.attributes.get("data-points") or "null") == [p[1:] for p in points]
    texts = _Texts()
    texts.feed(dom)
    axis = texts.texts["eps-axis"]
    assert any(text.endswith(" UTC") for text in axis), axis
    assert axis[-1].startswith("+")  # seconds since the first point
    assert axis.count("0 s") != 2  # not the old "0 s ... 0 s"
    for series in ("smallest", "latest", "total"):
        assert f'data-series="{series}"' in dom


def fmt4(value: float) -> str:
    """The page's rendering of a non-integer: 4 significant digits, shortest form."""
    return repr(float(f"{value:.4g}"))


def test_one_level_is_one_point_at_its_time(tmp_path: Path) -> None:
    """A document whose privacy_history has a single point (a run of one round): the axis
    shows that point's clock time, not a span of "0 s ... 0 s"."""
    binary = chromium_binary()
    state = AggregateState(SPEC)
    state.add(*reports(300, 1))
    doc = estimates_document(state, delta=DELTA, batch_sizes={300: 1}, latest_batch=300)
    eps = doc["epsilon_central"]["smallest"]
    when = 1_795_000_000.0  # 2026-11-18 11:06:40 UTC
    doc["privacy_history"] = {
        "columns": ["time", "batches_accounted", "smallest", "latest", "epsilon_total"],
        "points": [[when, 1, eps, eps, doc["epsilon_total"]]],
    }
    server = MetricsServer(
        host="127.0.0.1", port=0, registry=CollectorRegistry(), estimates=lambda: doc
    )
    server.start()
    try:
        url = f"http://127.0.0.1:{server.port}/"
        dom = chromium(binary, tmp_path / "profile", "--dump-dom", url)
    finally:
        server.stop()
    texts = _Texts()
    texts.feed(dom)
    assert texts.texts["eps-axis"] == ["11:06:40 UTC", "one level so far (batches accounted 1)"]
    chart = _Attributes("eps-chart")
    chart.feed(dom)
    assert chart.attributes.get("data-source") == "service"
    assert json.loads(chart.attributes.get("data-times") or "null") == [when]


def page_status(binary: str, profile: Path, url: str) -> str:
    """The text the page shows beside its title after its first read of ``/estimates``."""
    return page_fields(chromium(binary, profile, "--dump-dom", url))[("status", None)][1]


def test_the_page_says_live_then_stopped(mosquitto: Broker, tmp_path: Path) -> None:
    """A real aggregator on a lent server: "live" while it runs, "stopped" once it shut down
    (the server keeps serving its final document, ``subscribed`` and ``ready`` false)."""
    binary = chromium_binary()
    server = MetricsServer(
        host="127.0.0.1", port=0, registry=CollectorRegistry(), estimates=lambda: {}
    )
    server.start()
    url = f"http://127.0.0.1:{server.port}/"
    seen: dict[str, Any] = {}

    async def scenario() -> None:
        cfg = config(mosquitto, None, http_port=None)
        async with Aggregator(cfg, registry=CollectorRegistry(), http=server) as agg:
            task = asyncio.create_task(agg.run())
            try:
                await until(agg.subscribed.is_set, 10, what="the aggregator subscribed")
                await publish(mosquitto, batch(reports(300, 1), 1))
                await until(lambda: agg.counters.batches == 1, progress=moving(agg))
                seen["doc"] = json.loads((await asyncio.to_thread(get, url + "estimates"))[0])
                seen["status"] = await asyncio.to_thread(
                    page_status, binary, tmp_path / "running", url
                )
            finally:
                task.cancel()
                async with asyncio.timeout(10):
                    await asyncio.gather(task, return_exceptions=True)

    try:
        run(scenario())
        final = json.loads(get(url + "estimates")[0])
        stopped = page_status(binary, tmp_path / "stopped", url)
    finally:
        server.stop()
    doc = seen["doc"]
    assert (doc["state"], doc["not_ready"], doc["ready"], doc["subscribed"]) == (
        "live",
        None,
        True,
        True,
    )
    assert seen["status"] == "live"
    assert (final["state"], final["not_ready"], final["ready"], final["subscribed"]) == (
        "stopped",
        None,
        False,
        False,
    )
    assert final["n"] == 300  # the final estimates, still served
    assert stopped == "stopped (final state)"


def test_the_page_says_why_it_is_not_ready(tmp_path: Path) -> None:
    """A document whose service is not ready shows the reason; a service still recovering
    (``/estimates`` answers 503 ``{"recovering": true}``) shows that, not an HTTP error."""
    binary = chromium_binary()
    state = AggregateState(SPEC)
    state.add(*reports(300, 1))
    doc = estimates_document(state, delta=DELTA, batch_sizes={300: 1}, latest_batch=300)
    why = "not subscribed to the batches topic"
    doc = {**doc, "state": "not_ready", "not_ready": why, "ready": False, "subscribed": False}
    shown: dict[str, str] = {}
    for name, recovered in (("not_ready", True), ("recovering", False)):
        server = MetricsServer(
            host="127.0.0.1",
            port=0,
            registry=CollectorRegistry(),
            estimates=lambda: doc,
            recovered=(lambda: True) if recovered else (lambda: False),
        )
        server.start()
        try:
            url = f"http://127.0.0.1:{server.port}/"
            shown[name] = page_status(binary, tmp_path / name, url)
        finally:
            server.stop()
    assert shown == {
        "not_ready": f"not ready: {why}",
        "recovering": "not ready: recovering the checkpoint",
    }
