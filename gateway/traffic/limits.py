"""What kvgate refuses up front, with a clear 400, instead of answering wrongly.

Several choices (`n > 1`), log-probabilities, echo/suffix/best_of, batched prompts and non-text content
parts are not supported by kvgate's engine; silently ignoring them would hand the client an answer to a
question it did not ask. Tools and `response_format` are (gateway/backends/structured_outputs.py); what
is refused of them here is what no engine could honour (a tool with no name, a choice of an unknown tool).
"""

from __future__ import annotations

from typing import Any

from gateway.api.errors import InvalidRequest
from gateway.api.objects import ChatCompletionRequest, CompletionRequest, OpenAIRequest

MAX_STOP_SEQUENCES = 4


def refuse_unsupported(request: OpenAIRequest) -> None:
    """Raise `InvalidRequest` naming the first unsupported field."""
    if request.n != 1:
        _refuse("n", "Only n=1 is supported.")
    if len(request.stop_strings) > MAX_STOP_SEQUENCES:
        _refuse("stop", f"At most {MAX_STOP_SEQUENCES} stop sequences are allowed.")
    if any(not stop for stop in request.stop_strings):
        _refuse("stop", "Stop sequences must not be empty.")
    if request.logit_bias:
        _refuse("logit_bias", "logit_bias is not supported.")
    if request.presence_penalty or request.frequency_penalty:
        _refuse("presence_penalty", "presence_penalty and frequency_penalty are not supported.")
    if isinstance(request, ChatCompletionRequest):
        _refuse_chat(request)
    elif isinstance(request, CompletionRequest):
        _refuse_completion(request)


def _refuse_chat(request: ChatCompletionRequest) -> None:
    if request.logprobs or request.top_logprobs:
        _refuse("logprobs", "logprobs are not supported.")
    _refuse_tools(request.tools or [], request.tool_choice)
    _refuse_response_format(request.response_format)
    for index, message in enumerate(request.messages):
        if isinstance(message.content, list) and any(part.type != "text" for part in message.content):
            _refuse(f"messages.{index}.content", "Only text content parts are supported.")
    if request.messages[-1].role not in ("user", "system", "developer", "tool"):
        _refuse("messages", "The last message must be from the user (or a tool's result).")
    if not any(message.text.strip() for message in request.messages):
        _refuse("messages", "The messages have no text.")


def _refuse_tools(tools: list[dict[str, Any]], tool_choice: Any) -> None:
    """Function tools with a name; a choice of "none", "auto", "required" or one of them by name."""
    names = set()
    for index, tool in enumerate(tools):
        function = tool.get("function") if tool.get("type") == "function" else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            _refuse(f"tools.{index}", "Only function tools with a name are supported.")
            return
        if not isinstance(function.get("parameters", {}), dict):
            _refuse(f"tools.{index}.function.parameters", "A tool's parameters must be a JSON schema object.")
        names.add(function["name"])
    if tool_choice in (None, "none", "auto"):
        return
    if not tools:
        _refuse("tool_choice", "tool_choice needs tools.")
    if tool_choice == "required":
        return
    chosen = tool_choice.get("function", {}).get("name") if isinstance(tool_choice, dict) else None
    if not isinstance(tool_choice, dict) or tool_choice.get("type") != "function" or chosen not in names:
        _refuse("tool_choice", "tool_choice must be 'none', 'auto', 'required' or one of the tools by name.")


def _refuse_response_format(response_format: dict[str, Any] | None) -> None:
    """text, json_object, or json_schema with a schema object (compiled by the engine, which refuses what it
    cannot constrain to)."""
    kind = (response_format or {}).get("type")
    if kind not in (None, "text", "json_object", "json_schema"):
        _refuse("response_format", "response_format type must be 'text', 'json_object' or 'json_schema'.")
    if kind == "json_schema":
        json_schema = (response_format or {}).get("json_schema")
        if not isinstance(json_schema, dict) or not isinstance(json_schema.get("schema", {}), dict):
            _refuse(
                "response_format", "response_format json_schema needs a `json_schema` with a `schema` object."
            )


def _refuse_completion(request: CompletionRequest) -> None:
    if request.logprobs:
        _refuse("logprobs", "logprobs are not supported.")
    if request.echo or request.suffix or (request.best_of or 1) != 1:
        _refuse("echo", "echo, suffix and best_of are not supported.")
    if isinstance(request.prompt, list) and len(request.prompt) != 1:
        _refuse("prompt", "Send one prompt per request.")
    if not request.prompt_text.strip():
        _refuse("prompt", "The prompt is empty.")


def _refuse(param: str, message: str) -> None:
    raise InvalidRequest(message, param=param, code="unsupported_parameter")
