"""deploy/k8s: every overlay builds with kustomize and its objects validate against the Kubernetes schemas."""

from __future__ import annotations

import os
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from .conftest import IMAGE_ARGOS_CACHE, REPO, run_tool

K8S = REPO / "deploy" / "k8s"
OVERLAYS = sorted(p.name for p in (K8S / "overlays").iterdir() if p.is_dir())
QUEUE_DEPTH = K8S / "components" / "queue-depth-hpa"
ARGOS_PACKAGES = K8S / "components" / "argos-packages"
# The oldest Kubernetes release the manifests are meant for.
KUBERNETES_VERSION = "1.30"
# Custom resources have no schema in kubernetes-validate's bundle; they are checked for their structure only.
CUSTOM_KINDS = {"ServiceMonitor", "PodMonitor", "ScaledObject"}


def build(directory: Path) -> list[dict]:
    return [doc for doc in yaml.safe_load_all(run_tool("kubectl", "kustomize", str(directory))) if doc]


def validate(objects: list[dict]) -> dict[str, dict]:
    """Validate built-in kinds strictly (unknown fields are errors), custom ones structurally; return them by kind."""
    by_kind = {}
    for obj in objects:
        if obj["kind"] in CUSTOM_KINDS:
            assert {"apiVersion", "kind", "metadata", "spec"} <= set(obj), f"{obj['kind']}: incomplete"
            assert obj["metadata"].get("name") and obj["spec"], f"{obj['kind']}: no name or empty spec"
        else:
            try:
                kubernetes_validate.validate(obj, KUBERNETES_VERSION, strict=True)
            except kubernetes_validate.ValidationError as e:
                pytest.fail(f"{obj['kind']} {obj['metadata']['name']}: {e}")
        by_kind[obj["kind"]] = obj
    return by_kind


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_overlay_builds_and_validates(overlay: str) -> None:
    objects = validate(build(K8S / "overlays" / overlay))
    assert {"Deployment", "Service", "HorizontalPodAutoscaler", "ServiceMonitor"} <= set(objects)
    pod = objects["Deployment"]["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert pod["securityContext"]["runAsNonRoot"] and container["securityContext"]["readOnlyRootFilesystem"]
    assert {"/tmp"} <= {m["mountPath"] for m in container["volumeMounts"]}
    assert container["resources"]["requests"] and container["resources"]["limits"]
    assert container["image"].endswith(":" + overlay), "each overlay runs its own image (attnserve:cpu or :gpu)"
    gpus = container["resources"]["limits"].get("nvidia.com/gpu")
    assert (gpus == 1) == (overlay == "gpu"), f"{overlay}: nvidia.com/gpu limit is {gpus}"


def test_queue_depth_component_replaces_the_cpu_metric(tmp_path: Path) -> None:
    # Kustomize refuses absolute paths: the temporary overlay names the repository relatively.
    overlay, component = (os.path.relpath(p, tmp_path) for p in (K8S / "overlays" / "cpu", QUEUE_DEPTH))
    (tmp_path / "kustomization.yaml").write_text(yaml.safe_dump({"resources": [overlay], "components": [component]}))
    hpa = validate(build(tmp_path))["HorizontalPodAutoscaler"]
    (metric,) = hpa["spec"]["metrics"]
    adapter = yaml.safe_load((QUEUE_DEPTH / "prometheus-adapter-values.yaml").read_text())
    assert metric["type"] == "Pods"
    assert metric["pods"]["metric"]["name"] == adapter["rules"]["custom"][0]["name"]["as"] == "attnserve_queue_depth"


def test_argos_packages_component_imports_in_the_server(tmp_path: Path) -> None:
    overlay, component = (os.path.relpath(p, tmp_path) for p in (K8S / "overlays" / "cpu", ARGOS_PACKAGES))
    (tmp_path / "kustomization.yaml").write_text(yaml.safe_dump({"resources": [overlay], "components": [component]}))
    pod = validate(build(tmp_path))["Deployment"]["spec"]["template"]["spec"]
    assert "initContainers" not in pod, "the server imports the packages itself"
    (container,) = pod["containers"]
    mounts = {m["mountPath"]: m for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert mounts["/packages"]["readOnly"] and volumes["argos-packages"]["persistentVolumeClaim"]["claimName"] == (
        "argos-packages"
    )
    cache = mounts[IMAGE_ARGOS_CACHE]
    assert not cache.get("readOnly") and "emptyDir" in volumes[cache["name"]], "the server writes its imports there"
    env = {e["name"]: e["value"] for e in container["env"]}
    assert env["ATTNSERVE_ARGOS_PACKAGES"] == "/packages" and env["ATTNSERVE_BUNDLES"] == ""
    assert "ATTNSERVE_ARGOS_CACHE" not in env, "the image's cache directory, which it creates owned by 10001"
    probe = container["startupProbe"]
    assert probe["periodSeconds"] * probe["failureThreshold"] >= 600, "the liveness probe must wait for the imports"
