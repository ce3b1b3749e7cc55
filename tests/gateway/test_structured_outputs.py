"""Engine mode's structured outputs without a model: the plan a chat body makes (grammar, prompt) and the
tool-call chunks folded by the openai SDK's own types and stream helper."""

from __future__ import annotations

import json
from typing import Any

from openai.lib.streaming.chat import ChatCompletionStreamState
from openai.types.chat import ChatCompletion, ChatCompletionChunk

from engine.sampler import SamplingParams
from engine.serving.ipc import sampling_from_wire, sampling_to_wire
from gateway.api.choice_chunks import ChoiceChunks
from gateway.api.chunks import accumulate_chat
from gateway.backends.structured_outputs import TOOLS_INTRO, plan_output

WEATHER = {
    "name": "get_weather",
    "description": "Weather.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
}
TIME = {"name": "get_time", "parameters": {"type": "object", "properties": {"tz": {"type": "string"}}}}
TOOLS = [{"type": "function", "function": WEATHER}, {"type": "function", "function": TIME}]
USAGE = {
    "prompt_tokens": 5,
    "completion_tokens": 9,
    "total_tokens": 14,
    "prompt_tokens_details": {"cached_tokens": 0},
}


def plan(**body: Any) -> Any:
    messages = [{"role": "user", "content": "hi"}]
    return plan_output({"messages": messages, **body}, [dict(message) for message in messages])


def test_response_formats_become_grammar_specs() -> None:
    assert plan().grammar is None and plan(response_format={"type": "text"}).grammar is None
    assert json.loads(plan(response_format={"type": "json_object"}).grammar) == {"type": "json_object"}
    schema = {"type": "object", "properties": {"b": {}, "a": {}}}
    spec = plan(
        response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}
    ).grammar
    assert list(json.loads(spec)["schema"]["properties"]) == ["b", "a"]  # the schema's order is kept


def test_required_and_named_tool_choices_constrain_to_calls_and_describe_the_tools() -> None:
    required = plan(tools=TOOLS, tool_choice="required")
    schema = json.loads(required.grammar)["schema"]
    assert [branch["properties"]["name"]["const"] for branch in schema["anyOf"]] == [
        "get_weather",
        "get_time",
    ]
    assert required.tool_call and required.messages[0]["role"] == "system"
    assert (
        required.messages[0]["content"].startswith(TOOLS_INTRO)
        and "get_time" in required.messages[0]["content"]
    )
    named = plan(tools=TOOLS, tool_choice={"type": "function", "function": {"name": "get_time"}})
    assert json.loads(named.grammar)["schema"]["properties"]["arguments"] == TIME["parameters"]
    for choice in ("auto", "none", None):
        assert plan(tools=TOOLS, tool_choice=choice).grammar is None  # text: the template has no tools


def test_tool_calls_and_results_in_the_history_are_written_as_text() -> None:
    body_messages = [
        {"role": "user", "content": "weather?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "c",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Rome"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "c", "content": "21C"},
    ]
    as_text = [{"role": m["role"], "content": m["content"] or ""} for m in body_messages]
    rendered = plan_output({"messages": body_messages}, as_text).messages
    assert rendered[1] == {
        "role": "assistant",
        "content": '{"name": "get_weather", "arguments": {"city": "Rome"}}',
    }
    assert rendered[2] == {"role": "tool", "content": "21C"}


def fold(text_deltas: list[str], complete: bool) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    chunks = ChoiceChunks(chat=True, model="m", n=1, tool_calls=True)
    payloads = chunks.opening() + [
        payload for delta in text_deltas for payload in chunks.text(0, delta, None)
    ]
    payloads += [*chunks.finish(["stop" if complete else "length"]), chunks.usage(USAGE)]
    return payloads, accumulate_chat(payloads)


def test_a_tool_call_streams_its_arguments_and_folds_into_the_sdk_objects() -> None:
    deltas = ['{"na', 'me": "get_', 'weather", "arg', 'uments": {"ci', 'ty": "Ro', 'me"}', "}"]
    payloads, whole = fold(deltas, complete=True)
    state = ChatCompletionStreamState()
    for payload in payloads:
        state.handle_chunk(ChatCompletionChunk.model_validate(payload))
    for completion in (state.get_final_completion(), ChatCompletion.model_validate(whole)):
        choice = completion.choices[0]
        assert choice.finish_reason == "tool_calls" and choice.message.content is None
        (call,) = choice.message.tool_calls or []
        assert call.function.name == "get_weather" and json.loads(call.function.arguments) == {"city": "Rome"}
    calls = [
        call for p in payloads if p["choices"] for call in p["choices"][0]["delta"].get("tool_calls", [])
    ]
    pieces = [call["function"]["arguments"] for call in calls if "id" not in call]
    assert len(pieces) >= 3 and "".join(pieces) == '{"city": "Rome"}'  # sent as generated
    assert whole["usage"] == USAGE


def test_each_choice_of_a_tool_call_answer_is_a_call_of_its_own() -> None:
    chunks = ChoiceChunks(chat=True, model="m", n=2, tool_calls=True)
    payloads = chunks.opening()
    for index, delta in (
        (0, '{"name": "f", "argu'),
        (1, '{"name": "g", "arguments": {"a": 1}}'),
        (0, 'ments": {}}'),
    ):
        payloads += chunks.text(index, delta, None)
    payloads += [*chunks.finish(["stop", "length"]), chunks.usage(USAGE)]
    whole = ChatCompletion.model_validate(accumulate_chat(payloads))
    calls = [(choice.message.tool_calls or [None])[0] for choice in whole.choices]
    assert [call.function.name for call in calls if call] == ["f", "g"]
    assert [choice.finish_reason for choice in whole.choices] == ["tool_calls", "length"]
    assert calls[0] and calls[1] and calls[0].id != calls[1].id
    assert calls[1].function.arguments == '{"a": 1}}'  # cut by max_tokens: sent as generated


def test_a_call_cut_by_max_tokens_ends_with_length_and_what_there_is() -> None:
    _, whole = fold(['{"name": "get_time", "arguments": {"tz": "Eu'], complete=False)
    choice = ChatCompletion.model_validate(whole).choices[0]
    assert choice.finish_reason == "length"
    assert choice.message.tool_calls and choice.message.tool_calls[0].function.arguments == '{"tz": "Eu'
    _, nameless = fold(['{"name": "get_'], complete=False)
    assert not ChatCompletion.model_validate(nameless).choices[0].message.tool_calls


def test_the_grammar_crosses_the_engine_process_socket() -> None:
    params = SamplingParams(grammar='{"type": "json_object"}')
    assert sampling_from_wire(json.loads(json.dumps(sampling_to_wire(params)))) == params
