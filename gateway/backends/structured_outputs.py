"""What a chat request asks of the engine's output: free text, JSON (`response_format`), or a call of one
of its tools; the grammar the engine decodes under, and the prompt that goes with it.

SmolLM2's chat template knows nothing of tools, so kvgate does what a template would: the tools are listed
in a system text, earlier tool calls and tool results are written into the conversation as text, and a
call is asked for as one JSON object, `{"name": <a tool's name>, "arguments": <its arguments>}`, which the
grammar makes valid (a listed name, arguments valid against that tool's parameters). `tool_choice`
"required" allows any listed tool, a named function only that one; "auto" and "none" answer in text (with
no template support for tools, the model is not offered them). Reads the client's JSON body; knows no
HTTP and no engine internals beyond the grammar spec's format.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from engine import json_object_spec, json_schema_spec

TOOLS_INTRO = (
    "You can call the tools listed below. Reply with exactly one call, as a JSON object "
    '{"name": <the tool\'s name>, "arguments": <an object of its parameters>}.\nTools:'
)
_ANY_OBJECT: dict[str, Any] = {"type": "object"}


@dataclass(frozen=True, slots=True)
class OutputPlan:
    """How the engine is to answer one chat request."""

    messages: list[dict[str, str]]
    """The conversation as the chat template takes it: every message a role and a text."""
    grammar: str | None = None
    """The grammar spec the answer must follow (engine.grammar); None: free text."""
    tool_call: bool = False
    """The answer is a tool call (`{"name", "arguments"}`), returned as `message.tool_calls`."""


def plan_output(body: Mapping[str, Any], messages: list[dict[str, str]]) -> OutputPlan:
    """The plan for a chat request's body; `messages` is the conversation as text (the default prompt)."""
    tools = [tool["function"] for tool in body.get("tools") or []]
    called = called_tools(tools, body.get("tool_choice"))
    rendered = render_messages(body.get("messages") or [], messages)
    if called:
        return OutputPlan(
            _with_tools_described(rendered, called), json_schema_spec(tool_call_schema(called)), True
        )
    return OutputPlan(rendered, response_format_spec(body.get("response_format")))


def called_tools(tools: Sequence[Mapping[str, Any]], tool_choice: Any) -> list[Mapping[str, Any]]:
    """The tools the answer must call one of: all for "required", one for a named function, none else."""
    if tool_choice == "required":
        return list(tools)
    if isinstance(tool_choice, Mapping) and tool_choice.get("type") == "function":
        name = (tool_choice.get("function") or {}).get("name")
        return [tool for tool in tools if tool.get("name") == name]
    return []


def response_format_spec(response_format: Mapping[str, Any] | None) -> str | None:
    """The grammar spec of a `response_format`: any object for json_object, its schema for json_schema."""
    kind = (response_format or {}).get("type")
    if kind == "json_object":
        return json_object_spec()
    if kind == "json_schema":
        schema = ((response_format or {}).get("json_schema") or {}).get("schema")
        return json_schema_spec(schema) if isinstance(schema, dict) else json_object_spec()
    return None


def tool_call_schema(tools: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """One JSON schema for a call of any of `tools`: its name, then arguments valid for its parameters (in
    that order: the name is known before the arguments stream)."""
    calls = [
        {
            "type": "object",
            "properties": {
                "name": {"const": tool["name"]},
                "arguments": tool.get("parameters") or _ANY_OBJECT,
            },
            "required": ["name", "arguments"],
            "additionalProperties": False,
        }
        for tool in tools
    ]
    return calls[0] if len(calls) == 1 else {"anyOf": calls}


def render_messages(
    body_messages: Sequence[Mapping[str, Any]], messages: list[dict[str, str]]
) -> list[dict[str, str]]:
    """The conversation with earlier tool calls and tool results as text (unchanged when it has none)."""
    if not any(message.get("tool_calls") or message.get("role") == "tool" for message in body_messages):
        return messages
    rendered = []
    for message, as_text in zip(body_messages, messages, strict=True):
        text = as_text["content"]
        calls = [_call_text(call) for call in message.get("tool_calls") or []]
        if calls:
            text = "\n".join([text, *calls]) if text else "\n".join(calls)
        rendered.append({"role": as_text["role"], "content": text})
    return rendered


def _with_tools_described(
    messages: list[dict[str, str]], tools: Sequence[Mapping[str, Any]]
) -> list[dict[str, str]]:
    lines = [TOOLS_INTRO]
    for tool in tools:
        description = f": {tool['description']}" if tool.get("description") else ""
        parameters = json.dumps(tool.get("parameters") or _ANY_OBJECT)
        lines.append(f"- {tool['name']}{description} Parameters (JSON schema): {parameters}")
    text = "\n".join(lines)
    if messages and messages[0]["role"] in ("system", "developer"):
        return [
            {"role": messages[0]["role"], "content": messages[0]["content"] + "\n\n" + text},
            *messages[1:],
        ]
    return [{"role": "system", "content": text}, *messages]


def _call_text(call: Mapping[str, Any]) -> str:
    """An earlier call as the model is asked to write one."""
    function = call.get("function") or {}
    arguments = function.get("arguments") or "{}"
    try:
        parsed = json.loads(arguments) if isinstance(arguments, str) else arguments
    except ValueError:
        parsed = arguments
    return json.dumps({"name": function.get("name"), "arguments": parsed})
