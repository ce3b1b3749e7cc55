"""One JSON access line per request, without prompts or keys unless prompts are asked for."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from gateway.http.app import create_app
from gateway.observability.request_log import CoveredRoutes, JsonFormatter, configure_logging
from gateway.observability.tracecontext import TraceContext, current_trace
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


def test_lines_are_written_off_the_loop_with_the_callers_trace_ids(
    capsys: pytest.CaptureFixture[str],
) -> None:
    level = logging.getLogger().level
    listener = configure_logging("info", json_lines=True)
    try:
        token = current_trace.set(TraceContext("ab" * 16, "cd" * 8))
        try:
            logging.getLogger("kvgate.test").info("from the loop", extra={"tenant": "alpha"})
            try:
                raise ValueError("boom")
            except ValueError:
                logging.getLogger("kvgate.test").exception("failed")
        finally:
            current_trace.reset(token)
        covered = [f for f in logging.getLogger("uvicorn.access").filters if isinstance(f, CoveredRoutes)]
        assert len(covered) == 1
        for path, kept in (("/v1/chat/completions", False), ("/v1/completions", False), ("/healthz", True)):
            record = logging.makeLogRecord(
                {"msg": '%s - "%s %s HTTP/%s" %d', "args": ("127.0.0.1:1", "POST", path, "1.1", 200)}
            )
            assert covered[0].filter(record) is kept, path  # kvgate logs its own line for completions
    finally:
        listener.stop()
        logging.getLogger().handlers[:] = []
        logging.getLogger().setLevel(level)
        logging.getLogger("uvicorn.access").filters[:] = []
    lines = [json.loads(line) for line in capsys.readouterr().err.splitlines()]
    first, failed = lines
    assert (first["message"], first["tenant"], first["trace_id"], first["span_id"]) == (
        "from the loop",
        "alpha",
        "ab" * 16,
        "cd" * 8,
    )
    assert failed["message"] == "failed" and "ValueError: boom" in failed["exception"]
