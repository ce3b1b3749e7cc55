"""deploy/grafana/kvgate.json is a valid provisioned dashboard, queries only series kvgate exports, and the
`observability` compose profile validates."""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families

from engine.metrics import EngineMetrics, register_engine_metrics
from gateway.http.app import create_app
from tests.gateway.conftest import auth, chat, make_settings
from tests.gateway.fakes import ScriptedBackend
from tests.test_deploy import COMPOSE_FILE, ROOT, SCOPE_SECRET, _compose_command

DASHBOARD = ROOT / "deploy" / "grafana" / "kvgate.json"
METRIC = re.compile(r"\b(kvgate_[a-z0-9_]+)\b")


def queried_metrics() -> set[str]:
    dashboard = json.loads(DASHBOARD.read_text())
    return {
        name for panel in dashboard["panels"] for t in panel["targets"] for name in METRIC.findall(t["expr"])
    }


def test_dashboard_is_well_formed() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    assert dashboard["uid"] == "kvgate" and isinstance(dashboard["schemaVersion"], int)
    ids = [panel["id"] for panel in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    for panel in dashboard["panels"]:
        assert panel["title"] and panel["type"] and panel["targets"]
        assert panel["datasource"]["uid"] == "prometheus"  # the uid provisioning/datasources gives it
        assert set(panel["gridPos"]) == {"h", "w", "x", "y"}
        for target in panel["targets"]:
            assert target["expr"].count("(") == target["expr"].count(")")


def test_every_queried_metric_is_exported(tmp_path: Path) -> None:
    app = create_app(
        make_settings(tmp_path, rate_limit_rpm=3), backend_factory=lambda settings: ScriptedBackend()
    )
    with TestClient(app) as client:
        register_engine_metrics(app.state.metrics.registry, EngineMetrics().snapshot)
        for text in [
            "what is the capital of france",
            "how tall is mount everest",
            "what is the capital of france",
        ]:
            assert client.post("/v1/chat/completions", json=chat(text), headers=auth()).status_code == 200
        assert client.post("/v1/chat/completions", json=chat("one more"), headers=auth()).status_code == 429
        exposition = client.get("/metrics").text

    exported = {
        sample.name for family in text_string_to_metric_families(exposition) for sample in family.samples
    }
    queried = queried_metrics()
    assert {"kvgate_requests_total", "kvgate_breaker_state", "kvgate_engine_kv_cache_usage_perc"} <= queried
    assert queried - exported == set()


def test_observability_profile_validates() -> None:
    command, extra_env = _compose_command()
    environment = {
        k: v for k, v in os.environ.items() if not k.startswith(("KVGATE_", "COMPOSE_", "GATEWAY_"))
    }
    environment |= extra_env | {"KVGATE_SCOPE_SECRET": SCOPE_SECRET}
    base = ["-f", str(COMPOSE_FILE), "--project-directory", str(ROOT), "--env-file", os.devnull]
    result = subprocess.run(
        [*command, *base, "--profile", "observability", "config", "--format", "json"],
        capture_output=True,
        text=True,
        env=environment,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    services = json.loads(result.stdout)["services"]
    assert {"prometheus", "grafana", "kvgate", "redis"} <= set(services)
    mounts = {volume["source"] for volume in services["grafana"]["volumes"]}
    assert str(DASHBOARD) in mounts
    for path in [
        "deploy/grafana/provisioning/datasources/prometheus.yaml",
        "deploy/prometheus/prometheus.yml",
    ]:
        assert (ROOT / path).is_file()
