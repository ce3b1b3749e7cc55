"""deploy/compose.fleet.yaml is kvgate in front of three model servers, and names only real settings; its
upstreams file is a fleet kvgate accepts, pointing at those servers."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import yaml

from gateway.fleet.config import read_upstreams_file
from gateway.runtime.settings import Settings

ROOT = Path(__file__).resolve().parents[3]
COMPOSE = ROOT / "deploy" / "compose.fleet.yaml"


def test_kvgate_reads_the_upstreams_file_of_three_model_servers() -> None:
    compose: dict[str, Any] = yaml.safe_load(COMPOSE.read_text())
    services = compose["services"]
    kvgate = services["kvgate"]
    engines = sorted(name for name in services if name.startswith("engine-"))
    assert engines == ["engine-0", "engine-1", "engine-2"]
    mount = next(volume for volume in kvgate["volumes"] if volume.endswith(":ro"))
    source, target, _ = mount.split(":")
    assert kvgate["environment"]["KVGATE_UPSTREAMS_FILE"] == target
    config = read_upstreams_file(COMPOSE.parent / source, "prefix")
    (pool,) = config.pools
    assert pool.routing == "prefix"
    hosts = sorted(
        (urlsplit(member.api_base).hostname, urlsplit(member.api_base).port) for member in pool.members
    )
    port = int(services["engine-0"]["environment"]["KVGATE_PORT"])
    assert hosts == [(name, port) for name in engines]
    assert "KVGATE_UPSTREAM_URL" not in services["engine-0"]["environment"]  # engine mode: a model server


def test_every_kvgate_variable_in_the_fleet_compose_is_a_setting() -> None:
    named = set(re.findall(r"\bKVGATE_[A-Z0-9_]+", COMPOSE.read_text()))
    fields = {f"KVGATE_{name.upper()}" for name in Settings.model_fields}
    assert named and named <= fields, sorted(named - fields)
