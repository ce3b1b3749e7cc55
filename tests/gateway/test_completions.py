"""The completion routes against a scripted backend: JSON, SSE, cache headers and replay."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from gateway.http.app import create_app
from tests.gateway.conftest import admin, auth, chat, make_settings
from tests.gateway.fakes import MODEL, ScriptedBackend


def sse_events(text: str) -> list[str]:
    return [line[len("data: ") :] for line in text.splitlines() if line.startswith("data: ")]


def test_miss_then_exact_hit_returns_the_same_answer(client: TestClient, backend: ScriptedBackend) -> None:
    first = client.post("/v1/chat/completions", json=chat("What is the capital of France?"), headers=auth())
    second = client.post("/v1/chat/completions", json=chat("What is the capital of France?"), headers=auth())

    assert first.status_code == 200 and second.status_code == 200
    assert first.headers["x-kvgate-cache"] == "miss"
    assert second.headers["x-kvgate-cache"] == "exact-hit"
    one, two = first.json(), second.json()
    assert one["choices"][0]["message"]["content"] == "echo: What is the capital of France?"
    assert two["choices"][0]["message"] == one["choices"][0]["message"]
    assert two["id"] != one["id"] and two["id"].startswith("chatcmpl-")
    assert one["usage"]["prompt_tokens_details"]["cached_tokens"] == 2  # the engine's prefix reuse
    assert len(backend.calls) == 1


def test_paraphrase_is_a_semantic_hit_with_similarity_and_entry_id(client: TestClient) -> None:
    client.post("/v1/chat/completions", json=chat("How do I reset my password?"), headers=auth())
    response = client.post("/v1/chat/completions", json=chat("How can I reset my password?"), headers=auth())

    assert response.headers["x-kvgate-cache"] == "semantic-hit"
    assert 0.9 <= float(response.headers["x-kvgate-similarity"]) <= 1.0
    assert len(response.headers["x-kvgate-entry-id"]) >= 16


def test_streaming_miss_then_streamed_replay(client: TestClient) -> None:
    body = chat("Tell me about streams", stream=True, stream_options={"include_usage": True})
    live = client.post("/v1/chat/completions", json=body, headers=auth())
    replay = client.post("/v1/chat/completions", json=body, headers=auth())

    for response, expected_cache in ((live, "miss"), (replay, "exact-hit")):
        assert response.headers["content-type"].startswith("text/event-stream")
        assert response.headers["x-kvgate-cache"] == expected_cache
        events = sse_events(response.text)
        assert events[-1] == "[DONE]"
        chunks = [json.loads(event) for event in events[:-1]]
        assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
        text = "".join(
            chunk["choices"][0]["delta"].get("content", "") for chunk in chunks if chunk["choices"]
        )
        assert text == "echo: Tell me about streams"
        finish = [chunk["choices"][0]["finish_reason"] for chunk in chunks if chunk["choices"]]
        assert finish[-1] == "stop"
        assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 5
        assert len({chunk["id"] for chunk in chunks}) == 1


def test_legacy_completions_json_and_stream(client: TestClient) -> None:
    body = {"model": MODEL, "prompt": "Once upon a time", "max_tokens": 8}
    whole = client.post("/v1/completions", json=body, headers=auth()).json()
    assert whole["object"] == "text_completion"
    assert whole["choices"][0]["text"] == "echo: Once upon a time"

    streamed = client.post("/v1/completions", json=body | {"stream": True}, headers=auth())
    events = sse_events(streamed.text)
    text = "".join(json.loads(event)["choices"][0]["text"] for event in events[:-1])
    assert text == "echo: Once upon a time" and events[-1] == "[DONE]"


def test_models_lists_the_backend_models(client: TestClient) -> None:
    body = client.get("/v1/models", headers=auth()).json()
    assert body["object"] == "list" and [card["id"] for card in body["data"]] == [MODEL]


def test_tenants_never_share_answers(client: TestClient, backend: ScriptedBackend) -> None:
    client.post("/v1/chat/completions", json=chat("Shared question?"), headers=auth("key-alpha"))
    other = client.post("/v1/chat/completions", json=chat("Shared question?"), headers=auth("key-beta"))
    assert other.headers["x-kvgate-cache"] == "miss"
    assert len(backend.calls) == 2


def test_truncated_answers_are_stored_and_replayed_as_truncated(
    client: TestClient, backend: ScriptedBackend
) -> None:
    backend.finish_reason = "length"
    client.post("/v1/chat/completions", json=chat("Long one", max_tokens=2), headers=auth())
    again = client.post("/v1/chat/completions", json=chat("Long one", max_tokens=2), headers=auth())
    assert again.headers["x-kvgate-cache"] == "exact-hit"
    assert again.json()["choices"][0]["finish_reason"] == "length"
    assert len(backend.calls) == 1


def test_truncated_answers_are_not_stored_when_opted_out(tmp_path: Path) -> None:
    backend = ScriptedBackend(finish_reason="length")
    app = create_app(make_settings(tmp_path, store_truncated=False), backend_factory=lambda _: backend)
    with TestClient(app) as client:
        client.post("/v1/chat/completions", json=chat("Long one", max_tokens=2), headers=auth())
        again = client.post("/v1/chat/completions", json=chat("Long one", max_tokens=2), headers=auth())
    assert again.headers["x-kvgate-cache"] == "miss"
    assert again.json()["choices"][0]["finish_reason"] == "length"
    assert len(backend.calls) == 2


STORED, VERIFIED = "How many moons does Mars have?", "How many moons does the planet Mars have?"


def test_a_served_paraphrase_is_remembered_as_an_exact_hit(
    client: TestClient, backend: ScriptedBackend
) -> None:
    # A paraphrase the verifier judges (not a near-duplicate, which a raised bar still serves).
    client.post("/v1/chat/completions", json=chat(STORED), headers=auth())
    semantic = client.post("/v1/chat/completions", json=chat(VERIFIED), headers=auth())
    again = client.post("/v1/chat/completions", json=chat(VERIFIED), headers=auth())
    assert semantic.headers["x-kvgate-cache"] == "semantic-hit"
    assert again.headers["x-kvgate-cache"] == "exact-hit"
    assert again.headers["x-kvgate-entry-id"] == semantic.headers["x-kvgate-entry-id"]
    assert again.json()["choices"][0]["message"] == semantic.json()["choices"][0]["message"]
    strict = client.post(  # a raised bar is never met by a remembered wording: judged again
        "/v1/chat/completions",
        json=chat(VERIFIED),
        headers=auth() | {"x-kvgate-semantic-strictness": "1"},
    )
    assert strict.headers["x-kvgate-cache"] == "miss"
    other_tenant = client.post("/v1/chat/completions", json=chat(VERIFIED), headers=auth("key-beta"))
    assert other_tenant.headers["x-kvgate-cache"] == "miss"

    entry_id = semantic.headers["x-kvgate-entry-id"]
    purged = client.post("/admin/purge", json={"entry_id": entry_id}, headers=admin())
    assert purged.json() == {"purged": 1}
    after = client.post("/v1/chat/completions", json=chat(VERIFIED), headers=auth())
    assert after.headers["x-kvgate-cache"] == "miss"  # the purge took the remembered wording with it
    assert len(backend.calls) == 4  # the first ask, the strict one, the other tenant's, after the purge


def remember_a_paraphrase(client: TestClient, stored_with: dict[str, str]) -> None:
    """Store a question (with these headers), then ask a paraphrase twice: a semantic hit, then remembered."""
    client.post("/v1/chat/completions", json=chat("How do I reset my password?"), headers=stored_with)
    semantic = client.post("/v1/chat/completions", json=chat("How can I reset my password?"), headers=auth())
    again = client.post("/v1/chat/completions", json=chat("How can I reset my password?"), headers=auth())
    kinds = (semantic.headers["x-kvgate-cache"], again.headers["x-kvgate-cache"])
    assert kinds == ("semantic-hit", "exact-hit")


@pytest.mark.parametrize(
    "selector", [{"tenant": "alpha"}, {"tag": "billing"}], ids=["purge by tenant", "purge by tag"]
)
def test_a_purge_by_tenant_or_tag_takes_the_remembered_wording_with_the_entry(
    client: TestClient, backend: ScriptedBackend, selector: dict[str, str]
) -> None:
    remember_a_paraphrase(client, auth() | {"x-kvgate-tags": "billing"})
    purged = client.post("/admin/purge", json=selector, headers=admin())
    assert purged.json() == {"purged": 1}
    after = client.post("/v1/chat/completions", json=chat("How can I reset my password?"), headers=auth())
    assert after.headers["x-kvgate-cache"] == "miss"  # neither the remembered wording nor the entry is left
    assert len(backend.calls) == 2


def test_a_remembered_wording_expires_with_its_entry(client: TestClient, backend: ScriptedBackend) -> None:
    remember_a_paraphrase(client, auth() | {"Cache-Control": "max-age=1"})  # stored with a one-second TTL
    time.sleep(1.3)
    after = client.post("/v1/chat/completions", json=chat("How can I reset my password?"), headers=auth())
    assert after.headers["x-kvgate-cache"] == "miss"
    assert len(backend.calls) == 2


def test_no_store_requests_leave_nothing_remembered(client: TestClient) -> None:
    client.post("/v1/chat/completions", json=chat("How do I reset my password?"), headers=auth())
    no_store = {"Cache-Control": "no-store"}
    first = client.post(
        "/v1/chat/completions", json=chat("How can I reset my password?"), headers=auth() | no_store
    )
    again = client.post("/v1/chat/completions", json=chat("How can I reset my password?"), headers=auth())
    assert first.headers["x-kvgate-cache"] == "semantic-hit"
    assert again.headers["x-kvgate-cache"] == "semantic-hit"


def test_at_the_default_target_a_near_duplicate_hits_and_a_direction_swap_misses(tmp_path: Path) -> None:
    backend = ScriptedBackend()
    settings = make_settings(tmp_path, target_false_hit_rate=0.02)  # the default, stated
    with TestClient(create_app(settings, backend_factory=lambda _: backend)) as client:
        client.post(
            "/v1/chat/completions", json=chat("How do I redirect HTTP to HTTPS in nginx?"), headers=auth()
        )
        asked = {
            "Quick question: how do I redirect HTTP to HTTPS in nginx? Thanks!": "semantic-hit",
            "How do I redirect HTTP to HTTPS in ngnix?": "semantic-hit",  # a typo
            "How do I redirect HTTPS to HTTP in nginx?": "miss",  # the other direction
        }
        for prompt, expected in asked.items():
            response = client.post("/v1/chat/completions", json=chat(prompt), headers=auth())
            assert response.headers["x-kvgate-cache"] == expected, prompt
    assert len(backend.calls) == 2


def test_embeddings_in_engine_mode_come_from_kvgates_embedder(client: TestClient) -> None:
    body = {"model": "all-MiniLM-L6-v2", "input": ["How do I reset my password?", "Where is my invoice?"]}
    first = client.post("/v1/embeddings", json=body, headers=auth())
    assert first.status_code == 200 and first.headers["x-kvgate-cache"] == "miss"
    data = first.json()["data"]
    assert [item["index"] for item in data] == [0, 1] and len(data[0]["embedding"]) == 384
    again = client.post("/v1/embeddings", json=body, headers=auth())
    assert again.headers["x-kvgate-cache"] == "exact-hit" and again.json()["data"] == data
    other_tenant = client.post("/v1/embeddings", json=body, headers=auth("key-beta"))
    assert other_tenant.headers["x-kvgate-cache"] == "miss"  # never across tenants

    unknown = client.post("/v1/embeddings", json=body | {"model": "text-embedding-3-small"}, headers=auth())
    assert unknown.status_code == 404 and unknown.json()["error"]["code"] == "model_not_found"
    resized = client.post("/v1/embeddings", json=body | {"dimensions": 64}, headers=auth())
    assert resized.status_code == 400 and resized.json()["error"]["param"] == "dimensions"
    empty = client.post("/v1/embeddings", json=body | {"input": []}, headers=auth())
    assert empty.status_code == 400 and "error" in empty.json()


def test_anthropic_messages_in_engine_mode(client: TestClient) -> None:
    body = {
        "model": MODEL,
        "max_tokens": 32,
        "system": "Be brief.",
        "messages": [{"role": "user", "content": "Hello there"}],
    }
    headers = {"x-api-key": "key-alpha", "anthropic-version": "2023-06-01"}
    first = client.post("/v1/messages", json=body, headers=headers)
    assert first.status_code == 200 and first.headers["x-kvgate-cache"] == "miss"
    message = first.json()
    assert message["type"] == "message" and message["content"] == [
        {"type": "text", "text": "echo: Hello there"}
    ]
    assert message["stop_reason"] == "end_turn" and message["usage"]["output_tokens"] > 0
    again = client.post("/v1/messages", json=body | {"stream": True}, headers=headers)
    assert again.headers["x-kvgate-cache"] == "exact-hit"
    events = [line.removeprefix("event: ") for line in again.text.splitlines() if line.startswith("event: ")]
    assert events[0] == "message_start" and events[-1] == "message_stop" and "content_block_delta" in events
    streamed = client.post(
        "/v1/messages",
        json=body | {"stream": True, "messages": [{"role": "user", "content": "Stream it"}]},
        headers=headers,
    )
    assert streamed.headers["x-kvgate-cache"] == "miss"
    deltas = [
        json.loads(line.removeprefix("data: "))
        for line in streamed.text.splitlines()
        if line.startswith("data: ")
    ]
    assert (
        "".join(d["delta"].get("text", "") for d in deltas if d["type"] == "content_block_delta")
        == "echo: Stream it"
    )

    denied = client.post("/v1/messages", json=body, headers={"x-api-key": "wrong"})
    assert denied.status_code == 401 and denied.json()["type"] == "error"
    assert denied.json()["error"]["type"] == "authentication_error"
    tools = client.post(
        "/v1/messages", json=body | {"tools": [{"name": "f", "input_schema": {}}]}, headers=headers
    )
    assert tools.status_code == 400 and tools.json()["error"]["type"] == "invalid_request_error"
    missing = client.post(
        "/v1/messages", json={"model": MODEL, "messages": body["messages"]}, headers=headers
    )
    assert missing.status_code == 400 and "max_tokens" in missing.json()["error"]["message"]
