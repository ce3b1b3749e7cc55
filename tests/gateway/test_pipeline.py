"""Every API runs the one pipeline: one request per API (reverse-proxy mode, in front of a test upstream that
speaks all of them) gets its span, its access line, its metric, and has its priority header read; an error
on any of them is answered in the API's own shape and logged and counted like any other answer."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from gateway.http.app import create_app
from gateway.observability.tracing import Tracing
from tests.gateway.conftest import auth, make_settings
from tests.gateway.live_server import serve
from tests.gateway.openai_upstream import EMBEDDING_MODEL, MODEL, build_openai_upstream

# route label, path, body; the Messages API names its key `x-api-key`.
REQUESTS: list[tuple[str, str, dict[str, Any]]] = [
    (
        "chat",
        "/v1/chat/completions",
        {"model": MODEL, "messages": [{"role": "user", "content": "Hi pipeline"}]},
    ),
    ("completions", "/v1/completions", {"model": MODEL, "prompt": "Hi pipeline"}),
    ("responses", "/v1/responses", {"model": MODEL, "input": "Hi pipeline"}),
    (
        "messages",
        "/v1/messages",
        {"model": MODEL, "max_tokens": 8, "messages": [{"role": "user", "content": "Hi pipeline"}]},
    ),
    ("embeddings", "/v1/embeddings", {"model": EMBEDDING_MODEL, "input": "Hi pipeline"}),
    ("passthrough", "/v1/moderations", {"input": "Hi pipeline"}),
]
OPERATIONS = {
    "chat": "chat",
    "completions": "text_completion",
    "responses": "responses",
    "messages": "chat",
    "embeddings": "embeddings",
    "passthrough": "passthrough",
}


@pytest.fixture(scope="module")
def upstream_calls() -> list[dict[str, Any]]:
    return []


@pytest.fixture(scope="module")
def gateway(
    tmp_path_factory: pytest.TempPathFactory, upstream_calls: list[dict[str, Any]]
) -> Iterator[tuple[TestClient, InMemorySpanExporter]]:
    data_dir: Path = tmp_path_factory.mktemp("pipeline")
    with serve(build_openai_upstream(upstream_calls)) as upstream_url:
        settings = make_settings(data_dir, upstream_url=upstream_url + "/v1", upstream_api_key="upstream-key")
        app = create_app(settings)
        exporter = InMemorySpanExporter()
        app.state.tracing = Tracing(SimpleSpanProcessor(exporter))
        with TestClient(app) as client:
            yield client, exporter


def _headers(route: str, **extra: str) -> dict[str, str]:
    if route == "messages":
        return {"x-api-key": "key-alpha", **extra}
    return auth() | extra


def _access_lines(caplog: pytest.LogCaptureFixture) -> list[dict[str, Any]]:
    return [vars(record) for record in caplog.records if record.name == "kvgate.access"]


@pytest.mark.parametrize(("route", "path", "body"), REQUESTS, ids=[route for route, _, _ in REQUESTS])
def test_every_api_runs_the_one_pipeline(
    gateway: tuple[TestClient, InMemorySpanExporter],
    caplog: pytest.LogCaptureFixture,
    route: str,
    path: str,
    body: dict[str, Any],
) -> None:
    client, exporter = gateway
    exporter.clear()
    caplog.set_level(logging.INFO, logger="kvgate.access")
    before = client.get("/metrics").text.count(f'route="{route}"')

    answer = client.post(path, json=body, headers=_headers(route, **{"x-kvgate-priority": "1"}))

    assert answer.status_code == 200, answer.text
    assert answer.headers["x-kvgate-cache"] in ("miss", "bypass")
    (line,) = [line for line in _access_lines(caplog) if line["route"] == route]
    assert line["status"] == 200 and line["tenant"] == "alpha"
    assert line["request_id"] == answer.headers["x-request-id"]
    (span,) = exporter.get_finished_spans()
    assert dict(span.attributes or {})["gen_ai.operation.name"] == OPERATIONS[route]
    assert dict(span.attributes or {})["kvgate.cache.result"] == answer.headers["x-kvgate-cache"]
    assert client.get("/metrics").text.count(f'route="{route}"') > before


@pytest.mark.parametrize(("route", "path", "body"), REQUESTS, ids=[route for route, _, _ in REQUESTS])
def test_a_bad_priority_is_refused_in_the_apis_own_shape_and_logged(
    gateway: tuple[TestClient, InMemorySpanExporter],
    caplog: pytest.LogCaptureFixture,
    route: str,
    path: str,
    body: dict[str, Any],
) -> None:
    client, _ = gateway
    caplog.set_level(logging.INFO, logger="kvgate.access")

    answer = client.post(path, json=body, headers=_headers(route, **{"x-kvgate-priority": "high"}))

    assert answer.status_code == 400
    error = answer.json()
    if route == "messages":
        assert error["type"] == "error" and error["error"]["type"] == "invalid_request_error"
    else:
        assert error["error"]["param"] == "x-kvgate-priority"
    (line,) = [line for line in _access_lines(caplog) if line["route"] == route]
    assert (line["status"], line["cache"]) == (400, "error")
    metrics = client.get("/metrics").text
    assert f'kvgate_request_errors_total{{route="{route}",status="400"}}' in metrics


def test_a_refused_key_has_its_access_line(
    gateway: tuple[TestClient, InMemorySpanExporter], caplog: pytest.LogCaptureFixture
) -> None:
    client, _ = gateway
    caplog.set_level(logging.INFO, logger="kvgate.access")
    _, path, body = REQUESTS[0]

    answer = client.post(path, json=body, headers=auth("no-such-key"))

    assert answer.status_code == 401
    (line,) = _access_lines(caplog)
    assert (line["route"], line["status"], line["tenant"]) == ("chat", 401, "-")


def test_the_messages_api_reaches_the_upstream_with_its_key_and_version(
    gateway: tuple[TestClient, InMemorySpanExporter], upstream_calls: list[dict[str, Any]]
) -> None:
    client, _ = gateway
    _, path, body = REQUESTS[3]
    body = body | {"messages": [{"role": "user", "content": "Which key?"}]}

    assert client.post(path, json=body, headers=_headers("messages")).status_code == 200

    sent = upstream_calls[-1]
    assert (sent["x-api-key"], sent["version"]) == ("upstream-key", "2023-06-01")
