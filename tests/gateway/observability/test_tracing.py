"""GenAI-convention spans for completion requests, exported through an in-memory exporter."""

from __future__ import annotations

from pathlib import Path

from fastapi.testclient import TestClient
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from gateway.http.app import create_app
from gateway.observability.tracing import Tracing
from tests.gateway.conftest import auth, chat, make_settings
from tests.gateway.fakes import MODEL, ScriptedBackend


def test_spans_follow_the_genai_conventions_without_prompt_text(tmp_path: Path) -> None:
    exporter = InMemorySpanExporter()
    app = create_app(make_settings(tmp_path), backend_factory=lambda settings: ScriptedBackend())
    app.state.tracing = Tracing(SimpleSpanProcessor(exporter))
    with TestClient(app) as client:
        client.post("/v1/chat/completions", json=chat("Trace the moon", max_tokens=9), headers=auth())
        client.post("/v1/chat/completions", json=chat("Trace the moon", max_tokens=9), headers=auth())
        client.post("/v1/completions", json={"model": MODEL, "prompt": "Trace"}, headers=auth())

    miss, hit, legacy = exporter.get_finished_spans()
    assert miss.name == f"chat {MODEL}" and legacy.name == f"text_completion {MODEL}"
    attributes = dict(miss.attributes or {})
    assert attributes["gen_ai.operation.name"] == "chat"
    assert attributes["gen_ai.request.model"] == MODEL
    assert attributes["gen_ai.request.max_tokens"] == 9
    assert (attributes["gen_ai.usage.input_tokens"], attributes["gen_ai.usage.output_tokens"]) == (6, 4)
    assert attributes["kvgate.cache.result"] == "miss"
    assert dict(hit.attributes or {})["kvgate.cache.result"] == "exact-hit"
    assert "Trace the moon" not in str([dict(span.attributes or {}) for span in (miss, hit, legacy)])


def test_tracing_is_off_without_an_endpoint() -> None:
    assert not Tracing.from_endpoint(None).enabled
    assert Tracing.from_endpoint("http://127.0.0.1:4318").enabled
