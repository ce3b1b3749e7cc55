"""W3C trace context: parsed from the client, on every log line of the request, continued and forwarded."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from gateway.http.app import create_app
from gateway.observability.request_log import JsonFormatter
from gateway.observability.tracecontext import parse_traceparent
from gateway.observability.tracing import Tracing
from tests.gateway.conftest import auth, chat, make_settings
from tests.gateway.fakes import ScriptedBackend
from tests.gateway.live_server import serve
from tests.gateway.traffic.test_breaker import MODEL, ask, make_flaky_upstream

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
TRACEPARENT = f"00-{TRACE_ID}-00f067aa0ba902b7-01"


class JsonLines(logging.Handler):
    """Formats while the request runs (the trace id lives in a contextvar)."""

    def __init__(self) -> None:
        super().__init__()
        self.setFormatter(JsonFormatter())
        self.lines: list[dict[str, Any]] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(json.loads(self.format(record)))


@pytest.fixture
def lines() -> Iterator[list[dict[str, Any]]]:
    handler = JsonLines()
    logger = logging.getLogger("kvgate")
    level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        yield handler.lines
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)


def test_parse_traceparent() -> None:
    parsed = parse_traceparent(TRACEPARENT)
    assert parsed is not None and parsed.trace_id == TRACE_ID and parsed.traceparent == TRACEPARENT
    for bad in [
        None,
        "",
        "garbage",
        f"ff-{TRACE_ID}-00f067aa0ba902b7-01",
        f"00-{'0' * 32}-00f067aa0ba902b7-01",
    ]:
        assert parse_traceparent(bad) is None


def test_every_log_line_of_a_request_carries_its_trace_id(
    tmp_path: Path, lines: list[dict[str, Any]]
) -> None:
    app = create_app(make_settings(tmp_path), backend_factory=lambda settings: ScriptedBackend())
    with TestClient(app) as client:
        client.post(
            "/v1/chat/completions", json=chat("trace me"), headers=auth() | {"traceparent": TRACEPARENT}
        )
        client.post("/v1/chat/completions", json=chat("no header"), headers=auth())
    access = [line for line in lines if line["logger"] == "kvgate.access"]
    assert access[0]["trace_id"] == TRACE_ID
    assert len(access[1]["trace_id"]) == 32 and access[1]["trace_id"] != TRACE_ID  # a fresh trace per request


def test_span_continues_the_client_trace(tmp_path: Path, lines: list[dict[str, Any]]) -> None:
    exporter = InMemorySpanExporter()
    app = create_app(make_settings(tmp_path), backend_factory=lambda settings: ScriptedBackend())
    app.state.tracing = Tracing(SimpleSpanProcessor(exporter))
    with TestClient(app) as client:
        client.post("/v1/chat/completions", json=chat("span"), headers=auth() | {"traceparent": TRACEPARENT})
    (span,) = exporter.get_finished_spans()
    assert format(span.context.trace_id, "032x") == TRACE_ID
    assert span.parent is not None and format(span.parent.span_id, "016x") == "00f067aa0ba902b7"
    access = next(line for line in lines if line["logger"] == "kvgate.access")
    assert access["trace_id"] == TRACE_ID and access["span_id"] == format(span.context.span_id, "016x")


def test_traceparent_is_forwarded_to_the_upstream(tmp_path: Path) -> None:
    calls: list[str] = []
    with serve(make_flaky_upstream({"now": "ok"}, calls)) as upstream_url:
        settings = make_settings(
            tmp_path, api_keys=None, upstream_url=upstream_url + "/v1", upstream_models=MODEL
        )
        with TestClient(create_app(settings)) as client:
            client.headers["traceparent"] = TRACEPARENT
            assert ask(client, "forward my trace").status_code == 200
    assert calls == [TRACEPARENT]  # tracing off: kvgate passes the client's context through unchanged
