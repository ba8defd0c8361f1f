"""The Grafana dashboard and its provisioning: structure, datasource, and PromQL that Prometheus parses."""

from __future__ import annotations

import json
import re
from pathlib import Path

import yaml

from .conftest import DASHBOARD, REPO, dashboard_queries, run_tool

PROVISIONING = REPO / "deploy" / "grafana" / "provisioning"
DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}


def test_panels_are_well_formed() -> None:
    panels = json.loads(DASHBOARD.read_text())["panels"]
    ids = [panel["id"] for panel in panels]
    assert all(isinstance(i, int) for i in ids) and len(set(ids)) == len(ids), f"panel ids not unique: {ids}"
    for panel in panels:
        where = f"panel {panel['id']} ({panel.get('title')})"
        grid = panel["gridPos"]
        assert all(isinstance(grid.get(k), int) for k in "hwxy"), f"{where}: gridPos needs integer h, w, x, y"
        assert grid["x"] + grid["w"] <= 24, f"{where}: wider than the 24-column grid"
        assert panel["title"] and panel["targets"], f"{where}: needs a title and targets"
        assert panel["datasource"] == DATASOURCE, f"{where}: datasource must be {DATASOURCE}"
        for target in panel["targets"]:
            assert target["expr"].strip() and target["refId"], f"{where}: a target without expr or refId"
            assert target["datasource"] == DATASOURCE, f"{where}: target datasource must be {DATASOURCE}"


def test_datasource_variable_defaults_to_the_provisioned_datasource() -> None:
    provisioned = yaml.safe_load((PROVISIONING / "datasources" / "prometheus.yml").read_text())["datasources"]
    variables = {v["name"]: v for v in json.loads(DASHBOARD.read_text())["templating"]["list"]}
    datasource = variables["datasource"]
    assert datasource["type"] == "datasource" and datasource["query"] == "prometheus"
    assert datasource["current"]["value"] in {d["uid"] for d in provisioned if d["type"] == "prometheus"}


def test_every_query_is_valid_promql(tmp_path: Path) -> None:
    # promtool parses each query as a recording rule: the same PromQL parser as Prometheus' query API.
    rules = [{"record": f"dashboard:query_{i}", "expr": expr} for i, (_, expr) in enumerate(dashboard_queries())]
    path = tmp_path / "dashboard_rules.yml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))
    run_tool("promtool", "check", "rules", str(path))


def test_every_per_pair_metric_is_shown_by_the_chosen_pairs() -> None:
    """A ``pair`` variable (All: every pair, and "" for refusals before routing), and every query of a metric that
    carries ``pair`` keeps to the chosen ones."""
    dashboard = json.loads(DASHBOARD.read_text())
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["pair"]["includeAll"] and variables["pair"]["allValue"] == ".*"
    assert "attnserve_queue_capacity" in variables["pair"]["definition"]
    per_pair = ("queue_depth", "active_sequences", "queue_capacity", "queue_wait", "batch_size", "generated_tokens",
                "rejected_total", "model_load", "request_duration")  # fmt: skip
    exprs = [t["expr"] for panel in dashboard["panels"] for t in panel["targets"]]
    shown = [e for e in exprs if any(f"attnserve_{name}" in e for name in per_pair)]
    assert shown and all('pair=~"$pair"' in e for e in shown), shown
    by_pair = [name for name in per_pair if name != "batch_size"]  # a heatmap of the chosen pairs' steps
    assert all(any(re.search(rf"by \([^)]*pair[^)]*\) \(\w*\(?attnserve_{name}", e) for e in shown) for name in by_pair)
