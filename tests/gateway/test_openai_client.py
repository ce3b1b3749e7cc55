"""The official openai client, unchanged, against a running kvgate (scripted backend)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import openai
import pytest

from gateway.http.app import create_app
from tests.gateway.conftest import make_settings
from tests.gateway.fakes import MODEL, ScriptedBackend
from tests.gateway.live_server import serve


@pytest.fixture(scope="module")
def base_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    data_dir: Path = tmp_path_factory.mktemp("openai-client")
    app = create_app(
        make_settings(data_dir), backend_factory=lambda settings: ScriptedBackend(context_tokens=64)
    )
    with serve(app) as url:
        yield url + "/v1"


@pytest.fixture
def client(base_url: str) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=base_url, api_key="key-alpha", max_retries=0) as sdk:
        yield sdk


def ask(client: openai.OpenAI, content: str) -> tuple[str, str]:
    raw = client.chat.completions.with_raw_response.create(
        model=MODEL, messages=[{"role": "user", "content": content}]
    )
    completion = raw.parse()
    return raw.headers["x-kvgate-cache"], completion.choices[0].message.content or ""


def test_chat_exact_semantic_and_number_miss(client: openai.OpenAI) -> None:
    assert ask(client, "How many moons does Mars have?") == ("miss", "echo: How many moons does Mars have?")
    assert ask(client, "How many moons does Mars have?") == (
        "exact-hit",
        "echo: How many moons does Mars have?",
    )
    cache, text = ask(client, "How many moons does the planet Mars have?")
    assert (cache, text) == ("semantic-hit", "echo: How many moons does Mars have?")
    assert ask(client, "What is 2+2?")[0] == "miss"
    assert ask(client, "What is 2+3?") == ("miss", "echo: What is 2+3?")


def test_chat_streaming(client: openai.OpenAI) -> None:
    stream = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Stream this please"}],
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    text = "".join(chunk.choices[0].delta.content or "" for chunk in chunks if chunk.choices)
    assert text == "echo: Stream this please"
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 4


def test_completions_plain_and_streaming(client: openai.OpenAI) -> None:
    whole = client.completions.create(model=MODEL, prompt="Complete me")
    assert whole.choices[0].text == "echo: Complete me"
    streamed = "".join(
        chunk.choices[0].text
        for chunk in client.completions.create(model=MODEL, prompt="Complete me", stream=True)
    )
    assert streamed == "echo: Complete me"


def test_models_list(client: openai.OpenAI) -> None:
    assert [model.id for model in client.models.list()] == [MODEL]


def test_errors_raise_the_sdk_exception_classes(base_url: str, client: openai.OpenAI) -> None:
    with (
        openai.OpenAI(base_url=base_url, api_key="wrong", max_retries=0) as stranger,
        pytest.raises(openai.AuthenticationError),
    ):
        stranger.models.list()
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="no-such-model", messages=[{"role": "user", "content": "hi"}])
    with pytest.raises(openai.BadRequestError) as bad:
        client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}], n=17)
    assert bad.value.param == "n"
    with pytest.raises(openai.BadRequestError) as too_long:
        client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "word " * 100}])
    assert too_long.value.code == "context_length_exceeded"
