"""What a new user meets with the default settings, through the official openai client, a real server, the
real SmolLM2 engine and the embedded store: a repeat of a `max_tokens`-limited request is an exact hit that
replays `finish_reason: "length"`, and the metrics and the hit-rate report count it. An aborted stream is
still never stored."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest

from gateway.http.app import create_app
from gateway.runtime.settings import Settings
from tests.gateway.live_server import serve
from tests.integration.streams import leave_after_first_token

pytestmark = pytest.mark.slow

MODEL = "smollm2-135m-instruct"
ADMIN_TOKEN = "day-one-admin"


@pytest.fixture(scope="module")
def base_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    # Only what a user must set: where files go, a smaller KV pool for the test machine, an admin token.
    settings = Settings(
        data_dir=tmp_path_factory.mktemp("day-one"), kv_cache_tokens=4096, admin_token=ADMIN_TOKEN
    )
    with serve(create_app(settings)) as url:
        yield url


def ask(client: openai.OpenAI, question: str, **fields: Any) -> tuple[str, Any]:
    raw = client.chat.completions.with_raw_response.create(
        model=MODEL, messages=[{"role": "user", "content": question}], max_tokens=6, **fields
    )
    return raw.headers["x-kvgate-cache"], raw.parse()


def test_a_repeat_of_a_length_limited_request_is_an_exact_hit(client: openai.OpenAI, base_url: str) -> None:
    question = "Explain in detail how a rainbow forms."
    cache, cold = ask(client, question)
    assert cache == "miss" and cold.choices[0].finish_reason == "length"
    cache, again = ask(client, question)
    assert cache == "exact-hit"
    assert again.choices[0].finish_reason == "length"
    assert again.choices[0].message.content == cold.choices[0].message.content
    assert again.usage.completion_tokens == cold.usage.completion_tokens == 6

    streamed = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": question}], max_tokens=6, stream=True
    )
    chunks = list(streamed)
    text = "".join(chunk.choices[0].delta.content or "" for chunk in chunks if chunk.choices)
    assert text == cold.choices[0].message.content
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"

    metrics = httpx.get(base_url + "/metrics").text
    assert any(
        line.startswith("kvgate_requests_total{")
        and 'cache="exact_hit"' in line
        and not line.endswith(" 0.0")
        for line in metrics.splitlines()
    ), "no exact_hit series after the same request twice"
    stats = httpx.get(base_url + "/admin/stats", headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}).json()
    assert stats["since_start"]["overall"]["exact_hit"] >= 2
    assert stats["since_start"]["overall"]["tokens_saved"] > 0


def test_an_aborted_stream_is_not_stored(base_url: str) -> None:
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "Write a long story about a lighthouse keeper."}],
        "max_tokens": 200,
    }
    leave_after_first_token(base_url, body)  # aborted, not finished by length: nothing to store
    again = httpx.post(base_url + "/v1/chat/completions", json=body, timeout=120)
    assert again.status_code == 200 and again.headers["x-kvgate-cache"] == "miss"
