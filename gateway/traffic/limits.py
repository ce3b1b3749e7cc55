"""What kvgate refuses up front, with a clear 400, instead of answering wrongly.

Several choices (`n > 1`), log-probabilities, tool calls, structured output, echo/suffix/best_of, batched
prompts and non-text content parts are not supported by kvgate's engine; silently ignoring them would
hand the client an answer to a question it did not ask.
"""

from __future__ import annotations

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
    if request.tools or request.tool_choice not in (None, "none"):
        _refuse("tools", "Tool calls are not supported.")
    if request.response_format and request.response_format.get("type") not in (None, "text"):
        _refuse("response_format", "Only response_format type 'text' is supported.")
    for index, message in enumerate(request.messages):
        if isinstance(message.content, list) and any(part.type != "text" for part in message.content):
            _refuse(f"messages.{index}.content", "Only text content parts are supported.")
    if request.messages[-1].role not in ("user", "system", "developer"):
        _refuse("messages", "The last message must be from the user.")
    if not any(message.text.strip() for message in request.messages):
        _refuse("messages", "The messages have no text.")


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
