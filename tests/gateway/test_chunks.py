"""Whole objects <-> stream chunks: a replayed stream folds back into the stored object, in our fold and in
the official SDK's stream helper, and both validate against the SDK's own types."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from openai.lib.streaming.chat._completions import ChatCompletionStreamState
from openai.types import Completion
from openai.types.chat import ChatCompletion, ChatCompletionChunk

from gateway.api.choice_chunks import ChoiceChunks
from gateway.api.chunks import (
    accumulate_chat,
    accumulate_text,
    chat_chunks,
    plain_text,
    refused,
    text_chunks,
)


def logprob(token: str, value: float) -> dict[str, Any]:
    return {"token": token, "logprob": value, "bytes": list(token.encode()), "top_logprobs": []}


def chat(*choices: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {
        "id": "chatcmpl-abc",
        "object": "chat.completion",
        "created": 1_700_000_000,
        "model": "gpt-test-2026",
        "system_fingerprint": "fp_123",
        "service_tier": "default",
        "choices": [{"index": index, **choice} for index, choice in enumerate(choices)],
        "usage": {
            "prompt_tokens": 12,
            "completion_tokens": 7,
            "total_tokens": 19,
            "prompt_tokens_details": {"cached_tokens": 0, "audio_tokens": 0},
            "completion_tokens_details": {"reasoning_tokens": 4, "accepted_prediction_tokens": 0},
        },
        **extra,
    }


TEXT = {
    "message": {
        "role": "assistant",
        "content": "Paris is the capital of France.",
        "refusal": None,
        "annotations": [],
    },
    "logprobs": None,
    "finish_reason": "stop",
}
TOOLS = {
    "message": {
        "role": "assistant",
        "content": None,
        "refusal": None,
        "tool_calls": [
            {
                "id": "call_1",
                "type": "function",
                "function": {"name": "get_weather", "arguments": '{"city": "Paris", "unit": "celsius"}'},
            },
            {
                "id": "call_2",
                "type": "function",
                "function": {"name": "get_time", "arguments": '{"zone": "Europe/Paris"}'},
            },
        ],
    },
    "logprobs": None,
    "finish_reason": "tool_calls",
}
REFUSAL = {
    "message": {"role": "assistant", "content": None, "refusal": "I can't help with that."},
    "logprobs": None,
    "finish_reason": "stop",
}
REASONING = {
    "message": {"role": "assistant", "content": "42", "reasoning_content": "Six times seven is forty-two."},
    "logprobs": None,
    "finish_reason": "stop",
}
LOGPROBS = {
    "message": {"role": "assistant", "content": "Hello there"},
    "logprobs": {"content": [logprob("Hello", -0.1), logprob(" there", -0.5)], "refusal": None},
    "finish_reason": "stop",
}
CASES = {
    "text": chat(TEXT),
    "tools": chat(TOOLS),
    "refusal": chat(REFUSAL),
    "reasoning": chat(REASONING),
    "logprobs": chat(LOGPROBS),
    "n=2": chat(TEXT, LOGPROBS),
}


def sdk_fold(chunks: list[dict[str, Any]]) -> ChatCompletion:
    state: ChatCompletionStreamState = ChatCompletionStreamState()
    for chunk in chunks:
        state.handle_chunk(ChatCompletionChunk.model_validate(chunk))
    final = state.get_final_completion().model_dump()
    for choice in final["choices"]:
        choice["message"].pop("parsed", None)
        for call in choice["message"].get("tool_calls") or []:  # the helper's own additions to a tool call
            call.pop("index", None)
            call["function"].pop("parsed_arguments", None)
    return ChatCompletion.model_validate(final)


@pytest.mark.parametrize("name", sorted(CASES))
@pytest.mark.parametrize("include_usage", [True, False])
def test_a_replayed_stream_folds_back_into_the_stored_object(name: str, include_usage: bool) -> None:
    whole = CASES[name]
    stored = copy.deepcopy(whole)
    chunks = list(chat_chunks(whole, include_usage))
    assert whole == stored  # unfolding never changes the stored object
    for chunk in chunks:
        ChatCompletionChunk.model_validate(chunk)
    expected = ChatCompletion.model_validate(whole)
    if not include_usage:
        expected = expected.model_copy(update={"usage": None})
    assert ChatCompletion.model_validate(accumulate_chat(chunks)) == expected
    sdk = sdk_fold(chunks)
    assert sdk.choices == expected.choices
    assert (sdk.usage, sdk.system_fingerprint, sdk.model) == (
        expected.usage,
        expected.system_fingerprint,
        expected.model,
    )


def test_tool_call_arguments_arrive_in_pieces() -> None:
    chunks = list(chat_chunks(CASES["tools"], include_usage=False))
    pieces = [
        call["function"]["arguments"]
        for chunk in chunks
        for choice in chunk["choices"]
        for call in choice["delta"].get("tool_calls") or []
        if call.get("function", {}).get("arguments")
    ]
    assert (
        len(pieces) >= 3 and "".join(pieces) == '{"city": "Paris", "unit": "celsius"}{"zone": "Europe/Paris"}'
    )


def test_an_upstream_stream_folds_like_the_sdk_folds_it() -> None:
    """Chunks as an upstream sends them: role first, `usage: null` on each, content in tokens, a usage chunk."""
    head = {
        "id": "chatcmpl-x",
        "object": "chat.completion.chunk",
        "created": 1,
        "model": "m",
        "system_fingerprint": "fp",
    }
    deltas = [{"role": "assistant", "content": "", "refusal": None}, {"content": "Hi"}, {"content": " you"}]
    chunks: list[dict[str, Any]] = [
        {
            **head,
            "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": None}],
            "usage": None,
        }
        for delta in deltas
    ]
    chunks.append(
        {
            **head,
            "choices": [{"index": 0, "delta": {}, "logprobs": None, "finish_reason": "stop"}],
            "usage": None,
        }
    )
    chunks.append(
        {**head, "choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}}
    )
    ours = ChatCompletion.model_validate(accumulate_chat(chunks))
    assert ours == sdk_fold(chunks)
    assert ours.choices[0].message.content == "Hi you" and ours.usage is not None


def test_a_legacy_completion_round_trips() -> None:
    whole = {
        "id": "cmpl-1",
        "object": "text_completion",
        "created": 5,
        "model": "m",
        "choices": [
            {
                "index": 0,
                "text": "one two three four five six seven eight nine ten",
                "logprobs": None,
                "finish_reason": "length",
            },
            {"index": 1, "text": "", "logprobs": None, "finish_reason": "stop"},
        ],
        "usage": {"prompt_tokens": 2, "completion_tokens": 10, "total_tokens": 12},
    }
    chunks = list(text_chunks(whole, include_usage=True))
    assert len(chunks) > 3
    assert Completion.model_validate(accumulate_text(chunks)) == Completion.model_validate(whole)


def test_what_a_semantic_hit_may_serve() -> None:
    assert plain_text(CASES["text"]) and plain_text(CASES["reasoning"])
    assert not any(plain_text(CASES[name]) for name in ("tools", "refusal", "logprobs", "n=2"))
    assert refused(CASES["refusal"]) and not refused(CASES["text"])


# The engine's answers with several choices or logprobs ----------------------------------------------


class Scored:
    def __init__(self, token: str, logprob: float, top: tuple[tuple[str, float], ...] = ()) -> None:
        self.token, self.logprob, self.top = token, logprob, top


ENGINE_USAGE = {"prompt_tokens": 7, "completion_tokens": 4, "total_tokens": 11}


def engine_chunks(chat_api: bool, reasons: tuple[str, str] = ("length", "stop")) -> list[dict[str, Any]]:
    built = ChoiceChunks(chat=chat_api, model="m", n=2)
    chunks = built.opening()
    for index, token in ((0, "Hel"), (1, "Bye"), (0, "lo")):
        chunks += built.text(index, token, [Scored(token, -0.5, ((token, -0.5), ("x", -2.0)))])  # type: ignore[arg-type]
    return [*chunks, *built.finish(reasons), built.usage(ENGINE_USAGE)]


def test_engine_choice_chunks_validate_and_fold_into_valid_answers() -> None:
    chunks = engine_chunks(chat_api=True)
    for chunk in chunks:
        ChatCompletionChunk.model_validate(chunk)
    whole = ChatCompletion.model_validate(accumulate_chat(chunks))
    assert [choice.message.content for choice in whole.choices] == ["Hello", "Bye"]
    assert [choice.finish_reason for choice in whole.choices] == ["length", "stop"]
    first = whole.choices[0].logprobs
    assert first is not None and [entry.token for entry in first.content or []] == ["Hel", "lo"]
    assert first.content is not None and first.content[0].top_logprobs[1].token == "x"
    # The SDK's own stream helper folds them the same way (it refuses to finish a "length" answer).
    state = ChatCompletionStreamState()
    for chunk in engine_chunks(chat_api=True, reasons=("stop", "stop")):
        state.handle_chunk(ChatCompletionChunk.model_validate(chunk))
    assert [choice.message.content for choice in state.get_final_completion().choices] == ["Hello", "Bye"]


def test_engine_legacy_chunks_fold_into_a_valid_completion_with_text_offsets() -> None:
    whole = Completion.model_validate(accumulate_text(engine_chunks(chat_api=False)))
    first = whole.choices[0]
    assert first.text == "Hello" and first.logprobs is not None
    assert (first.logprobs.tokens, first.logprobs.text_offset) == (["Hel", "lo"], [0, 3])
    assert first.logprobs.top_logprobs == [{"Hel": -0.5, "x": -2.0}, {"lo": -0.5, "x": -2.0}]
    assert whole.usage is not None and whole.usage.completion_tokens == 4
