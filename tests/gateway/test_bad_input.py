"""Bad input gets a 4xx in OpenAI's error shape, never a 500."""

from __future__ import annotations

from typing import Any

import pytest
from fastapi.testclient import TestClient

from tests.gateway.conftest import auth, chat
from tests.gateway.fakes import MODEL

ROUTE = "/v1/chat/completions"


def assert_openai_error(response: Any, status: int) -> dict[str, Any]:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["message"]
    return dict(error)


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"model": MODEL, "messages": []}, "messages"),
        ({"model": MODEL}, "messages"),
        ({"model": MODEL, "messages": "hello"}, "messages"),
        ({"model": MODEL, "messages": [{"role": "wizard", "content": "hi"}]}, "messages.0.role"),
        (chat("hi", max_tokens=-5), "max_tokens"),
        (chat("hi", max_tokens="many"), "max_tokens"),
        (chat("hi", temperature=9), "temperature"),
        (chat("hi", n=17), "n"),
        (chat("hi", n=0), "n"),
        (chat("hi", logprobs=True, top_logprobs=21), "top_logprobs"),
        (chat("hi", top_logprobs=2), "top_logprobs"),
        (chat("hi", logit_bias={"hello": 5}), "logit_bias"),
        (chat("hi", logit_bias={"42": 101}), "logit_bias"),
        (chat("hi", presence_penalty=2.5), "presence_penalty"),
        (chat("hi", tools=[{"type": "function", "function": {"description": "no name"}}]), "tools.0"),
        (
            chat("hi", tools=[{"type": "function", "function": {"name": "f"}}], tool_choice="any"),
            "tool_choice",
        ),
        (
            chat(
                "hi",
                tools=[{"type": "function", "function": {"name": "f"}}],
                tool_choice={"type": "function", "function": {"name": "g"}},
            ),
            "tool_choice",
        ),
        (chat("hi", tool_choice="required"), "tool_choice"),
        (chat("hi", response_format={"type": "xml"}), "response_format"),
        (
            chat("hi", response_format={"type": "json_schema", "json_schema": {"schema": "x"}}),
            "response_format",
        ),
        (
            chat(
                "hi",
                tools=[{"type": "function", "function": {"name": "f"}}],
                tool_choice="required",
                logprobs=True,
            ),
            "logprobs",
        ),
        (chat("hi", stop=["a", "b", "c", "d", "e"]), "stop"),
        ({"model": MODEL, "messages": [{"role": "user", "content": "   "}]}, "messages"),
        (
            {"model": MODEL, "messages": [{"role": "user", "content": [{"type": "image_url"}]}]},
            "messages.0.content",
        ),
    ],
)
def test_invalid_chat_requests_are_400(client: TestClient, body: dict[str, Any], param: str) -> None:
    error = assert_openai_error(client.post(ROUTE, json=body, headers=auth()), 400)
    assert error["type"] == "invalid_request_error"
    assert error["param"] == param


def test_malformed_json_is_400(client: TestClient) -> None:
    response = client.post(
        ROUTE, content=b'{"model": "x", "messages": [', headers=auth() | {"content-type": "application/json"}
    )
    assert assert_openai_error(response, 400)["code"] == "invalid_json"


def test_invalid_utf8_is_400(client: TestClient) -> None:
    body = b'{"model": "fake-model", "messages": [{"role": "user", "content": "\xff\xfe"}]}'
    response = client.post(ROUTE, content=body, headers=auth() | {"content-type": "application/json"})
    assert_openai_error(response, 400)


def test_ten_megabyte_body_is_413(client: TestClient) -> None:
    response = client.post(ROUTE, json=chat("x" * 10_000_000), headers=auth())
    assert assert_openai_error(response, 413)["code"] == "request_too_large"


def test_unknown_model_is_404(client: TestClient) -> None:
    response = client.post(ROUTE, json=chat("hi") | {"model": "gpt-9"}, headers=auth())
    error = assert_openai_error(response, 404)
    assert (error["param"], error["code"]) == ("model", "model_not_found")


def test_prompt_longer_than_the_context_is_400(client: TestClient) -> None:
    response = client.post(ROUTE, json=chat("word " * 600), headers=auth())
    assert assert_openai_error(response, 400)["code"] == "context_length_exceeded"
    streamed = client.post(ROUTE, json=chat("word " * 600, stream=True), headers=auth())
    assert assert_openai_error(streamed, 400)["code"] == "context_length_exceeded"


def test_unknown_route_and_method_keep_the_shape(client: TestClient) -> None:
    assert_openai_error(client.get("/v1/nothing-here", headers=auth()), 404)
    assert_openai_error(client.get(ROUTE, headers=auth()), 405)


def test_unknown_fields_are_accepted_and_ignored(client: TestClient) -> None:
    response = client.post(ROUTE, json=chat("hi", some_future_field={"x": 1}), headers=auth())
    assert response.status_code == 200


def test_bad_completions_prompt(client: TestClient) -> None:
    for body in (
        {"model": MODEL, "prompt": ""},
        {"model": MODEL, "prompt": ["a", "b"]},
        {"model": MODEL, "prompt": "hi", "echo": True},
    ):
        assert_openai_error(client.post("/v1/completions", json=body, headers=auth()), 400)


@pytest.mark.parametrize("route", [ROUTE, "/v1/completions"])
def test_a_bad_key_is_refused_before_the_body_is_read(client: TestClient, route: str) -> None:
    for headers in ({}, auth("key-nobody")):
        response = client.post(
            route, content=b"{not json", headers=headers | {"content-type": "application/json"}
        )
        assert assert_openai_error(response, 401)["type"] == "authentication_error"


@pytest.mark.parametrize("content", [b"", b"  \n", b"[]", b'"hi"', b"null"])
def test_an_empty_or_non_object_body_is_400(client: TestClient, content: bytes) -> None:
    response = client.post(ROUTE, content=content, headers=auth() | {"content-type": "application/json"})
    assert assert_openai_error(response, 400)["type"] == "invalid_request_error"


def test_the_completion_routes_keep_their_request_schemas_in_openapi(client: TestClient) -> None:
    paths = client.get("/openapi.json").json()["paths"]
    for path, model in (
        ("/v1/chat/completions", "ChatCompletionRequest"),
        ("/v1/completions", "CompletionRequest"),
    ):
        body = paths[path]["post"]["requestBody"]["content"]["application/json"]["schema"]
        assert body["$ref"].endswith(f"/{model}")
