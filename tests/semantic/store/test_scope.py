"""The scope is the hard partition: every answer-changing field splits it, nothing else does."""

from __future__ import annotations

import random
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from semantic.store.scope import RequestScope, build_scope, canonical_json
from tests.semantic.builders import EMBEDDER, make_request, make_scope


def shuffled(value: Any, rng: random.Random) -> Any:
    """The same JSON value with every object's keys in a random order."""
    if isinstance(value, dict):
        items = list(value.items())
        rng.shuffle(items)
        return {key: shuffled(item, rng) for key, item in items}
    if isinstance(value, list):
        return [shuffled(item, rng) for item in value]
    return value


def same_place(first: RequestScope, second: RequestScope) -> bool:
    return first.scope_id == second.scope_id and first.exact_key == second.exact_key


RICH_REQUEST = make_request(
    tools=[
        {
            "type": "function",
            "function": {"name": "lookup", "parameters": {"type": "object", "properties": {}}},
        }
    ],
    tool_choice="auto",
    response_format={"type": "json_object"},
    stop=["\n\n", "END"],
    logit_bias={"50256": -100},
    seed=7,
    top_p=0.9,
)


@given(st.randoms(use_true_random=False))
def test_key_order_never_changes_the_scope(rng: random.Random) -> None:
    reordered = shuffled(RICH_REQUEST, rng)
    first = build_scope(RICH_REQUEST, tenant="acme", embedder=EMBEDDER)
    second = build_scope(reordered, tenant="acme", embedder=EMBEDDER)
    assert same_place(first, second)


@pytest.mark.parametrize(
    "irrelevant",
    [
        {"stream": True},
        {"stream_options": {"include_usage": True}},
        {"user": "user-123"},
        {"metadata": {"trace": "abc"}},
        {"store": True},
        {"n": 1},
        {"temperature": 0.0},  # the same value as the base request's 0, spelled as a float
        {"presence_penalty": 0, "frequency_penalty": 0.0},
        {"logit_bias": {}},
        {"seed": None},
    ],
)
def test_fields_that_cannot_change_the_answer_do_not_split_the_scope(irrelevant: dict[str, Any]) -> None:
    assert same_place(make_scope(), make_scope(**irrelevant))


@pytest.mark.parametrize(
    ("first", "second"),
    [
        ({"max_tokens": 64}, {"max_completion_tokens": 64}),
        ({"stop": "END"}, {"stop": ["END"]}),
        ({"temperature": 1}, {"temperature": None}),
        ({"top_p": 1.0}, {}),
    ],
)
def test_synonyms_and_defaults_fold_together(first: dict[str, Any], second: dict[str, Any]) -> None:
    base = make_request()
    del base["max_tokens"]
    one = build_scope({**base, **first}, tenant="acme", embedder=EMBEDDER)
    two = build_scope({**base, **second}, tenant="acme", embedder=EMBEDDER)
    assert same_place(one, two)


@pytest.mark.parametrize(
    "change",
    [
        {"temperature": 0.7},
        {"top_p": 0.5},
        {"max_tokens": 65},
        {"n": 2},
        {"stop": ["\n"]},
        {"seed": 1},
        {"presence_penalty": 0.5},
        {"frequency_penalty": 0.5},
        {"logit_bias": {"50256": -100}},
        {"tools": RICH_REQUEST["tools"]},
        {"tool_choice": "none"},
        {"response_format": {"type": "json_object"}},
        {"logprobs": True},
        {"some_future_parameter": 3},  # unknown fields stay in the scope: they might change the answer
        {"model": "other-model"},
    ],
)
def test_every_answer_changing_parameter_splits_the_scope(change: dict[str, Any]) -> None:
    base, changed = make_scope(), make_scope(**change)
    assert base.prompt == changed.prompt
    assert base.scope_id != changed.scope_id
    assert base.exact_key != changed.exact_key


def test_tenant_system_prompt_earlier_turns_and_embedder_split_the_scope() -> None:
    base = make_scope()
    other_system = make_request(
        messages=[
            {"role": "system", "content": "Answer in French."},
            {"role": "user", "content": base.prompt},
        ]
    )
    earlier_turns = make_request(
        messages=[
            {"role": "system", "content": "You are a helpful assistant."},
            {"role": "user", "content": "I use the mobile app."},
            {"role": "assistant", "content": "Noted."},
            {"role": "user", "content": base.prompt},
        ]
    )
    others = [
        make_scope(tenant="globex"),
        build_scope(other_system, tenant="acme", embedder=EMBEDDER),
        build_scope(earlier_turns, tenant="acme", embedder=EMBEDDER),
        build_scope(make_request(), tenant="acme", embedder="another-embedder"),
    ]
    for other in others:
        assert other.prompt == base.prompt
        assert other.scope_id != base.scope_id and other.exact_key != base.exact_key
    assert len({other.scope_id for other in others}) == len(others)


def test_only_the_last_user_turn_is_compared() -> None:
    first, second = make_scope("How do I reset my password?"), make_scope("How can I reset my password?")
    assert first.scope_id == second.scope_id
    assert first.exact_key != second.exact_key
    assert second.prompt == "How can I reset my password?" and second.semantic


def test_text_parts_read_as_the_same_text() -> None:
    parts = [{"type": "text", "text": "How do I reset"}, {"type": "text", "text": "my password?"}]
    as_parts = make_scope(messages=[{"role": "user", "content": parts}])
    as_text = make_scope(messages=[{"role": "user", "content": "How do I reset\nmy password?"}])
    assert same_place(as_parts, as_text) and as_parts.semantic
    single = make_scope(messages=[{"role": "user", "content": [{"type": "text", "text": "hi"}]}])
    assert same_place(single, make_scope(messages=[{"role": "user", "content": "hi"}]))


def test_a_last_turn_with_an_image_is_exact_only() -> None:
    parts = [{"type": "text", "text": "What is this?"}, {"type": "image_url", "image_url": {"url": "data:,"}}]
    scope = make_scope(messages=[{"role": "user", "content": parts}])
    assert not scope.semantic and scope.semantic_refusal == "last user turn is not plain text"
    other_image = [parts[0], {"type": "image_url", "image_url": {"url": "data:,x"}}]
    assert make_scope(messages=[{"role": "user", "content": other_image}]).exact_key != scope.exact_key


def test_a_conversation_not_ending_on_a_user_turn_is_exact_only() -> None:
    messages = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "Hello! How"}]
    scope = make_scope(messages=messages)
    assert not scope.semantic and scope.prompt == ""


def test_completions_prompts() -> None:
    text = build_scope({"model": "m", "prompt": "Once upon a time"}, tenant="acme", embedder=EMBEDDER)
    listed = build_scope({"model": "m", "prompt": ["Once upon a time"]}, tenant="acme", embedder=EMBEDDER)
    tokens = build_scope({"model": "m", "prompt": [1, 2, 3]}, tenant="acme", embedder=EMBEDDER)
    chat = build_scope(
        {"model": "m", "messages": [{"role": "user", "content": "Once upon a time"}]},
        tenant="acme",
        embedder=EMBEDDER,
    )
    assert same_place(text, listed) and text.semantic and text.endpoint == "completions"
    assert not tokens.semantic and tokens.exact_key != text.exact_key
    assert chat.scope_id != text.scope_id  # the two endpoints answer in different shapes


def test_keys_are_keyed_digests() -> None:
    plain = make_scope()
    keyed = build_scope(make_request(), tenant="acme", embedder=EMBEDDER, secret=b"deployment secret")
    assert len(plain.scope_id) == 32 and int(plain.scope_id, 16) >= 0
    assert keyed.scope_id != plain.scope_id and keyed.exact_key != plain.exact_key


@pytest.mark.parametrize("body", [{"model": "m"}, {"model": "m", "messages": []}, {"messages": ["hi"]}])
def test_malformed_requests_are_refused(body: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        build_scope(body, tenant="acme", embedder=EMBEDDER)


def test_canonical_json_is_order_free() -> None:
    assert canonical_json({"b": 1, "a": [1, {"d": 2, "c": 3}]}) == canonical_json(
        {"a": [1, {"c": 3, "d": 2}], "b": 1}
    )


@pytest.mark.parametrize(
    ("overrides", "reason"),
    [
        ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {}}}]}, "tools in play"),
        ({"logprobs": True, "top_logprobs": 2}, "log-probabilities asked"),
        ({"n": 2}, "several choices asked"),
        ({"modalities": ["text", "audio"]}, "audio asked"),
    ],
)
def test_requests_whose_answer_is_not_a_shareable_text_are_exact_only(
    overrides: dict[str, object], reason: str
) -> None:
    scope = make_scope("What is the capital of France?", **overrides)
    assert scope.prompt == "What is the capital of France?"
    assert scope.semantic_refusal == reason


def test_a_conversation_with_tool_results_is_exact_only() -> None:
    messages = [
        {"role": "user", "content": "Weather in Paris?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "w", "arguments": "{}"}}],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "18 C"},
        {"role": "user", "content": "And tomorrow?"},
    ]
    scope = make_scope("ignored", messages=messages)
    assert scope.prompt == "And tomorrow?" and scope.semantic_refusal == "tool results in the conversation"
    assert make_scope("What is the capital of France?", n=1, logprobs=False).semantic


def test_an_embedder_per_language_splits_only_the_languages_it_routes() -> None:
    """With one embedder per language, an English prompt keeps the scope a plain name gives it; a Chinese
    prompt, embedded by another model, gets a scope of its own and keeps its exact key within it."""

    def identity(prompt: str) -> str:
        return f"multilingual/{prompt[:1]}" if not prompt.isascii() else EMBEDDER

    english = make_request()
    chinese = make_request(messages=[{"role": "user", "content": "怎样才能不晕车？"}])
    assert same_place(
        build_scope(english, tenant="acme", embedder=identity),
        build_scope(english, tenant="acme", embedder=EMBEDDER),
    )
    routed = build_scope(chinese, tenant="acme", embedder=identity)
    assert routed.scope_id != build_scope(chinese, tenant="acme", embedder=EMBEDDER).scope_id
    assert same_place(routed, build_scope(chinese, tenant="acme", embedder=identity))
