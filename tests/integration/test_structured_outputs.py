"""Structured outputs and tool calls in engine mode, end to end: the official openai SDK against kvgate
(default settings) serving the real SmolLM2 engine. Every answer parses and validates against its schema
unless max_tokens cuts it, JSON and streamed."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any, Literal

import jsonschema
import openai
import pytest
from fastapi import FastAPI
from openai.lib.streaming.chat import ChatCompletionStreamState
from openai.types.chat import ChatCompletion, ChatCompletionChunk
from pydantic import BaseModel

from gateway.http.app import create_app
from gateway.runtime.settings import Settings
from tests.gateway.live_server import serve

pytestmark = pytest.mark.slow

MODEL = "smollm2-135m-instruct"
CITY_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 40},
        "population_millions": {"type": "integer", "minimum": 0},
        "continent": {"type": "string", "enum": ["Europe", "Asia", "Africa", "Americas", "Oceania"]},
    },
    "required": ["city", "population_millions", "continent"],
    "additionalProperties": False,
}
CITY_FORMAT: Any = {
    "type": "json_schema",
    "json_schema": {"name": "city", "schema": CITY_SCHEMA, "strict": True},
}
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The current weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string"},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
            },
            "required": ["city", "unit"],
            "additionalProperties": False,
        },
    },
}
TIME = {
    "type": "function",
    "function": {
        "name": "get_time",
        "description": "The local time in a timezone.",
        "parameters": {
            "type": "object",
            "properties": {"timezone": {"type": "string"}},
            "required": ["timezone"],
            "additionalProperties": False,
        },
    },
}
TOOLS = [WEATHER, TIME]
SCHEMAS = {tool["function"]["name"]: tool["function"]["parameters"] for tool in TOOLS}


class Capital(BaseModel):
    country: str
    capital: str
    continent: Literal["Europe", "Asia", "Africa", "Americas", "Oceania"]


@pytest.fixture(scope="module")
def app(tmp_path_factory: pytest.TempPathFactory) -> FastAPI:
    return create_app(Settings(data_dir=tmp_path_factory.mktemp("structured"), kv_cache_tokens=4096))


@pytest.fixture(scope="module")
def base_url(app: FastAPI) -> Iterator[str]:
    with serve(app) as url:
        yield url


def user(text: str) -> list[dict[str, Any]]:
    return [{"role": "user", "content": text}]


@pytest.mark.parametrize(
    "question",
    [
        "What is the capital of France?",
        "Tell me about Japan's capital.",
        "Which city is the capital of Kenya?",
    ],
)
def test_parse_with_a_pydantic_model_gives_a_valid_object(client: openai.OpenAI, question: str) -> None:
    completion = client.chat.completions.parse(
        model=MODEL, messages=user(question), response_format=Capital, temperature=0, max_tokens=80
    )
    choice = completion.choices[0]
    assert choice.finish_reason == "stop"
    assert isinstance(choice.message.parsed, Capital)
    assert choice.message.parsed.country and choice.message.parsed.capital


def test_json_object_answers_parse(client: openai.OpenAI) -> None:
    # A 135M model can ramble inside an open object until max_tokens; these two it closes (greedy).
    for question in [
        "Return a JSON object with your name and age.",
        "Give me a JSON object about the weather.",
    ]:
        completion = client.chat.completions.create(
            model=MODEL,
            messages=user(question),
            response_format={"type": "json_object"},
            temperature=0,
            max_tokens=120,
        )
        assert completion.choices[0].finish_reason == "stop"
        assert isinstance(json.loads(completion.choices[0].message.content or ""), dict)


def test_strict_json_schema_answers_validate(client: openai.OpenAI) -> None:
    completion = client.chat.completions.create(
        model=MODEL,
        messages=user("Name a big city, its population in millions and its continent."),
        response_format=CITY_FORMAT,
        temperature=0,
        max_tokens=80,
    )
    assert completion.choices[0].finish_reason == "stop"
    jsonschema.validate(json.loads(completion.choices[0].message.content or ""), CITY_SCHEMA)


def test_a_streamed_json_schema_answer_joins_to_valid_json(client: openai.OpenAI) -> None:
    stream = client.chat.completions.create(
        model=MODEL,
        messages=user("A city in Asia, as JSON."),
        response_format=CITY_FORMAT,
        temperature=0.8,
        seed=7,
        max_tokens=80,
        stream=True,
    )
    chunks = list(stream)
    text = "".join(chunk.choices[0].delta.content or "" for chunk in chunks if chunk.choices)
    assert len(chunks) > 3 and chunks[-1].choices[0].finish_reason == "stop"
    jsonschema.validate(json.loads(text), CITY_SCHEMA)


def test_max_tokens_cuts_a_structured_answer_with_length(client: openai.OpenAI) -> None:
    completion = client.chat.completions.create(
        model=MODEL,
        messages=user("Name a big city."),
        response_format=CITY_FORMAT,
        temperature=0,
        max_tokens=4,
    )
    assert completion.choices[0].finish_reason == "length"
    assert completion.usage is not None and completion.usage.completion_tokens == 4


@pytest.mark.parametrize("question", ["What's the weather in Paris?", "What time is it in Tokyo?"])
def test_tool_choice_required_returns_a_valid_tool_call(client: openai.OpenAI, question: str) -> None:
    completion = client.chat.completions.create(
        model=MODEL,
        messages=user(question),
        tools=TOOLS,
        tool_choice="required",
        temperature=0,
        max_tokens=60,
    )
    choice = completion.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    (call,) = choice.message.tool_calls or []
    assert call.type == "function" and call.id.startswith("call_")
    jsonschema.validate(json.loads(call.function.arguments), SCHEMAS[call.function.name])


def test_a_streamed_tool_call_folds_with_the_sdk_helper(base_url: str, client: openai.OpenAI) -> None:
    raw = client.chat.completions.with_raw_response.create(
        model=MODEL,
        messages=user("Weather in Berlin, in celsius please."),
        tools=TOOLS,
        tool_choice="required",
        temperature=0.5,
        seed=3,
        max_tokens=60,
        stream=True,
        stream_options={"include_usage": True},
    )
    state = ChatCompletionStreamState()
    chunks = list(raw.parse())
    for chunk in chunks:
        ChatCompletionChunk.model_validate(chunk.model_dump())
        state.handle_chunk(chunk)
    assert (
        sum(1 for chunk in chunks if chunk.choices and chunk.choices[0].delta.tool_calls) > 2
    )  # arguments in pieces
    final = state.get_final_completion()
    choice = final.choices[0]
    assert choice.finish_reason == "tool_calls" and final.usage is not None
    (call,) = choice.message.tool_calls or []
    jsonschema.validate(json.loads(call.function.arguments), SCHEMAS[call.function.name])


def test_a_named_tool_choice_calls_that_tool(client: openai.OpenAI) -> None:
    for name in ("get_time", "get_weather"):
        completion = client.chat.completions.create(
            model=MODEL,
            messages=user("What's the weather in Paris?"),
            tools=TOOLS,
            tool_choice={"type": "function", "function": {"name": name}},
            temperature=0,
            max_tokens=60,
        )
        ChatCompletion.model_validate(completion.model_dump())
        (call,) = completion.choices[0].message.tool_calls or []
        assert call.function.name == name
        jsonschema.validate(json.loads(call.function.arguments), SCHEMAS[name])


def test_an_agent_loop_continues_after_a_tool_result(client: openai.OpenAI) -> None:
    first = client.chat.completions.create(
        model=MODEL,
        messages=user("What's the weather in Rome?"),
        tools=TOOLS,
        tool_choice="required",
        temperature=0,
        max_tokens=60,
    )
    call = (first.choices[0].message.tool_calls or [])[0]
    history = [
        *user("What's the weather in Rome?"),
        first.choices[0].message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "content": '{"temperature": 21, "sky": "sunny"}'},
    ]
    answer = client.chat.completions.create(
        model=MODEL, messages=history, tools=TOOLS, temperature=0, max_tokens=30
    )
    assert answer.choices[0].finish_reason in ("stop", "length")
    assert answer.choices[0].message.content and not answer.choices[0].message.tool_calls


def test_a_schema_the_engine_cannot_use_is_a_400(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as raised:
        client.chat.completions.create(
            model=MODEL,
            messages=user("hi"),
            response_format={
                "type": "json_schema",
                "json_schema": {"name": "x", "schema": {"type": "no-such-type"}},
            },
            max_tokens=10,
        )
    assert raised.value.body["param"] == "response_format"  # type: ignore[index]
