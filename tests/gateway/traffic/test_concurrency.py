"""Over real connections: coalescing identical misses, client disconnects, overload."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from gateway.http.app import create_app
from tests.gateway.conftest import auth, chat, make_settings
from tests.gateway.fakes import ScriptedBackend
from tests.gateway.live_server import serve


@pytest.fixture
def slow_backend() -> ScriptedBackend:
    return ScriptedBackend(delay_s=0.05)


@pytest.fixture
def base_url(tmp_path: Path, slow_backend: ScriptedBackend) -> Iterator[str]:
    app = create_app(make_settings(tmp_path, max_pending=2), backend_factory=lambda settings: slow_backend)
    with serve(app) as url:
        yield url


async def test_identical_concurrent_misses_make_one_backend_call(
    base_url: str, slow_backend: ScriptedBackend
) -> None:
    async with httpx.AsyncClient(base_url=base_url, timeout=30) as client:
        responses = await asyncio.gather(
            *(
                client.post(
                    "/v1/chat/completions", json=chat("one question, asked eight times"), headers=auth()
                )
                for _ in range(8)
            )
        )
    assert [response.status_code for response in responses] == [200] * 8
    texts = {response.json()["choices"][0]["message"]["content"] for response in responses}
    assert texts == {"echo: one question, asked eight times"}
    assert len(slow_backend.calls) == 1


async def test_disconnect_mid_stream_aborts_the_generation(
    base_url: str, slow_backend: ScriptedBackend
) -> None:
    body = chat("a long answer " * 20, stream=True)
    async with (
        httpx.AsyncClient(base_url=base_url, timeout=30) as client,
        client.stream("POST", "/v1/chat/completions", json=body, headers=auth()) as response,
    ):
        async for line in response.aiter_lines():
            if '"content":"echo:' in line:
                break  # leave after the first token
    deadline = time.monotonic() + 5
    while not slow_backend.aborted and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    assert slow_backend.aborted == [slow_backend.calls[0].request_id]
    assert not slow_backend.active  # the backend's generator was closed, not left running
    async with httpx.AsyncClient(base_url=base_url, timeout=30) as client:
        again = await client.post("/v1/chat/completions", json=chat("a long answer " * 20), headers=auth())
    assert again.headers["x-kvgate-cache"] == "miss"  # an aborted stream is never stored


async def test_overload_is_429_with_retry_after(base_url: str) -> None:
    async with httpx.AsyncClient(base_url=base_url, timeout=30) as client:
        responses = await asyncio.gather(
            *(
                client.post("/v1/chat/completions", json=chat(f"distinct question {index}"), headers=auth())
                for index in range(6)
            )
        )
    statuses = sorted(response.status_code for response in responses)
    assert statuses.count(200) >= 2 and 429 in statuses
    refused = next(response for response in responses if response.status_code == 429)
    assert refused.headers["retry-after"] == "1"
    assert refused.json()["error"]["type"] == "rate_limit_error"
