"""Every query of the Grafana dashboard against a real Prometheus scraping a live pipeline.

A real Mosquitto (tests/conftest.py), ``coco announce``, ``coco shuffler``, ``coco aggregator
run`` and ``coco fleet`` run as subprocesses; the Debian ``prometheus`` binary scrapes them
every second with deploy/prometheus/prometheus.yml, its targets rewritten to the live
processes' ports. Each ``targets[].expr`` of deploy/grafana/dashboards/coco-fleet.json must
then return at least one finite value: instant queries for stat and bar panels, range
queries (over the whole run) for time series.

Prometheus is installed by scripts/test in CI (``apt-get install prometheus``); where it is
missing the test is skipped, except under ``CI=true``, where it fails.
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from aggregator.service.metrics import epsilon_curve_grid
from edge.batch_auth import load_or_create_signing_key, public_key_hex
from tests.asyncutil import run, wait_until
from tests.conftest import Broker, free_port
from tests.deploy.debian_tools import debian_binary
from tests.deploy.test_dashboard import (
    GRAFANA_VARIABLES,
    PROMETHEUS_CONFIG,
    Query,
    load_dashboard,
    queries,
)

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

COCO = str(Path(sys.executable).with_name("coco"))
DEPLOYMENT = "monitoring"
JOBS = ("shuffler", "aggregator", "fleet")
COMPOSE_TARGETS = {
    "shuffler": "shuffler:9109",
    "aggregator": "aggregator:9108",
    "fleet": "fleet:9110",
}
EXPORTED_DIMS = 4
ALERT_RULES = PROMETHEUS_CONFIG.with_name("coco-alerts.yml")
ANNOUNCEMENT = (
    *("--mechanism", "coco", "--d", "6", "--s", "2", "--epsilon", "1.0"),
    *("--min-batch", "100", "--delta", "1e-6"),
)
"""The sensors model's d = 6 channels (as ``coco demo``); a 200-device round is one batch."""
FLOWING = {"Pipeline funnel (reports/s)": "ABCDE"}
"""Queries (panel title -> refIds) that must show a positive value, not merely a finite one:
the funnel's rates while the fleet publishes."""
DIM = "1"
"""The value substituted for the dashboard's ``$dim``."""
WINDOW = "1h"
"""A window the aggregator exports (``--window``), substituted for the dashboard's
``$window``."""


def prometheus_binary() -> str:
    """The Prometheus executable (``$COCO_PROMETHEUS``, else on the PATH)."""
    return debian_binary("prometheus", env="COCO_PROMETHEUS")


def test_missing_prometheus_skips_or_fails_under_ci(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COCO_PROMETHEUS", "/nonexistent/prometheus")
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match="CI=true: prometheus is not installed"):
        prometheus_binary()
    monkeypatch.delenv("CI")
    with pytest.raises(pytest.skip.Exception, match="apt-get install prometheus"):
        prometheus_binary()


def scrape_config(ports: dict[str, int]) -> str:
    """deploy/prometheus/prometheus.yml with the compose targets replaced by the live ports
    and a 1 s scrape interval (textual replacement: each must match exactly once)."""
    text = PROMETHEUS_CONFIG.read_text()
    for job, target in COMPOSE_TARGETS.items():
        assert text.count(f'"{target}"') == 1, target
        text = text.replace(f'"{target}"', f'"127.0.0.1:{ports[job]}"')
    text, count = re.subn(r"(?m)^(\s+)scrape_interval: \S+$", r"\1scrape_interval: 1s", text)
    assert count == 1
    return text


def write_config(directory: Path, ports: dict[str, int]) -> Path:
    """:func:`scrape_config` as ``directory/prometheus.yml``, the alert rules beside it (its
    ``rule_files`` are relative to it)."""
    config = directory / "prometheus.yml"
    config.write_text(scrape_config(ports))
    shutil.copy(ALERT_RULES, directory / ALERT_RULES.name)
    return config


def rule_names(api: PrometheusApi) -> list[str]:
    return [rule["name"] for group in api.get("rules")["groups"] for rule in group["rules"]]


@dataclass
class Processes:
    """Subprocesses with their output in files; terminated in reverse order."""

    workdir: Path
    procs: list[tuple[str, subprocess.Popen[bytes]]] = field(default_factory=list)

    def start(self, name: str, *args: str) -> subprocess.Popen[bytes]:
        log = open(self.workdir / f"{name}.log", "wb")  # noqa: SIM115 (closed with the process)
        proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT)
        log.close()  # the child holds its own descriptor
        self.procs.append((name, proc))
        return proc

    def check_alive(self) -> None:
        for name, proc in self.procs:
            if proc.poll() is not None:
                raise AssertionError(f"{name} exited with {proc.returncode}:\n{self.logs()}")

    def logs(self) -> str:
        return "\n".join(
            f"--- {name}\n{(self.workdir / f'{name}.log').read_text(errors='replace')[-3000:]}"
            for name, _ in self.procs
        )

    def stop(self) -> None:
        for _, proc in reversed(self.procs):
            if proc.poll() is None:
                proc.terminate()
        for _, proc in reversed(self.procs):
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


@pytest.fixture
def processes(tmp_path: Path) -> Iterator[Processes]:
    procs = Processes(tmp_path)
    try:
        yield procs
    finally:
        procs.stop()


class PrometheusApi:
    def __init__(self, port: int) -> None:
        self.base = f"http://127.0.0.1:{port}/api/v1/"

    def get(self, path: str, **params: str) -> Any:
        url = self.base + path + "?" + urllib.parse.urlencode(params)
        try:
            with urllib.request.urlopen(url, timeout=10) as response:
                document = json.loads(response.read())
        except urllib.error.HTTPError as exc:  # 400 for a query that does not parse
            raise AssertionError(f"{path} {params}: {exc.read().decode()}") from None
        assert document["status"] == "success", document
        return document["data"]

    def finite_values(self, expr: str, *, instant: bool, start: float) -> list[float]:
        """The finite sample values of ``expr`` now (instant) or over ``[start, now]``."""
        if instant:
            data = self.get("query", query=expr)
            assert data["resultType"] == "vector", (expr, data["resultType"])
            raw = [series["value"][1] for series in data["result"]]
        else:
            now = time.time()
            data = self.get(
                "query_range", query=expr, start=f"{start:.3f}", end=f"{now:.3f}", step="1"
            )
            assert data["resultType"] == "matrix", (expr, data["resultType"])
            raw = [value for series in data["result"] for _, value in series["values"]]
        return [v for v in map(float, raw) if math.isfinite(v)]

    def up(self) -> dict[str, float]:
        return {
            series["metric"]["job"]: float(series["value"][1])
            for series in self.get("query", query="up")["result"]
        }


def poll(predicate: Any, timeout: float, processes: Processes, interval: float = 0.5) -> None:
    """``wait_until`` with a slower pace (each pass is HTTP queries) and the processes' logs
    in the failure message."""
    last = [-math.inf]

    def paced() -> bool:
        if time.monotonic() - last[0] < interval:
            return False
        last[0] = time.monotonic()
        processes.check_alive()
        return bool(predicate())

    try:
        run(wait_until(paced, timeout), timeout=timeout + 30)
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{processes.logs()}") from None


def announce_short_rounds(broker: list[str], public_key: str) -> None:
    """Retain ``coco announce``'s announcement with 1 s rounds (the fleet runs many rounds
    in a few seconds) and the shuffler's batch key (the aggregator trusts it from there)."""
    subprocess.run(
        [
            COCO,
            "announce",
            *broker,
            *ANNOUNCEMENT,
            "--round-seconds",
            "1",
            "--batch-public-key",
            public_key,
        ],
        check=True,
        capture_output=True,
        text=True,
        timeout=60,
    )


def dashboard_variables(api: PrometheusApi) -> dict[str, str]:
    """The dashboard's template variables as Grafana would offer them, checked: ``$dim``
    from ``label_values(coco_aggregator_estimate_mean, dim)`` (the exported dimensions),
    ``$window`` from ``label_values(coco_aggregator_window_n, window)`` (the configured
    windows); with Grafana's own."""
    dims = api.get("label/dim/values", **{"match[]": "coco_aggregator_estimate_mean"})
    assert sorted(dims) == [str(j) for j in range(EXPORTED_DIMS)]
    windows = api.get("label/window/values", **{"match[]": "coco_aggregator_window_n"})
    assert sorted(windows) == sorted([WINDOW, "r3"])
    return {**GRAFANA_VARIABLES, "$dim": DIM, "$window": WINDOW}


def test_every_dashboard_query_returns_data(
    mosquitto: Broker, processes: Processes, tmp_path: Path
) -> None:
    binary = prometheus_binary()
    ports = {job: free_port() for job in JOBS}
    prometheus_port = free_port()
    broker = ["--broker", mosquitto.url, "--deployment", DEPLOYMENT]
    signing_key = tmp_path / "shuffler" / "signing.key"
    announce_short_rounds(broker, public_key_hex(load_or_create_signing_key(signing_key)))
    processes.start(
        "shuffler",
        COCO,
        "shuffler",
        *broker,
        "--state-dir",
        str(tmp_path / "shuffler"),
        "--signing-key",
        str(signing_key),
        "--metrics-port",
        str(ports["shuffler"]),
        "--flush-interval",
        "0.5",
    )
    processes.start(
        "aggregator",
        COCO,
        "aggregator",
        "run",
        *broker,
        "--metrics-port",
        str(ports["aggregator"]),
        "--metrics-dims",
        str(EXPORTED_DIMS),
        "--epsilon-target",
        "0.5",
        *("--window", WINDOW, "--window", "r3"),
    )
    config = write_config(tmp_path, ports)
    start = time.time()
    processes.start(
        "prometheus",
        binary,
        f"--config.file={config}",
        f"--storage.tsdb.path={tmp_path / 'tsdb'}",
        f"--web.listen-address=127.0.0.1:{prometheus_port}",
        "--log.level=warn",
    )
    api = PrometheusApi(prometheus_port)

    def ready() -> bool:
        try:
            return set(api.up()) == set(JOBS)
        except (OSError, AssertionError):
            return False

    poll(ready, 60, processes)  # the fleet target is down until the fleet starts
    processes.start(
        "fleet",
        COCO,
        "fleet",
        *broker,
        "--model",
        "sensors",
        "--devices",
        "200",
        "--mode",
        "multiplexed",
        "--connections",
        "2",
        "--rounds",
        "20",
        "--seed",
        "7",
        "--metrics-port",
        str(ports["fleet"]),
        "--metrics-dims",
        str(EXPORTED_DIMS),
        "--hold",
        "--no-progress",
    )
    poll(lambda: api.up() == dict.fromkeys(JOBS, 1.0), 60, processes)
    targets = api.get("targets")["activeTargets"]
    assert sorted(t["labels"]["job"] for t in targets) == sorted(JOBS)
    assert rule_names(api) == alert_names()  # the alert rules load, all of them

    variables = dashboard_variables(api)

    pending: dict[str, Query] = {}
    for query in queries(load_dashboard()):
        pending[query.substituted(variables)] = query
    answered: dict[str, list[float]] = {}

    def all_answered() -> bool:
        for expr, query in list(pending.items()):
            values = api.finite_values(expr, instant=query.instant, start=start)
            if values and (
                query.ref_id not in FLOWING.get(query.panel_title, "") or max(values) > 0
            ):
                answered[expr] = values
                del pending[expr]
        return not pending

    try:
        poll(all_answered, 120, processes, interval=1.0)
    except AssertionError as exc:
        empty = "\n".join(f"  [{q.panel_title}] {e}" for e, q in pending.items())
        raise AssertionError(f"queries without data:\n{empty}\n{exc}") from None
    assert len(answered) == len({q.expr for q in queries(load_dashboard())})
    if os.environ.get("COCO_SHOW_QUERIES"):  # for docs/monitoring.md: what each one returned
        for expr, values in answered.items():
            print(f"{len(values):5d} finite, last {values[-1]:.6g}: {expr}")

    # The same check can fail: a metric nobody exports returns nothing.
    missing = "sum(rate(coco_aggregator_no_such_metric_total[15s]))"
    for instant in (True, False):
        assert api.finite_values(missing, instant=instant, start=start) == []

    # A few values that must be exact, not just present.
    min_batch = answered["max(coco_shuffler_min_batch)"]
    assert set(min_batch) == {100.0}
    smallest = answered['min(coco_aggregator_batch_size{batch="smallest"})']
    assert min(smallest) >= 100
    target = answered["coco_aggregator_epsilon_target"]
    assert set(target) == {0.5}
    curve = answered["coco_aggregator_epsilon_central_curve"]  # instant: one value per n
    assert len(curve) == len(epsilon_curve_grid(100))
    check_change_gauges(api, processes, start)


def alert_names() -> list[str]:
    """The ``alert:`` names of deploy/prometheus/coco-alerts.yml, in file order."""
    return re.findall(r"(?m)^\s+- alert: (\w+)$", ALERT_RULES.read_text())


def scraped_names(api: PrometheusApi) -> set[str]:
    """Every metric name Prometheus scraped: those with series, and those a target declared
    (``# TYPE``) without a sample yet (the shard gauges of an unsharded deployment)."""
    return set(api.get("label/__name__/values")) | set(api.get("metadata"))


def check_change_gauges(api: PrometheusApi, processes: Processes, start: float) -> None:
    """The change detector's gauges are scraped, one series per exported dimension, and
    every metric an alert rule queries is scraped from the live services: the rules name
    the real metrics (a renamed metric leaves its alert silent forever)."""
    gauges = ("coco_aggregator_change_statistic", "coco_aggregator_change_alarm")

    def scraped() -> bool:
        return all(
            len(api.finite_values(name, instant=True, start=start)) == EXPORTED_DIMS
            for name in gauges
        )

    poll(scraped, 60, processes)
    alarms = api.finite_values("coco_aggregator_change_alarm", instant=True, start=start)
    assert set(alarms) <= {0.0, 1.0}
    rules = [rule for group in api.get("rules")["groups"] for rule in group["rules"]]
    named = {rule["name"]: set(re.findall(r"\bcoco_[a-z_]+", rule["query"])) for rule in rules}
    for rule in rules:  # all but the scrape-health alert query a coco metric
        assert named[rule["name"]] or rule["query"].startswith("up{"), rule["query"]
    wanted = set().union(*named.values())
    assert "coco_aggregator_change_alarm" in wanted
    missing: set[str] = set()

    def all_scraped() -> bool:
        missing.clear()
        missing.update(wanted - scraped_names(api))
        return not missing

    try:
        poll(all_scraped, 60, processes)
    except AssertionError as exc:
        unknown = f"alert rules query metrics nobody exports: {sorted(missing)}"
        raise AssertionError(f"{unknown}\n{exc}") from None
    # the same check can fail: a name no service exports is not among the scraped ones
    assert "coco_aggregator_no_such_metric" not in scraped_names(api)

    def evaluated() -> bool:
        now = api.get("rules")["groups"]
        return all(r.get("health") == "ok" for g in now for r in g["rules"])

    poll(evaluated, 60, processes)
