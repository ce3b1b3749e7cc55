"""Issue 35's sampling features through kvgate in engine mode (default settings), with the official openai
SDK against a real server and the real SmolLM2 engine: logprobs (chat and legacy, JSON and stream), n > 1
forked from one prefill, penalties and logit bias changing a greedy answer, a seed giving the same text alone
and beside other requests. Every object is validated against the SDK's own pydantic types."""

from __future__ import annotations

import concurrent.futures
import re
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest
from fastapi import FastAPI
from openai.types import Completion
from openai.types.chat import ChatCompletion, ChatCompletionChunk

from gateway.http.app import create_app
from gateway.runtime.settings import Settings
from tests.gateway.live_server import serve

pytestmark = pytest.mark.slow

MODEL = "smollm2-135m-instruct"
FRESH = {"Cache-Control": "no-cache, no-store"}  # every call reaches the engine


@pytest.fixture(scope="module")
def app(tmp_path_factory: pytest.TempPathFactory) -> FastAPI:
    return create_app(Settings(data_dir=tmp_path_factory.mktemp("sampling")))


@pytest.fixture(scope="module")
def base_url(app: FastAPI) -> Iterator[str]:
    with serve(app) as url:
        yield url


def chat(client: openai.OpenAI, question: str, **fields: Any) -> ChatCompletion:
    raw = client.chat.completions.with_raw_response.create(
        model=MODEL,
        messages=[{"role": "user", "content": question}],
        max_tokens=fields.pop("max_tokens", 16),
        extra_headers=FRESH,
        **fields,
    )
    return ChatCompletion.model_validate(raw.http_response.json())


def stream_chat(client: openai.OpenAI, question: str, **fields: Any) -> list[ChatCompletionChunk]:
    stream = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": question}],
        stream=True,
        extra_headers=FRESH,
        **fields,
    )
    return [ChatCompletionChunk.model_validate(chunk.model_dump()) for chunk in stream]


def engine_counter(base_url: str, name: str) -> float:
    text = httpx.get(base_url + "/metrics").text
    match = re.search(rf"^kvgate_engine_{name}_total (\S+)$", text, re.MULTILINE)
    assert match, name
    return float(match.group(1))


def test_chat_logprobs_at_temperature_0_choose_the_top_token_and_spell_the_text(
    client: openai.OpenAI,
) -> None:
    answer = chat(client, "Name three colours.", temperature=0, logprobs=True, top_logprobs=3)
    choice = answer.choices[0]
    assert choice.logprobs is not None and choice.logprobs.content
    entries = choice.logprobs.content
    assert "".join(entry.token for entry in entries) == choice.message.content
    for entry in entries:
        assert len(entry.top_logprobs) == 3
        assert (entry.top_logprobs[0].token, entry.top_logprobs[0].logprob) == (entry.token, entry.logprob)
        assert entry.bytes == list(entry.token.encode())
    # The stream carries the same tokens, chunk by chunk.
    chunks = stream_chat(
        client, "Name three colours.", max_tokens=16, temperature=0, logprobs=True, top_logprobs=3
    )
    streamed = [
        entry.token
        for chunk in chunks
        for choice in chunk.choices
        if choice.logprobs is not None
        for entry in choice.logprobs.content or []
    ]
    text = "".join(choice.delta.content or "" for chunk in chunks for choice in chunk.choices)
    assert "".join(streamed) == text == answer.choices[0].message.content


def test_top_logprobs_above_openais_bound_is_a_400(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as refused:
        chat(client, "Hi", logprobs=True, top_logprobs=21)
    assert refused.value.param == "top_logprobs"  # type: ignore[attr-defined]


def test_legacy_completion_logprobs_json_and_stream(client: openai.OpenAI) -> None:
    asked: dict[str, Any] = {"model": MODEL, "prompt": "The capital of France is", "max_tokens": 8}
    asked |= {"temperature": 0, "logprobs": 2, "extra_headers": FRESH}
    raw = client.completions.with_raw_response.create(**asked)
    completion = Completion.model_validate(raw.http_response.json())
    logprobs = completion.choices[0].logprobs
    assert logprobs is not None and logprobs.tokens and logprobs.token_logprobs and logprobs.top_logprobs
    assert "".join(logprobs.tokens) == completion.choices[0].text
    assert logprobs.text_offset == [sum(map(len, logprobs.tokens[:i])) for i in range(len(logprobs.tokens))]
    for token, value, top in zip(
        logprobs.tokens, logprobs.token_logprobs, logprobs.top_logprobs, strict=True
    ):
        assert len(top) == 2 and max(top.values()) == value and top[token] == value
    stream = client.completions.create(**asked, stream=True)
    tokens = [
        token
        for chunk in stream
        for choice in chunk.choices
        if choice.logprobs is not None
        for token in choice.logprobs.tokens or []
    ]
    assert tokens == logprobs.tokens


def test_three_choices_prefill_the_prompt_once(client: openai.OpenAI, base_url: str) -> None:
    before = engine_counter(base_url, "prompt_tokens")
    queried = engine_counter(base_url, "prefix_cache_queries")
    answer = chat(client, "Write a word.", n=3, temperature=1.0, seed=5, max_tokens=12, logprobs=True)
    assert [choice.index for choice in answer.choices] == [0, 1, 2]
    assert answer.usage is not None
    assert engine_counter(base_url, "prompt_tokens") - before == answer.usage.prompt_tokens
    assert engine_counter(base_url, "prefix_cache_queries") - queried == answer.usage.prompt_tokens
    # Each choice's tokens, plus its stop token when it stopped on one, add up to the completion tokens.
    per_choice = [
        len(choice.logprobs.content or []) + (choice.finish_reason == "stop")
        for choice in answer.choices
        if choice.logprobs is not None
    ]
    assert answer.usage.completion_tokens == sum(per_choice)
    assert len({choice.message.content for choice in answer.choices}) > 1  # seed + index: distinct streams
    # Streamed: chunks carry their choice's index and fold into three answers.
    texts: dict[int, str] = {}
    for chunk in stream_chat(client, "Write a word.", n=3, temperature=1.0, seed=5, max_tokens=12):
        for choice in chunk.choices:
            texts[choice.index] = texts.get(choice.index, "") + (choice.delta.content or "")
    assert texts == {choice.index: choice.message.content for choice in answer.choices}


def test_more_than_sixteen_choices_is_a_400(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError):
        chat(client, "Hi", n=17)


def test_penalties_change_a_greedy_answer(client: openai.OpenAI) -> None:
    question = "List the numbers from 1 to 20, separated by commas."
    plain = chat(client, question, temperature=0, max_tokens=32).choices[0].message.content
    assert plain is not None and plain.count(",") > 3  # the greedy answer repeats its commas
    penalised = chat(client, question, temperature=0, max_tokens=32, frequency_penalty=2.0)
    assert penalised.choices[0].message.content != plain
    both = chat(client, question, temperature=0, max_tokens=32, frequency_penalty=1.0, presence_penalty=2.0)
    assert both.choices[0].message.content != plain


def test_logit_bias_minus_100_on_the_greedy_first_token_changes_it(
    client: openai.OpenAI, app: FastAPI
) -> None:
    greedy = chat(client, "What is the capital of France?", temperature=0, logprobs=True)
    first = greedy.choices[0].logprobs.content[0].token  # type: ignore[union-attr,index]
    [token_id] = app.state.service.backend.client.tokenizer.encode(first, add_special_tokens=False)
    banned = chat(
        client,
        "What is the capital of France?",
        temperature=0,
        logprobs=True,
        logit_bias={str(token_id): -100},
    )
    assert banned.choices[0].logprobs.content[0].token != first  # type: ignore[union-attr,index]


def test_a_seed_gives_the_same_text_alone_and_beside_other_requests(client: openai.OpenAI) -> None:
    seeded = {"temperature": 1.0, "seed": 1234, "max_tokens": 20}
    alone = chat(client, "Tell me about cats.", **seeded).choices[0].message.content
    others: list[tuple[str, dict[str, Any]]] = [
        ("Tell me about dogs.", {"temperature": 0.8, "max_tokens": 20}),
        ("Tell me about birds.", {"temperature": 0, "max_tokens": 20, "frequency_penalty": 1.0}),
        ("Tell me about fish.", {"temperature": 1.0, "n": 2, "max_tokens": 20}),
        ("Tell me about cats.", seeded),
    ]
    with concurrent.futures.ThreadPoolExecutor(len(others)) as pool:
        answers = list(pool.map(lambda item: chat(client, item[0], **dict(item[1])), others))
    assert answers[-1].choices[0].message.content == alone
