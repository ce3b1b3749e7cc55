"""What kvgate refuses up front, with a clear 400, instead of answering wrongly.

Echo/suffix/best_of, batched prompts and non-text content parts are not supported by kvgate's engine;
silently ignoring them would hand the client an answer to a question it did not ask. Several choices (`n`),
logprobs, penalties and `logit_bias` are served, within OpenAI's bounds (and at most `MAX_CHOICES` choices,
each of which holds KV blocks of its own once it diverges). Tools and `response_format` are served too
(gateway/backends/structured_outputs.py), with any `n`; what is refused of them here is what no engine
could honour (a tool with no name, a choice of an unknown tool), and logprobs with a forced tool call
(OpenAI reports logprobs for a message's content only, and a call has none).
"""

from __future__ import annotations

from typing import Any, NoReturn

from gateway.api.errors import InvalidRequest
from gateway.api.objects import ChatCompletionRequest, CompletionRequest, OpenAIRequest

MAX_STOP_SEQUENCES = 4
MAX_CHOICES = 16  # engine.sampler.MAX_N
MAX_TOP_LOGPROBS = 20  # OpenAI's bound; engine.sampler.MAX_LOGPROBS
MAX_LOGIT_BIAS = 100.0


def refuse_sampling(request: OpenAIRequest) -> None:
    """What chat and legacy completions share: raise `InvalidRequest` naming the first unsupported field."""
    if request.n > MAX_CHOICES:
        _refuse("n", f"At most n={MAX_CHOICES} choices are supported.", "invalid_value")
    if len(request.stop_strings) > MAX_STOP_SEQUENCES:
        _refuse("stop", f"At most {MAX_STOP_SEQUENCES} stop sequences are allowed.")
    if any(not stop for stop in request.stop_strings):
        _refuse("stop", "Stop sequences must not be empty.")
    for token, bias in (request.logit_bias or {}).items():
        if not token.isdigit():
            _refuse("logit_bias", f"logit_bias keys must be token ids, got {token!r}.", "invalid_value")
        if not -MAX_LOGIT_BIAS <= bias <= MAX_LOGIT_BIAS:
            _refuse("logit_bias", f"logit_bias values must be in [-100, 100], got {bias}.", "invalid_value")


def refuse_chat(request: ChatCompletionRequest) -> None:
    """A chat request the engine cannot honour: `InvalidRequest` naming the first unsupported field."""
    refuse_sampling(request)
    if request.top_logprobs is not None:
        if not request.logprobs:
            _refuse("top_logprobs", "top_logprobs requires logprobs to be true.", "invalid_value")
        if not 0 <= request.top_logprobs <= MAX_TOP_LOGPROBS:
            _refuse("top_logprobs", f"top_logprobs must be in [0, {MAX_TOP_LOGPROBS}].", "invalid_value")
    if _refuse_tools(request.tools or [], request.tool_choice) and request.logprobs:
        _refuse("logprobs", "logprobs are not reported for a forced tool call (tool_choice).")
    _refuse_response_format(request.response_format)
    for index, message in enumerate(request.messages):
        if isinstance(message.content, list) and any(part.type != "text" for part in message.content):
            _refuse(f"messages.{index}.content", "Only text content parts are supported.")
    if request.messages[-1].role not in ("user", "system", "developer", "tool"):
        _refuse("messages", "The last message must be from the user (or a tool's result).")
    if not any(message.text.strip() for message in request.messages):
        _refuse("messages", "The messages have no text.")


def _refuse_tools(tools: list[dict[str, Any]], tool_choice: Any) -> bool:
    """Function tools with a name; a choice of "none", "auto", "required" or one of them by name. Returns
    whether the answer will be a tool call (a choice of "required" or a named tool)."""
    names = set()
    for index, tool in enumerate(tools):
        function = tool.get("function") if tool.get("type") == "function" else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            _refuse(f"tools.{index}", "Only function tools with a name are supported.")
        if not isinstance(function.get("parameters", {}), dict):
            _refuse(f"tools.{index}.function.parameters", "A tool's parameters must be a JSON schema object.")
        names.add(function["name"])
    if tool_choice in (None, "none", "auto"):
        return False
    if not tools:
        _refuse("tool_choice", "tool_choice needs tools.")
    if tool_choice == "required":
        return True
    chosen = tool_choice.get("function", {}).get("name") if isinstance(tool_choice, dict) else None
    if not isinstance(tool_choice, dict) or tool_choice.get("type") != "function" or chosen not in names:
        _refuse("tool_choice", "tool_choice must be 'none', 'auto', 'required' or one of the tools by name.")
    return True


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


def refuse_completion(request: CompletionRequest) -> None:
    """A legacy completion the engine cannot honour: `InvalidRequest` naming the first unsupported field."""
    refuse_sampling(request)
    if request.logprobs is not None and not 0 <= request.logprobs <= MAX_TOP_LOGPROBS:
        _refuse("logprobs", f"logprobs must be in [0, {MAX_TOP_LOGPROBS}].", "invalid_value")
    if request.echo or request.suffix or (request.best_of or 1) != 1:
        _refuse("echo", "echo, suffix and best_of are not supported.")
    if isinstance(request.prompt, list) and len(request.prompt) != 1:
        _refuse("prompt", "Send one prompt per request.")
    if not request.prompt_text.strip():
        _refuse("prompt", "The prompt is empty.")


def _refuse(param: str, message: str, code: str = "unsupported_parameter") -> NoReturn:
    raise InvalidRequest(message, param=param, code=code)
