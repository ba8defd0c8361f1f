"""deploy/prometheus: the config and alert rules are valid, and promtool unit tests cover every alert."""

from __future__ import annotations

import yaml

from .conftest import REPO, run_tool

PROMETHEUS = REPO / "deploy" / "prometheus"
TESTS = sorted((PROMETHEUS / "tests").glob("*.yml"))


def test_config_is_valid() -> None:
    run_tool("promtool", "check", "config", str(PROMETHEUS / "prometheus.yml"))


def test_rules_are_valid() -> None:
    run_tool("promtool", "check", "rules", str(PROMETHEUS / "alerts.yml"))


def test_rule_unit_tests_pass() -> None:
    assert TESTS, "no promtool unit tests in deploy/prometheus/tests"
    run_tool("promtool", "test", "rules", *map(str, TESTS))


def test_every_alert_fires_in_some_unit_test() -> None:
    groups = yaml.safe_load((PROMETHEUS / "alerts.yml").read_text())["groups"]
    alerts = {rule["alert"] for group in groups for rule in group["rules"] if "alert" in rule}
    fired = {
        check["alertname"]
        for path in TESTS
        for test in yaml.safe_load(path.read_text())["tests"]
        for check in test.get("alert_rule_test", [])
        if check.get("exp_alerts")
    }
    assert alerts, "no alerts in deploy/prometheus/alerts.yml"
    assert not alerts - fired, f"alerts no unit test expects to fire: {sorted(alerts - fired)}"
