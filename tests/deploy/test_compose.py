"""docker-compose.yml and its GPU override: the Compose spec schema, the files they mount, their exposure."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from .conftest import IMAGE_ARGOS_CACHE, REPO, run_tool

COMPOSE_FILES = [
    "docker-compose.yml",
    "docker-compose.gpu.yml",
    "docker-compose.argos.yml",
    "docker-compose.libretranslate.yml",
]
# Where LibreTranslate's image keeps its models volume, and argos-translate its packages under it.
LIBRETRANSLATE_LOCAL = "/home/libretranslate/.local"
LIBRETRANSLATE_PACKAGES = LIBRETRANSLATE_LOCAL + "/share/argos-translate/packages"


def load(name: str) -> dict:
    return yaml.safe_load((REPO / name).read_text())


@pytest.mark.parametrize("name", COMPOSE_FILES)
def test_matches_the_compose_spec(name: str) -> None:
    run_tool("check-jsonschema", "--builtin-schema", "vendor.compose-spec", name)


def referenced_paths(compose: dict) -> list[str]:
    """Every host path a compose file names: build contexts and Dockerfiles, bind mounts, env and config files."""
    paths = []
    for service in compose.get("services", {}).values():
        build = service.get("build")
        if isinstance(build, str):
            build = {"context": build}
        if isinstance(build, dict) and "context" in build:
            paths.append(build["context"])
            paths.append(str(Path(build["context"]) / build.get("dockerfile", "Dockerfile")))
        for volume in service.get("volumes", []):
            source = volume.get("source", "") if isinstance(volume, dict) else volume.split(":")[0]
            if source.startswith((".", "/")):  # a bind mount, not a named volume
                paths.append(source)
        env_files = service.get("env_file", [])
        paths.extend([env_files] if isinstance(env_files, str) else env_files)
    for section in ("configs", "secrets"):
        paths.extend(item["file"] for item in compose.get(section, {}).values() if "file" in item)
    return paths


@pytest.mark.parametrize("name", COMPOSE_FILES)
def test_referenced_files_exist(name: str) -> None:
    for path in referenced_paths(load(name)):
        assert (REPO / path).exists(), f"{name} refers to {path}, which is not in the repository"


def test_mounts_are_what_the_configs_expect() -> None:
    services = load("docker-compose.yml")["services"]
    assert {"api", "prometheus", "grafana"} <= set(services)
    scrape = yaml.safe_load((REPO / "deploy/prometheus/prometheus.yml").read_text())["scrape_configs"]
    assert [t for c in scrape for s in c["static_configs"] for t in s["targets"]] == ["api:8000"]
    provider = yaml.safe_load((REPO / "deploy/grafana/provisioning/dashboards/attnserve.yml").read_text())
    mounts = {v.split(":")[1]: v.split(":")[0] for v in services["grafana"]["volumes"]}
    assert mounts[provider["providers"][0]["options"]["path"]] == "./deploy/grafana/dashboards"


def test_ports_are_published_on_loopback_only() -> None:
    for name in COMPOSE_FILES:
        for service_name, service in load(name)["services"].items():
            for port in service.get("ports", []):
                assert str(port).startswith("127.0.0.1:"), f"{name}: {service_name} publishes {port} beyond loopback"


def test_grafana_password_has_no_default() -> None:
    password = load("docker-compose.yml")["services"]["grafana"]["environment"]["GF_SECURITY_ADMIN_PASSWORD"]
    assert password.startswith("${GRAFANA_ADMIN_PASSWORD:?"), "compose must refuse to start without the variable"


def test_gpu_override_reserves_a_gpu_and_builds_the_gpu_target() -> None:
    api = load("docker-compose.gpu.yml")["services"]["api"]
    assert api["build"]["target"] == "gpu"
    devices = api["deploy"]["resources"]["reservations"]["devices"]
    assert devices == [{"driver": "nvidia", "count": 1, "capabilities": ["gpu"]}]


def mount(volume: str) -> tuple[str, tuple[str, str]]:
    """A short-syntax volume as (target, (source, mode)); the source may hold ``${VAR:?message}``."""
    rest, mode = (volume[:-3], volume[-2:]) if volume.endswith((":ro", ":rw")) else (volume, "rw")
    source, target = rest.rsplit(":", 1)
    return target, (source, mode)


def test_argos_override_serves_the_packages_with_the_cache_in_a_volume() -> None:
    compose = load("docker-compose.argos.yml")
    (api,) = compose["services"].values()
    mounts = dict(mount(v) for v in api["volumes"])
    env = api["environment"]
    assert mounts[env["ATTNSERVE_ARGOS_PACKAGES"]][1] == "ro", "the packages are only read"
    assert mounts[IMAGE_ARGOS_CACHE] == ("argos-cache", "rw") and "argos-cache" in compose["volumes"]
    assert env["ATTNSERVE_BUNDLES"] == "", "the packages alone, as LibreTranslate serves them"
    assert "depends_on" not in api, "no import service: the server imports"


def test_libretranslate_override_takes_its_name_port_and_packages_volume() -> None:
    compose = load("docker-compose.libretranslate.yml")
    service = compose["services"]["libretranslate"]
    assert service["image"] == "attnserve:cpu"
    assert [*service["entrypoint"], *service["command"]] == ["attnserve", "serve"]
    env = service["environment"]
    assert env["ATTNSERVE_PORT"] == "5000" and "5000/readyz" in " ".join(service["healthcheck"]["test"])
    assert env["ATTNSERVE_ARGOS_PACKAGES"] == LIBRETRANSLATE_PACKAGES and env["ATTNSERVE_BUNDLES"] == ""
    mounts = dict(mount(v) for v in service["volumes"])
    assert mounts[LIBRETRANSLATE_LOCAL] == ("libretranslate_models", "ro"), "LibreTranslate's volume, only read"
    cache = mounts[IMAGE_ARGOS_CACHE]
    assert cache[1] == "rw" and set(compose["volumes"]) == {"libretranslate_models", cache[0]}
    assert service["user"] == "10001:10001" and service["read_only"] and service["tmpfs"] == ["/tmp"]
