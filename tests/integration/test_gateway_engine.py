"""kvgate end to end: the official openai client, a real uvicorn server, the real SmolLM2 engine,
the real MiniLM embedder and a real (embedded) Redis-protocol store."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import openai
import pytest
from fastapi import FastAPI

from gateway.http.app import create_app
from gateway.runtime.settings import Settings
from tests.gateway.live_server import serve
from tests.integration.streams import leave_after_first_token

pytestmark = pytest.mark.slow

MODEL = "smollm2-135m-instruct"
SYSTEM = "You are a concise assistant. Answer in one short sentence."


@pytest.fixture(scope="module")
def app(tmp_path_factory: pytest.TempPathFactory) -> FastAPI:
    settings = Settings(data_dir=tmp_path_factory.mktemp("e2e"), kv_cache_tokens=4096, default_max_tokens=32)
    return create_app(settings)


@pytest.fixture(scope="module")
def base_url(app: FastAPI) -> Iterator[str]:
    with serve(app) as url:
        yield url


def ask(client: openai.OpenAI, question: str, **fields: Any) -> tuple[str, Any]:
    raw = client.chat.completions.with_raw_response.create(
        model=MODEL,
        messages=[{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}],
        temperature=0,
        max_tokens=24,
        **fields,
    )
    return raw.headers["x-kvgate-cache"], raw.parse()


def test_layers_answer_in_order(client: openai.OpenAI) -> None:
    cache, cold = ask(client, "What is the capital of France?")
    assert cache == "miss" and "Paris" in (cold.choices[0].message.content or "")
    cache, again = ask(client, "What is the capital of France?")
    assert cache == "exact-hit" and again.choices[0].message.content == cold.choices[0].message.content
    cache, paraphrase = ask(client, "Tell me the capital of France.")
    assert (
        cache == "semantic-hit" and paraphrase.choices[0].message.content == cold.choices[0].message.content
    )
    assert ask(client, "What is 12 + 30?")[0] == "miss"
    assert ask(client, "What is 12 + 31?")[0] == "miss"


def test_healthz_says_how_the_engine_stores_its_weights(base_url: str) -> None:
    import httpx

    weights = httpx.get(base_url + "/healthz").json()["generator"]["weights"]
    # The default is `auto`: the default GGUF's 4-bit codes stay int4 where decode steps run natively;
    # elsewhere every format this CPU runs was timed. Either way the choice says why and what decodes.
    assert weights["requested"] == "auto" and weights["weights"] in ("fp32", "bf16", "int8", "int4")
    if weights["decode"].startswith("native"):
        assert weights["weights"] == "int4" and "natively" in weights["reason"]
    else:
        assert weights["decode"] == "torch"
        assert {"fp32", weights["weights"]} <= set(weights["batch1_us"]) and weights["reason"]
    assert weights["cpu_capability"]


def test_a_miss_reuses_the_engine_prefix_cache(client: openai.OpenAI) -> None:
    _, first = ask(client, "Name a primary colour.")
    _, second = ask(client, "Name a large ocean.")
    assert first.usage.prompt_tokens_details.cached_tokens == 0 or first.usage.prompt_tokens > 16
    assert second.usage.prompt_tokens_details.cached_tokens >= 16  # the system prompt's full blocks


def test_streaming_from_the_engine(client: openai.OpenAI) -> None:
    stream = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Count from one to five."}],
        temperature=0,
        max_tokens=20,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    text = "".join(chunk.choices[0].delta.content or "" for chunk in chunks if chunk.choices)
    assert text and chunks[-1].usage is not None and chunks[-1].usage.completion_tokens > 0


def test_client_disconnect_aborts_and_frees_blocks(app: FastAPI, base_url: str) -> None:
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "Write a long story about a dragon."}],
        "max_tokens": 400,
    }
    leave_after_first_token(base_url, body)
    client = app.state.backend.client
    scheduler = client.engine.scheduler
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and scheduler.block_manager.stats().num_blocks_in_use:
        time.sleep(0.05)
    assert scheduler.block_manager.stats().num_blocks_in_use == 0
    assert (len(scheduler.running), len(scheduler.waiting)) == (0, 0)
    assert client.metrics.finished.get("abort", 0) >= 1
