"""The orchestrators' grace periods outlast the drain: longer than ATTNSERVE_SHUTDOWN_TIMEOUT_S plus the time
their probe takes to see /readyz turn 503 (docs/DEPLOY.md, "Draining")."""

from __future__ import annotations

import re

import yaml

from service.settings import Settings

from .conftest import REPO

DEFAULT_TIMEOUT = Settings.model_fields["shutdown_timeout_s"].default


def seconds(duration: str) -> float:
    """A compose duration (``1m30s``, ``45s``) in seconds."""
    units = {"h": 3600, "m": 60, "s": 1, "ms": 0.001}
    parts = re.findall(r"(\d+(?:\.\d+)?)(ms|h|m|s)", duration)
    assert parts and "".join(n + u for n, u in parts) == duration, f"not a duration: {duration}"
    return sum(float(n) * units[u] for n, u in parts)


def test_kubernetes_grace_period_outlasts_the_drain() -> None:
    deployment = yaml.safe_load((REPO / "deploy/k8s/base/deployment.yaml").read_text())
    pod = deployment["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    env = {e["name"]: e["value"] for e in container["env"]}
    timeout = float(env.get("ATTNSERVE_SHUTDOWN_TIMEOUT_S", DEFAULT_TIMEOUT))
    probe = container["readinessProbe"]
    noticed = probe["periodSeconds"] * probe.get("failureThreshold", 3)
    assert pod["terminationGracePeriodSeconds"] > timeout + noticed


def test_compose_grace_period_outlasts_the_drain() -> None:
    api = yaml.safe_load((REPO / "docker-compose.yml").read_text())["services"]["api"]
    timeout = float(api["environment"].get("ATTNSERVE_SHUTDOWN_TIMEOUT_S", DEFAULT_TIMEOUT))
    dockerfile = (REPO / "Dockerfile").read_text()
    intervals = {seconds(i) for i in re.findall(r"HEALTHCHECK --interval=(\S+)", dockerfile)}
    assert intervals, "the Dockerfile's HEALTHCHECK has no --interval"
    assert seconds(api["stop_grace_period"]) > timeout + max(intervals)
