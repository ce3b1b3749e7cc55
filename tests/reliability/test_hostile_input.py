"""Hostile input: the HTTP API fuzzed from its own OpenAPI schema answers no 5xx and never hangs;
prompts built to collide never cross scopes; nothing stored is ever unpickled, YAML-loaded or
evaluated; bodies, messages and stored answers are bounded."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import hypothesis
import pytest
import schemathesis
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, Phase, given

from gateway.http.app import create_app
from tests.gateway.conftest import admin, auth, chat, make_settings
from tests.gateway.fakes import MODEL, ScriptedBackend
from tests.gateway.live_server import serve
from tests.reliability.prompts import TOPICS

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES_PER_ROUTE = 100
CALL_TIMEOUT_S = 5.0
OTHER_MODEL = "other-model"


@dataclass
class TwoModelBackend(ScriptedBackend):
    def served_models(self) -> list[str]:
        return [MODEL, OTHER_MODEL]


@pytest.fixture
def app_client(tmp_path: Path) -> Iterator[TestClient]:
    app = create_app(make_settings(tmp_path), backend_factory=lambda settings: TwoModelBackend())
    with TestClient(app) as client:
        yield client


@pytest.mark.slow
def test_fuzzed_requests_from_the_openapi_schema_never_5xx_or_hang(tmp_path: Path) -> None:
    app = create_app(make_settings(tmp_path), backend_factory=lambda settings: ScriptedBackend())
    schema = schemathesis.openapi.from_dict(app.openapi())
    seen: dict[str, int] = {}
    with serve(app) as base:
        for result in schema.get_all_operations():
            operation = result.ok()
            headers = admin() if operation.path.startswith("/admin") else auth()
            seen[f"{operation.method.upper()} {operation.path}"] = _fuzz(operation, base, headers)
    assert "POST /v1/chat/completions" in seen and "POST /admin/purge" in seen
    print(f"\nfuzzed {sum(seen.values())} requests over {len(seen)} routes: {seen}")


def test_the_same_last_turn_never_crosses_tenants_system_prompts_or_models(app_client: TestClient) -> None:
    question = TOPICS[0]
    assert app_client.post("/v1/chat/completions", json=chat(question), headers=auth()).status_code == 200
    assert _cache(app_client, chat(question), auth()) == "exact-hit"
    variants = [
        (chat(question), auth("key-beta")),
        (chat(question, model=OTHER_MODEL), auth()),
        (
            {
                "model": MODEL,
                "messages": [
                    {"role": "system", "content": "You are a pirate."},
                    {"role": "user", "content": question},
                ],
            },
            auth(),
        ),
        (
            {
                "model": MODEL,
                "messages": [
                    {"role": "user", "content": "Earlier turn."},
                    {"role": "assistant", "content": "Earlier answer."},
                    {"role": "user", "content": question},
                ],
            },
            auth(),
        ),
    ]
    for body, headers in variants:
        assert _cache(app_client, body, headers) == "miss", body


def test_no_unsafe_deserialisation_in_the_source_tree() -> None:
    unsafe = [
        re.compile(r"\bpickle\.loads?\("),
        re.compile(r"\bcloudpickle\b|\bdill\.loads?\("),
        re.compile(r"\byaml\.(unsafe_)?load\((?![^)]*SafeLoader)"),
        re.compile(r"\bmarshal\.loads?\("),
        re.compile(r"(?<![\w.])eval\("),
        re.compile(r"(?<![\w.])exec\("),
        re.compile(r"torch\.load\((?![^)]*weights_only=True)"),
    ]
    found = []
    for package in ("gateway", "semantic", "prefix", "engine"):
        for path in (ROOT / package).rglob("*.py"):
            for number, line in enumerate(path.read_text().splitlines(), 1):
                if any(pattern.search(line) for pattern in unsafe):
                    found.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()}")
    assert not found, "\n".join(found)


def test_oversized_bodies_are_413(tmp_path: Path) -> None:
    app = create_app(
        make_settings(tmp_path, max_body_bytes=4096), backend_factory=lambda s: ScriptedBackend()
    )
    with TestClient(app) as client:
        many_messages = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}] * 1000}
        for body in (chat("x" * 10_000), many_messages):
            response = client.post("/v1/chat/completions", json=body, headers=auth())
            assert response.status_code == 413, response.text


def test_answers_over_the_stored_size_bound_are_served_but_not_stored(tmp_path: Path) -> None:
    settings = make_settings(tmp_path, max_stored_answer_bytes=1024)
    app = create_app(settings, backend_factory=lambda s: ScriptedBackend())
    with TestClient(app) as client:
        large = " ".join(["word"] * 400)  # echoed back: ~2 KB of answer
        assert _cache(client, chat(large), auth()) == "miss"
        assert _cache(client, chat(large), auth()) == "miss"
        assert _cache(client, chat(TOPICS[2]), auth()) == "miss"
        assert _cache(client, chat(TOPICS[2]), auth()) == "exact-hit"


def _fuzz(operation: Any, base: str, headers: dict[str, str]) -> int:
    """Send `EXAMPLES_PER_ROUTE` generated requests to one operation; returns how many went."""
    label = f"{operation.method.upper()} {operation.path}"
    sent = 0

    @hypothesis.settings(
        max_examples=EXAMPLES_PER_ROUTE,
        deadline=None,
        database=None,
        phases=[Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    @given(case=operation.as_strategy())
    def check(case: Any) -> None:
        nonlocal sent
        started = time.monotonic()
        response = case.call(base_url=base, headers=headers, timeout=CALL_TIMEOUT_S)
        elapsed = time.monotonic() - started
        assert response.status_code < 500, f"{label}: {response.status_code} {response.text[:300]}"
        assert elapsed < CALL_TIMEOUT_S, f"{label} took {elapsed:.1f} s"
        sent += 1

    check()
    return sent


def _cache(client: TestClient, body: dict[str, Any], headers: dict[str, str]) -> str:
    response = client.post("/v1/chat/completions", json=body, headers=headers)
    assert response.status_code == 200, response.text
    return response.headers["x-kvgate-cache"]
