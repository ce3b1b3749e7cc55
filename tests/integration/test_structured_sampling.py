"""Structured outputs together with the sampling features, end to end: the official openai SDK against
kvgate (default settings) serving the real SmolLM2 engine. Every forked choice follows the grammar on its own;
logprobs come with a constrained answer and spell its text."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import jsonschema
import openai
import pytest
from fastapi import FastAPI

from gateway.http.app import create_app
from gateway.runtime.settings import Settings
from tests.gateway.live_server import serve

pytestmark = pytest.mark.slow

MODEL = "smollm2-135m-instruct"
FRESH = {"Cache-Control": "no-cache, no-store"}  # every call reaches the engine
# Bounded strings and an enum: a sampled answer cannot ramble past max_tokens.
CAPITAL_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "country": {"type": "string", "maxLength": 30},
        "capital": {"type": "string", "maxLength": 30},
        "continent": {"type": "string", "enum": ["Europe", "Asia", "Africa", "Americas", "Oceania"]},
    },
    "required": ["country", "capital", "continent"],
    "additionalProperties": False,
}
CAPITAL_FORMAT: Any = {"type": "json_schema", "json_schema": {"name": "capital", "schema": CAPITAL_SCHEMA}}
QUESTION = [{"role": "user", "content": "What is the capital of Italy? Answer in JSON."}]


@pytest.fixture(scope="module")
def app(tmp_path_factory: pytest.TempPathFactory) -> FastAPI:
    return create_app(Settings(data_dir=tmp_path_factory.mktemp("structured-sampling")))


@pytest.fixture(scope="module")
def base_url(app: FastAPI) -> Iterator[str]:
    with serve(app) as url:
        yield url


def test_json_schema_with_two_sampled_choices_gives_two_valid_answers(client: openai.OpenAI) -> None:
    completion = client.chat.completions.create(
        model=MODEL,
        messages=QUESTION,  # type: ignore[arg-type]
        response_format=CAPITAL_FORMAT,
        n=2,
        temperature=1.0,
        seed=7,
        max_tokens=120,
        extra_headers=FRESH,
    )
    assert [choice.index for choice in completion.choices] == [0, 1]
    for choice in completion.choices:
        assert choice.finish_reason == "stop"
        jsonschema.validate(json.loads(choice.message.content or ""), CAPITAL_SCHEMA)
    assert completion.usage is not None and completion.usage.completion_tokens > 0


def test_json_schema_with_logprobs_spells_the_valid_answer(client: openai.OpenAI) -> None:
    completion = client.chat.completions.create(
        model=MODEL,
        messages=QUESTION,  # type: ignore[arg-type]
        response_format=CAPITAL_FORMAT,
        logprobs=True,
        top_logprobs=2,
        temperature=0,
        max_tokens=120,
        extra_headers=FRESH,
    )
    choice = completion.choices[0]
    content = choice.message.content or ""
    jsonschema.validate(json.loads(content), CAPITAL_SCHEMA)
    assert choice.logprobs is not None and choice.logprobs.content
    entries = choice.logprobs.content
    assert "".join(entry.token for entry in entries) == content
    # Read from the raw logits (before the grammar's mask): real log-probabilities, two alternatives each.
    assert all(entry.logprob <= 0 and len(entry.top_logprobs) == 2 for entry in entries)


def test_a_forced_tool_call_with_two_choices_calls_once_per_choice(client: openai.OpenAI) -> None:
    tool: Any = {
        "type": "function",
        "function": {
            "name": "get_capital",
            "parameters": {
                "type": "object",
                "properties": {"country": {"type": "string", "maxLength": 30}},
                "required": ["country"],
                "additionalProperties": False,
            },
        },
    }
    completion = client.chat.completions.create(
        model=MODEL,
        messages=QUESTION,  # type: ignore[arg-type]
        tools=[tool],
        tool_choice="required",
        n=2,
        temperature=1.0,
        seed=3,
        max_tokens=80,
        extra_headers=FRESH,
    )
    assert len(completion.choices) == 2
    for choice in completion.choices:
        assert choice.finish_reason == "tool_calls" and choice.message.content is None
        (call,) = choice.message.tool_calls or []
        assert call.function.name == "get_capital"  # type: ignore[union-attr]
        arguments = json.loads(call.function.arguments)  # type: ignore[union-attr]
        jsonschema.validate(arguments, tool["function"]["parameters"])
