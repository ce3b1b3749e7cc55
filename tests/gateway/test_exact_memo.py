"""The exact-hit memo (gateway/apis/exact_memo.py): a repeated exact hit answered from an in-process copy, the
same answer the pipeline gives, logged and counted alike, and never once the entry is gone or replaced."""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from httpx import Response

from gateway.http.app import create_app
from tests.gateway.conftest import admin, auth, chat, make_settings
from tests.gateway.fakes import ScriptedBackend

ROUTE = "/v1/chat/completions"
QUESTION = "What is the capital of France?"


def ask(client: TestClient, content: str = QUESTION, key: str = "key-alpha", **fields: Any) -> Response:
    headers = auth(key) | fields.pop("headers", {})
    return client.post(ROUTE, json=chat(content, **fields), headers=headers)


def served_from_memo(client: TestClient) -> int:
    memo = client.app.state.exact_memo  # type: ignore[attr-defined]
    return int(memo.served)


def without_ids(response: Response) -> dict[str, Any]:
    body: dict[str, Any] = response.json()
    return {name: value for name, value in body.items() if name not in ("id", "created")}


def test_a_repeated_exact_hit_is_answered_from_the_memo_as_the_pipeline_answers_it(
    client: TestClient, backend: ScriptedBackend, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="kvgate.access")
    miss, learnt, copied = ask(client), ask(client), ask(client)

    assert served_from_memo(client) == 1
    assert len(backend.calls) == 1
    assert [r.headers["x-kvgate-cache"] for r in (miss, learnt, copied)] == ["miss", "exact-hit", "exact-hit"]
    assert copied.headers["x-kvgate-entry-id"] == learnt.headers["x-kvgate-entry-id"]
    assert sorted(copied.headers) == sorted(learnt.headers)
    assert copied.headers["x-request-id"] != learnt.headers["x-request-id"]
    assert without_ids(copied) == without_ids(learnt) == without_ids(miss)
    assert copied.json()["id"] != learnt.json()["id"]
    lines = [vars(record) for record in caplog.records if record.name == "kvgate.access"]
    assert [line["cache"] for line in lines] == ["miss", "exact-hit", "exact-hit"]
    assert lines[-1]["request_id"] == copied.headers["x-request-id"]
    assert lines[-1]["tenant"] == "alpha" and lines[-1]["status"] == 200
    stats = client.get("/admin/stats", headers=admin()).json()["since_start"]["by_tenant"]["alpha"]
    assert (stats["requests"], stats["exact_hit"], stats["miss"]) == (3, 2, 1)
    counted = 'kvgate_requests_total{cache="exact_hit",model="fake-model",route="chat",tenant="alpha"} 2.0'
    assert counted in client.get("/metrics").text


def test_a_stream_is_replayed_from_the_memo(client: TestClient) -> None:
    fields = {"stream": True, "stream_options": {"include_usage": True}}
    _, learnt, copied = (ask(client, **fields) for _ in range(3))

    assert served_from_memo(client) == 1
    assert copied.headers["content-type"].startswith("text/event-stream")
    chunks = [line for line in copied.text.splitlines() if line.startswith("data: {")]
    text = "".join(
        choice["delta"].get("content") or ""
        for chunk in chunks
        for choice in json.loads(chunk[len("data: ") :])["choices"]
    )
    assert text == f"echo: {QUESTION}"
    assert copied.text.rstrip().endswith("data: [DONE]")
    assert learnt.headers["x-kvgate-cache"] == copied.headers["x-kvgate-cache"] == "exact-hit"


def test_the_memo_never_answers_another_tenant(client: TestClient, backend: ScriptedBackend) -> None:
    for _ in range(3):
        ask(client)
    other = ask(client, key="key-beta")
    assert other.headers["x-kvgate-cache"] == "miss"
    assert len(backend.calls) == 2


def test_an_unknown_key_is_refused_even_for_a_body_the_memo_holds(client: TestClient) -> None:
    for _ in range(3):
        ask(client)
    refused = client.post(ROUTE, json=chat(QUESTION), headers={"Authorization": "Bearer nope"})
    assert refused.status_code == 401
    assert refused.json()["error"]["code"] == "invalid_api_key"


def test_a_purged_answer_is_never_served_from_the_memo(client: TestClient, backend: ScriptedBackend) -> None:
    for _ in range(3):
        ask(client)
    assert client.post("/admin/purge", json={"tenant": "alpha"}, headers=admin()).json() == {"purged": 1}

    again = ask(client)

    assert again.headers["x-kvgate-cache"] == "miss"
    assert len(backend.calls) == 2


def test_a_purge_in_another_process_reaches_the_memo_through_the_change_stream(tmp_path: Path) -> None:
    """Two apps on one store, as two workers: a purge through one is never served from the other's copy."""
    first = make_settings(tmp_path / "one", exact_memo_revalidate_s=60)
    with TestClient(create_app(first, backend_factory=lambda s: ScriptedBackend())) as one:
        url = one.app.state.store.url  # type: ignore[attr-defined]
        second = make_settings(tmp_path / "two", redis_url=url, exact_memo_revalidate_s=60)
        with TestClient(create_app(second, backend_factory=lambda s: ScriptedBackend())) as two:
            for _ in range(3):
                ask(two)
            assert served_from_memo(two) == 1
            sync = two.app.state.service.cache.sync  # type: ignore[attr-defined]
            applied = sync.applied
            assert one.post("/admin/purge", json={"tenant": "alpha"}, headers=admin()).json() == {"purged": 1}
            deadline = time.monotonic() + 5
            while (
                sync.applied == applied and time.monotonic() < deadline
            ):  # the delete's event, through Redis
                time.sleep(0.01)

            again = ask(two)

            assert again.headers["x-kvgate-cache"] == "miss"
            assert served_from_memo(two) == 1


def test_an_answer_replaced_under_max_age_replaces_the_copy_at_once(tmp_path: Path) -> None:
    """Read again only after a minute here, so that what is checked is the scope's change epoch."""
    settings = make_settings(tmp_path, exact_memo_revalidate_s=60)
    with TestClient(create_app(settings, backend_factory=lambda s: ScriptedBackend())) as client:
        ask(client)
        old = ask(client).headers["x-kvgate-entry-id"]
        ask(client)
        assert served_from_memo(client) == 1
        time.sleep(1.05)
        refreshed = ask(client, headers={"Cache-Control": "max-age=1"})  # older than a second: replaced
        assert refreshed.headers["x-kvgate-cache"] == "miss"

        after = ask(client)

        assert after.headers["x-kvgate-cache"] == "exact-hit"
        assert after.headers["x-kvgate-entry-id"] != old
        assert served_from_memo(client) == 1


def test_a_request_with_cache_controls_takes_the_pipeline(
    client: TestClient, backend: ScriptedBackend
) -> None:
    for _ in range(3):
        ask(client)
    served = served_from_memo(client)

    bypassed = ask(client, headers={"Cache-Control": "no-cache"})

    assert bypassed.headers["x-kvgate-cache"] == "bypass"
    assert served_from_memo(client) == served
    assert len(backend.calls) == 2


def test_an_entry_deleted_behind_kvgates_back_is_not_served_after_the_revalidation_interval(
    client: TestClient, backend: ScriptedBackend
) -> None:
    """No event tells of a key deleted by hand (or evicted): the copy is read again within a second."""
    for _ in range(3):
        ask(client)
    redis = client.app.state.store.client  # type: ignore[attr-defined]

    async def delete_by_hand() -> int:
        keys = [key async for key in redis.scan_iter(match="kvgate:sc:*:[xe]:*")]
        return int(await redis.delete(*keys))

    assert client.portal.call(delete_by_hand) == 2  # type: ignore[union-attr]
    time.sleep(client.app.state.settings.exact_memo_revalidate_s + 0.05)  # type: ignore[attr-defined]

    assert ask(client).headers["x-kvgate-cache"] == "miss"
    assert len(backend.calls) == 2


def test_hits_answered_from_the_memo_are_counted_on_the_entry(client: TestClient) -> None:
    for _ in range(5):
        ask(client)  # a miss, a hit through the pipeline, three from the memo
    time.sleep(client.app.state.settings.exact_memo_revalidate_s + 0.05)  # type: ignore[attr-defined]
    ask(client)  # reads the entry again, counting the hits served meanwhile
    redis = client.app.state.store.client  # type: ignore[attr-defined]

    async def hits() -> int:
        (key,) = [key async for key in redis.scan_iter(match="kvgate:sc:*:e:*")]
        return int(await redis.hget(key, "hits"))

    assert client.portal.call(hits) == 5  # type: ignore[union-attr]


def test_no_memo_when_switched_off(tmp_path: Path) -> None:
    backend = ScriptedBackend()
    settings = make_settings(tmp_path, exact_memo_revalidate_s=0)
    with TestClient(create_app(settings, backend_factory=lambda s: backend)) as client:
        answers = [ask(client).headers["x-kvgate-cache"] for _ in range(3)]
        assert client.app.state.exact_memo is None  # type: ignore[attr-defined]
    assert answers == ["miss", "exact-hit", "exact-hit"]


def test_the_memo_keeps_within_its_bytes_oldest_out_first(client: TestClient) -> None:
    memo = client.app.state.exact_memo  # type: ignore[attr-defined]
    memo.max_bytes = 2_500  # room for one copy of these requests (body, answer, prompt and 1 KB each)
    for content in ("First question?", "Second question?"):
        for _ in range(2):
            ask(client, content)
    assert len(memo) == 1
    assert ask(client, "Second question?").headers["x-kvgate-cache"] == "exact-hit"
    assert memo.served == 1
    assert ask(client, "First question?").headers["x-kvgate-cache"] == "exact-hit"  # through the pipeline
    assert memo.served == 1


def test_messages_callers_named_by_x_api_key_are_told_apart(
    client: TestClient, backend: ScriptedBackend
) -> None:
    body = {"model": "fake-model", "max_tokens": 32, "messages": [{"role": "user", "content": QUESTION}]}

    def ask_messages(key: str) -> Response:
        headers = {"x-api-key": key, "anthropic-version": "2023-06-01"}
        return client.post("/v1/messages", json=body, headers=headers)

    kinds = [ask_messages("key-alpha").headers["x-kvgate-cache"] for _ in range(3)]
    assert kinds == ["miss", "exact-hit", "exact-hit"] and served_from_memo(client) == 1
    assert ask_messages("key-beta").headers["x-kvgate-cache"] == "miss"
    assert ask_messages("wrong").status_code == 401
    assert len(backend.calls) == 2


def test_no_copy_is_kept_of_a_hit_read_while_an_entry_went(
    client: TestClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A purge between the lookup's read and the answer: what the lookup read may be gone, so no copy."""
    service = client.app.state.service  # type: ignore[attr-defined]
    answer = service.answer

    async def answer_then_an_entry_goes(call: Any) -> Any:
        answered = await answer(call)
        service.cache.epochs.moved("some other scope")
        return answered

    monkeypatch.setattr(service, "answer", answer_then_an_entry_goes)
    kinds = [ask(client).headers["x-kvgate-cache"] for _ in range(3)]
    assert kinds == ["miss", "exact-hit", "exact-hit"]
    assert len(client.app.state.exact_memo) == 0 and served_from_memo(client) == 0  # type: ignore[attr-defined]
