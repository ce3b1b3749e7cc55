"""Reverse-proxy mode against a real local OpenAI-compatible upstream (a small FastAPI app on loopback)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from gateway.http.app import create_app
from tests.gateway.conftest import make_settings
from tests.gateway.live_server import serve
from tests.gateway.openai_upstream import reply, text_whole

UPSTREAM_MODEL = "upstream-llm"


def make_upstream(seen: list[dict[str, Any]]) -> FastAPI:
    upstream = FastAPI()

    @upstream.post("/v1/chat/completions")
    async def chat(request: Request) -> Any:
        body = await request.json()
        seen.append(body)
        if request.headers.get("authorization") != "Bearer upstream-key":
            return JSONResponse({"error": {"message": "bad key", "type": "invalid_request_error"}}, 401)
        question = body["messages"][-1]["content"]
        if "overloaded" in question:
            error = {
                "message": "upstream overloaded",
                "type": "rate_limit_error",
                "param": None,
                "code": "busy",
            }
            return JSONResponse({"error": error}, status_code=429)

        return reply(body, text_whole(body["model"], f"upstream says: {question}"), chat=True)

    return upstream


@pytest.fixture(scope="module")
def seen() -> list[dict[str, Any]]:
    return []


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory, seen: list[dict[str, Any]]) -> Iterator[openai.OpenAI]:
    data_dir: Path = tmp_path_factory.mktemp("upstream")
    with serve(make_upstream(seen)) as upstream_url:
        settings = make_settings(
            data_dir,
            api_keys=None,
            upstream_url=upstream_url + "/v1",
            upstream_api_key="upstream-key",
            upstream_models=UPSTREAM_MODEL,
        )
        with (
            serve(create_app(settings)) as url,
            openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0) as sdk,
        ):
            yield sdk


def test_misses_go_upstream_and_are_stored(client: openai.OpenAI, seen: list[dict[str, Any]]) -> None:
    first = client.chat.completions.with_raw_response.create(
        model=UPSTREAM_MODEL, messages=[{"role": "user", "content": "What is kvgate?"}]
    )
    assert first.headers["x-kvgate-cache"] == "miss"
    assert first.parse().choices[0].message.content == "upstream says: What is kvgate?"
    assert first.parse().usage.prompt_tokens == 7
    assert "stream" not in seen[-1] and seen[-1]["model"] == UPSTREAM_MODEL  # the body as the client sent it

    calls = len(seen)
    stream = client.chat.completions.create(
        model=UPSTREAM_MODEL, messages=[{"role": "user", "content": "What is kvgate?"}], stream=True
    )
    assert "".join(chunk.choices[0].delta.content or "" for chunk in stream if chunk.choices) == (
        "upstream says: What is kvgate?"
    )
    assert len(seen) == calls  # answered from the cache


def test_streamed_miss_is_passed_through_and_stored(
    client: openai.OpenAI, seen: list[dict[str, Any]]
) -> None:
    stream = client.chat.completions.create(
        model=UPSTREAM_MODEL, messages=[{"role": "user", "content": "Stream me"}], stream=True
    )
    assert "".join(chunk.choices[0].delta.content or "" for chunk in stream if chunk.choices) == (
        "upstream says: Stream me"
    )
    again = client.chat.completions.with_raw_response.create(
        model=UPSTREAM_MODEL, messages=[{"role": "user", "content": "Stream me"}]
    )
    assert again.headers["x-kvgate-cache"] == "exact-hit"


def test_upstream_errors_keep_status_and_shape(client: openai.OpenAI) -> None:
    with pytest.raises(openai.RateLimitError) as error:
        client.chat.completions.create(
            model=UPSTREAM_MODEL, messages=[{"role": "user", "content": "overloaded?"}]
        )
    assert error.value.code == "busy" and "upstream overloaded" in str(error.value)
