"""compose.yaml is valid for the real `docker compose`, names only real settings, and checks a real route.

`docker compose config` parses, interpolates and validates the file against the compose spec without a
Docker daemon. The compose v2 plugin is installed by `make compose-tool` (part of `make test`) into
.venv/docker/cli-plugins; a `docker compose` already on the machine is used when that is missing.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from gateway.http.app import create_app
from gateway.runtime.settings import Settings

ROOT = Path(__file__).resolve().parent.parent
COMPOSE_FILE = ROOT / "compose.yaml"
PLUGIN = ROOT / ".venv" / "docker" / "cli-plugins" / "docker-compose"
SCOPE_SECRET = "test-scope-secret"

Compose = Callable[..., subprocess.CompletedProcess[str]]


@pytest.fixture(scope="module")
def compose(tmp_path_factory: pytest.TempPathFactory) -> Compose:
    """Runs `docker compose <args>` on a compose file with a clean environment (no KVGATE_* leaks in)."""
    command, extra_env = _compose_command()
    empty_env_file = tmp_path_factory.mktemp("compose") / "empty.env"
    empty_env_file.write_text("")

    def run(*args: str, file: Path = COMPOSE_FILE, env: dict[str, str] | None = None) -> Any:
        environment = {
            name: value
            for name, value in os.environ.items()
            if not name.startswith(("KVGATE_", "COMPOSE_", "GATEWAY_"))
        }
        environment.update(extra_env)
        environment.update(env or {})
        # --env-file: interpolate only from `environment`, never from a developer's own .env.
        base = ["-f", str(file), "--project-directory", str(ROOT), "--env-file", str(empty_env_file)]
        return subprocess.run(
            [*command, *base, *args],
            capture_output=True,
            text=True,
            env=environment,
            timeout=120,
            check=False,
        )

    return run


def test_compose_config_validates(compose: Compose) -> None:
    config = _config(compose)
    redis, kvgate = config["services"]["redis"], config["services"]["kvgate"]

    assert redis["command"][redis["command"].index("--appendonly") + 1] == "yes"
    assert redis["healthcheck"]["test"] == ["CMD", "redis-cli", "ping"]
    assert any(volume["type"] == "volume" and volume["target"] == "/data" for volume in redis["volumes"])
    assert kvgate["depends_on"]["redis"]["condition"] == "service_healthy"
    assert kvgate["environment"]["KVGATE_REDIS_URL"] == "redis://redis:6379/0"
    assert kvgate["environment"]["KVGATE_HOST"] == "0.0.0.0"
    assert kvgate["environment"]["KVGATE_SCOPE_SECRET"] == SCOPE_SECRET
    model_dir = kvgate["environment"]["KVGATE_MODEL_DIR"]
    assert any(volume["type"] == "volume" and volume["target"] == model_dir for volume in kvgate["volumes"])
    assert kvgate["build"]["dockerfile"] == "Dockerfile" and (ROOT / "Dockerfile").is_file()
    assert {redis["restart"], kvgate["restart"]} == {"unless-stopped"}
    assert [(port["host_ip"], port["published"], port["target"]) for port in kvgate["ports"]] == [
        ("127.0.0.1", "8000", 8000)
    ]


def test_compose_config_rejects_an_invalid_file(compose: Compose, tmp_path: Path) -> None:
    broken = tmp_path / "compose.yaml"
    broken.write_text(COMPOSE_FILE.read_text().replace("service_healthy", "service_maybe", 1))

    result = compose("config", file=broken, env={"KVGATE_SCOPE_SECRET": SCOPE_SECRET})

    assert result.returncode != 0
    assert "depends_on.redis.condition" in result.stderr


def test_compose_refuses_to_run_without_a_scope_secret(compose: Compose) -> None:
    result = compose("config")

    assert result.returncode != 0
    assert "KVGATE_SCOPE_SECRET" in result.stderr


def test_the_commented_replicas_recipe_validates(compose: Compose, tmp_path: Path) -> None:
    # Follow compose.yaml's own instructions: delete the `ports:` line, uncomment the `#>` lines.
    lines = [line for line in COMPOSE_FILE.read_text().splitlines() if "delete for replicas" not in line]
    replicas = tmp_path / "compose.yaml"
    replicas.write_text("\n".join(re.sub(r"#> ?", "", line, count=1) for line in lines) + "\n")

    config = _config(compose, replicas)
    kvgate, proxy = config["services"]["kvgate"], config["services"]["proxy"]

    assert kvgate["deploy"]["replicas"] == 3
    assert "ports" not in kvgate
    assert [(port["published"], port["target"]) for port in proxy["ports"]] == [("8000", 8000)]
    assert proxy["depends_on"]["kvgate"]["condition"] == "service_healthy"
    nginx = config["configs"][proxy["configs"][0]["source"]]["content"]
    assert "server kvgate:8000;" in nginx and "proxy_buffering off;" in nginx


def test_every_kvgate_variable_in_compose_is_a_setting(
    compose: Compose, monkeypatch: pytest.MonkeyPatch
) -> None:
    named = set(re.findall(r"\bKVGATE_[A-Z0-9_]+", COMPOSE_FILE.read_text()))
    fields = {f"KVGATE_{name.upper()}" for name in Settings.model_fields}
    assert named, "compose.yaml configures kvgate through KVGATE_* variables"
    assert named <= fields, f"not settings: {sorted(named - fields)}"

    # The values compose hands the container must also pass Settings' own validation.
    environment = _config(compose)["services"]["kvgate"]["environment"]
    for name in [name for name in os.environ if name.startswith("KVGATE_")]:
        monkeypatch.delenv(name)
    for name, value in environment.items():
        monkeypatch.setenv(name, value)
    settings = Settings(_env_file=None)  # type: ignore[call-arg]
    assert settings.host == "0.0.0.0" and str(settings.redis_url) == "redis://redis:6379/0"


def test_the_healthcheck_asks_a_route_the_app_serves(compose: Compose) -> None:
    kvgate = _config(compose)["services"]["kvgate"]
    command = " ".join(kvgate["healthcheck"]["test"])
    match = re.search(r"http://127\.0\.0\.1:(\d+)(/[\w/]*)", command)
    assert match is not None, command

    # The OpenAPI paths list every route of every included router (nothing starts: no lifespan here).
    paths = create_app(Settings(_env_file=None)).openapi()["paths"]  # type: ignore[call-arg]

    assert match.group(2) == "/readyz" and "get" in paths[match.group(2)]
    assert match.group(1) == kvgate["environment"]["KVGATE_PORT"]
    assert kvgate["healthcheck"]["test"][:2] == ["CMD", "python"]  # the slim image has no curl


def _config(compose: Compose, file: Path = COMPOSE_FILE) -> dict[str, Any]:
    result = compose("config", "--format", "json", file=file, env={"KVGATE_SCOPE_SECRET": SCOPE_SECRET})
    assert result.returncode == 0, result.stderr
    config: dict[str, Any] = json.loads(result.stdout)
    return config


def _compose_command() -> tuple[list[str], dict[str, str]]:
    docker = shutil.which("docker")
    if PLUGIN.is_file():
        if docker is not None:
            # `docker compose`, finding the plugin through DOCKER_CONFIG/cli-plugins.
            return [docker, "compose"], {"DOCKER_CONFIG": str(PLUGIN.parent.parent)}
        return [str(PLUGIN)], {}  # the same binary run on its own, as `docker-compose`
    if docker is not None and _succeeds([docker, "compose", "version"]):
        return [docker, "compose"], {}
    pytest.fail("no `docker compose` here: run `make compose-tool` (make test does)")


def _succeeds(command: list[str]) -> bool:
    try:
        return subprocess.run(command, capture_output=True, timeout=30, check=False).returncode == 0
    except OSError:
        return False
