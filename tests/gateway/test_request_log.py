"""One JSON access line per request, without prompts or keys unless prompts are asked for."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from gateway.app import create_app
from gateway.request_log import JsonFormatter
from tests.gateway.conftest import auth, chat, make_settings
from tests.gateway.fakes import ScriptedBackend


def access_lines(caplog: pytest.LogCaptureFixture) -> list[dict[str, object]]:
    formatter = JsonFormatter()
    return [
        json.loads(formatter.format(record)) for record in caplog.records if record.name == "kvgate.access"
    ]


def test_access_line_fields_without_prompt_or_key(
    client: TestClient, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.INFO, logger="kvgate.access"):
        client.post("/v1/chat/completions", json=chat("A secret question about Zanzibar"), headers=auth())
        client.post("/v1/chat/completions", json=chat("A secret question about Zanzibar"), headers=auth())
    first, second = access_lines(caplog)
    assert (first["cache"], second["cache"]) == ("miss", "exact-hit")
    assert first["tenant"] == "alpha" and first["status"] == 200
    assert first["prompt_tokens"] == 8 and first["completion_tokens"] == 6
    assert isinstance(first["latency_ms"], float) and first["request_id"]
    text = json.dumps([first, second])
    assert "Zanzibar" not in text and "key-alpha" not in text


def test_prompts_appear_only_when_enabled(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    app = create_app(make_settings(tmp_path, log_prompts=True), backend_factory=lambda s: ScriptedBackend())
    with TestClient(app) as client, caplog.at_level(logging.INFO, logger="kvgate.access"):
        client.post("/v1/chat/completions", json=chat("Tell me about Zanzibar"), headers=auth())
    assert access_lines(caplog)[0]["prompt"] == "Tell me about Zanzibar"
