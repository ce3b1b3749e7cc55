"""Secrets: API keys, the admin token and prompts never reach logs (all records, JSON-formatted) or
metrics; entry ids are random and `x-kvgate-*` headers carry no tenant or scope.

Admin endpoints refusing missing or wrong tokens is proven in tests/gateway/test_auth_admin.py.
"""

from __future__ import annotations

import io
import logging
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from gateway.api.objects import ChatCompletionRequest
from gateway.apis.chat import CHAT
from gateway.http.app import create_app
from gateway.observability.request_log import JsonFormatter
from gateway.service import CompletionCall
from tests.gateway.conftest import ADMIN_TOKEN, admin, auth, chat, make_settings
from tests.gateway.fakes import ScriptedBackend
from tests.reliability.prompts import TOPICS

SECRET_PROMPT = "my account number is 4111-1111-1111-1111, please check it"
SECRETS = ("key-alpha", "key-beta", "wrong-key-zzz", ADMIN_TOKEN, "4111-1111", "account number")


@pytest.fixture
def all_logs() -> Iterator[io.StringIO]:
    """Every record of every logger, down to DEBUG, as the JSON lines kvgate writes in production."""
    sink = io.StringIO()
    handler = logging.StreamHandler(sink)
    handler.setFormatter(JsonFormatter())
    root = logging.getLogger()
    level = root.level
    root.addHandler(handler)
    root.setLevel(logging.DEBUG)
    try:
        yield sink
    finally:
        root.removeHandler(handler)
        root.setLevel(level)


def test_keys_tokens_and_prompts_stay_out_of_logs_and_metrics(tmp_path: Path, all_logs: io.StringIO) -> None:
    app = create_app(make_settings(tmp_path), backend_factory=lambda settings: ScriptedBackend())
    with TestClient(app) as client:
        for headers in (auth(), auth(), auth("key-beta")):
            assert (
                client.post("/v1/chat/completions", json=chat(SECRET_PROMPT), headers=headers).status_code
                == 200
            )
        streamed = client.post("/v1/chat/completions", json=chat(SECRET_PROMPT, stream=True), headers=auth())
        assert streamed.status_code == 200
        assert (
            client.post("/v1/chat/completions", json=chat("hi"), headers=auth("wrong-key-zzz")).status_code
            == 401
        )
        assert client.post("/admin/purge", json={"tenant": "beta"}, headers=admin()).status_code == 200
        assert client.post("/admin/purge", json={"tenant": "beta"}, headers=auth()).status_code == 401
        metrics = client.get("/metrics").text
    logs = all_logs.getvalue()
    assert "kvgate.access" in logs, "the access log did not run: this test would prove nothing"
    for secret in SECRETS:
        assert secret not in logs, f"{secret!r} leaked into the logs"
        assert secret not in metrics, f"{secret!r} leaked into /metrics"


def test_entry_ids_and_headers_reveal_nothing_about_tenants_or_scopes(tmp_path: Path) -> None:
    app = create_app(make_settings(tmp_path), backend_factory=lambda settings: ScriptedBackend())
    with TestClient(app) as client:
        service = app.state.service
        ids: list[str] = []
        for key, tenant in (("key-alpha", "alpha"), ("key-beta", "beta")):
            scope = service.scope_of(
                CompletionCall(ChatCompletionRequest.model_validate(chat(TOPICS[3])), tenant, CHAT)
            )
            for _ in range(2):  # miss then hit: the hit names the entry
                response = client.post("/v1/chat/completions", json=chat(TOPICS[3]), headers=auth(key))
            kvgate_headers = {
                name: value for name, value in response.headers.items() if name.startswith("x-kvgate")
            }
            assert kvgate_headers["x-kvgate-cache"] == "exact-hit"
            for value in kvgate_headers.values():
                for forbidden in (tenant, key, scope.scope_id, scope.exact_key, "alpha", "beta"):
                    assert forbidden not in value, f"{forbidden!r} in {kvgate_headers}"
            ids.append(kvgate_headers["x-kvgate-entry-id"])
    alpha_id, beta_id = ids
    assert alpha_id != beta_id
    assert all(len(entry_id) >= 16 for entry_id in ids)  # 12 random bytes, URL-safe base64
