"""The structure of the Grafana dashboard and provisioning (Grafana itself does not run here;
tests/deploy/test_prometheus.py runs every query against a real Prometheus), and the functions
both read them with: panels, their PromQL expressions with template variables substituted,
the provisioned datasource uid.
"""

from __future__ import annotations

import itertools
import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry

from aggregator.estimation.estimators import AggregateState
from aggregator.service.metrics import AggregatorMetrics
from broker.service.metrics import ShufflerMetrics
from edge import MechanismSpec
from sim.fleet.metrics import FleetMetrics

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "deploy" / "grafana" / "dashboards" / "coco-fleet.json"
DATASOURCES = ROOT / "deploy" / "grafana" / "provisioning" / "datasources" / "prometheus.yaml"
DASHBOARD_PROVIDER = ROOT / "deploy" / "grafana" / "provisioning" / "dashboards" / "coco.yaml"
PROMETHEUS_CONFIG = ROOT / "deploy" / "prometheus" / "prometheus.yml"

GRAFANA_VARIABLES = {
    # Grafana's $__rate_interval is max($__interval + scrape interval, 4 x scrape interval);
    # the tests scrape every second, so 15 s holds several samples even on a loaded machine.
    "$__rate_interval": "15s",
    "$__interval": "5s",
    "$__range": "5m",
}


@dataclass(frozen=True)
class Query:
    """One ``targets[]`` entry of a panel."""

    panel_id: int
    panel_title: str
    panel_type: str
    ref_id: str
    expr: str
    instant: bool

    def substituted(self, variables: dict[str, str]) -> str:
        """The expression with Grafana's and the dashboard's variables replaced (longest
        names first, so ``$__interval`` does not eat the start of ``$__interval_ms``)."""
        expr = self.expr
        for name in sorted(variables, key=len, reverse=True):
            expr = expr.replace(name, variables[name])
        if "$" in expr:
            raise AssertionError(f"unsubstituted variable in {expr!r}")
        return expr


def load_dashboard() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return data


def panels(dashboard: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """Every panel, rows included, and the panels inside collapsed rows."""
    for panel in dashboard["panels"]:
        yield panel
        yield from panel.get("panels", [])


def queries(dashboard: dict[str, Any]) -> list[Query]:
    return [
        Query(
            panel_id=panel["id"],
            panel_title=panel["title"],
            panel_type=panel["type"],
            ref_id=target["refId"],
            expr=target["expr"],
            instant=bool(target.get("instant")) and not target.get("range"),
        )
        for panel in panels(dashboard)
        for target in panel.get("targets", [])
    ]


def template_variables(dashboard: dict[str, Any]) -> list[dict[str, Any]]:
    variables: list[dict[str, Any]] = dashboard["templating"]["list"]
    return variables


def provisioned_datasource_uid() -> str:
    """The ``uid:`` of the provisioned Prometheus datasource (one datasource in the file)."""
    uids = re.findall(r"^\s+uid:\s*(\S+)\s*$", DATASOURCES.read_text(), flags=re.MULTILINE)
    assert len(uids) == 1, uids
    uid: str = uids[0]
    return uid


SPEC = MechanismSpec(mechanism="coco", d=6, s=2, epsilon=1.0)


def test_every_panel_is_complete_and_uses_the_provisioned_datasource() -> None:
    dashboard = load_dashboard()
    uid = provisioned_datasource_uid()
    assert uid == "coco-prometheus"
    assert 36 <= dashboard["schemaVersion"] <= 41
    assert dashboard["uid"] == "coco-fleet"
    all_panels = list(panels(dashboard))
    ids = [panel["id"] for panel in all_panels]
    assert len(ids) == len(set(ids)), "panel ids must be unique"
    for panel in all_panels:
        grid = panel["gridPos"]
        assert set(grid) == {"h", "w", "x", "y"}, panel["title"]
        assert grid["x"] + grid["w"] <= 24, panel["title"]
        if panel["type"] == "row":
            continue
        assert panel["datasource"] == {"type": "prometheus", "uid": uid}, panel["title"]
        assert panel["targets"], f"panel {panel['title']!r} has no targets"
        assert panel.get("description"), f"panel {panel['title']!r} has no description"
        ref_ids = [target["refId"] for target in panel["targets"]]
        assert len(ref_ids) == len(set(ref_ids)), panel["title"]
        for target in panel["targets"]:
            assert target["datasource"]["uid"] == uid, panel["title"]
            assert target["expr"].strip(), panel["title"]
    for variable in template_variables(dashboard):
        assert variable["datasource"]["uid"] == uid


def test_panels_do_not_overlap() -> None:
    def cells(panel: dict[str, Any]) -> set[tuple[int, int]]:
        g = panel["gridPos"]
        return {
            (x, y) for x in range(g["x"], g["x"] + g["w"]) for y in range(g["y"], g["y"] + g["h"])
        }

    for a, b in itertools.combinations(load_dashboard()["panels"], 2):
        assert not cells(a) & cells(b), (a["title"], b["title"])


def test_dim_variable_comes_from_the_aggregator_and_estimate_panels_use_it() -> None:
    dashboard = load_dashboard()
    (dim,) = [v for v in template_variables(dashboard) if v["name"] == "dim"]
    assert dim["definition"] == "label_values(coco_aggregator_estimate_mean, dim)"
    assert dim["query"]["query"] == dim["definition"]
    estimate_queries = [q for q in queries(dashboard) if "estimate_" in q.expr]
    assert estimate_queries
    assert all('dim=~"$dim"' in q.expr for q in estimate_queries)
    truth = [q for q in queries(dashboard) if "ground_truth" in q.expr]
    assert {q.panel_id for q in truth} <= {q.panel_id for q in estimate_queries}


def test_window_variable_comes_from_the_aggregator_and_window_panels_use_it() -> None:
    """The windowed panels read the configured windows (``coco aggregator run --window``):
    ``$window`` lists them, and each windowed estimate is of that window and ``$dim``."""
    dashboard = load_dashboard()
    (window,) = [v for v in template_variables(dashboard) if v["name"] == "window"]
    assert window["definition"] == "label_values(coco_aggregator_window_n, window)"
    assert window["query"]["query"] == window["definition"]
    assert window["multi"] is False  # one window: the band's fill pairs one lower, one upper
    windowed = [q for q in queries(dashboard) if "window_estimate" in q.expr]
    assert len(windowed) == 3
    for q in windowed:
        for name in re.findall(r"coco_aggregator_window_estimate_\w+\{[^}]*\}", q.expr):
            assert name.endswith('{window="$window",dim=~"$dim"}'), name
    for name in ("coco_aggregator_window_n", "coco_aggregator_window_epsilon_total"):
        assert any(q.expr == name for q in queries(dashboard)), name


def test_every_metric_named_in_a_query_exists() -> None:
    """A typo in a metric name would only show as an empty panel: check each name against
    the series the three components register."""
    registry = CollectorRegistry()
    aggregator = AggregatorMetrics(
        registry, spec=SPEC, dims=(0,), epsilon_target=1.0, windows=("1h",), periods=("24h",)
    )
    aggregator.set_estimates(AggregateState(SPEC).estimate())  # labelled series appear on use
    aggregator.set_epsilon(smallest=None, latest=None)
    aggregator.set_epsilon_generic(smallest=None, latest=None)
    aggregator.set_batch_size(smallest=None, latest=None)
    aggregator.set_epsilon_curve({100: 1.0})
    ShufflerMetrics(registry)
    FleetMetrics(registry, d=SPEC.d, dims=1)
    known = {sample.name for metric in registry.collect() for sample in metric.samples}
    named = {name for q in queries(load_dashboard()) for name in re.findall(r"\bcoco_\w+", q.expr)}
    assert named, "no coco_* metric in the dashboard"
    assert named - known == set()
    # and the dashboard covers the three components
    assert {name.split("_")[1] for name in named} == {"aggregator", "shuffler", "fleet"}


def test_epsilon_panels_use_only_certified_metrics() -> None:
    exprs = [q.expr for q in queries(load_dashboard()) if "epsilon" in q.expr]
    assert any("coco_aggregator_epsilon_central_curve" in e for e in exprs)
    assert any('coco_aggregator_epsilon_central{batch="smallest"}' in e for e in exprs)
    assert any("coco_aggregator_epsilon_target" in e for e in exprs)
    assert any("coco_aggregator_epsilon_total" in e for e in exprs)  # privacy over time
    assert not any("mechanism" in e for e in exprs)


def test_provisioning_paths_match_the_compose_mounts() -> None:
    provider = DASHBOARD_PROVIDER.read_text()
    assert re.search(r"^\s+path: /var/lib/grafana/dashboards\s*$", provider, re.MULTILINE)
    assert re.search(r"^\s+type: file\s*$", provider, re.MULTILINE)
    config = PROMETHEUS_CONFIG.read_text()
    for job, target in (
        ("shuffler", "shuffler:9109"),
        ("aggregator", "aggregator:9108"),
        ("fleet", "fleet:9110"),
    ):
        assert f"job_name: {job}\n" in config
        assert config.count(f'"{target}"') == 1
