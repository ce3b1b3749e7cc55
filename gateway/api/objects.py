"""OpenAI's request and response objects for the routes kvgate serves: one pydantic model each.

Requests accept (and ignore, with a debug log) fields kvgate does not know, as OpenAI clients send new ones
all the time; fields kvgate knows but cannot honour are refused by `gateway/traffic/limits.py`, never ignored.
"""

from __future__ import annotations

import json
import logging
import time
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

logger = logging.getLogger("kvgate.protocol")

Role = Literal["system", "developer", "user", "assistant", "tool"]
FinishReason = Literal["stop", "length"]


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="allow")

    include_usage: bool = False


class OpenAIRequest(BaseModel):
    """Fields common to both completion routes."""

    model_config = ConfigDict(extra="allow")

    model: str = Field(min_length=1, max_length=256)
    max_tokens: int | None = Field(default=None, ge=1)
    temperature: float = Field(default=1.0, ge=0.0, le=2.0)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    n: int = Field(default=1, ge=1, le=128)
    stream: bool = False
    stream_options: StreamOptions | None = None
    stop: str | list[str] | None = None
    seed: int | None = None
    presence_penalty: float = Field(default=0.0, ge=-2.0, le=2.0)
    frequency_penalty: float = Field(default=0.0, ge=-2.0, le=2.0)
    logit_bias: dict[str, float] | None = None
    user: str | None = Field(default=None, max_length=256)

    @model_validator(mode="after")
    def _log_unknown_fields(self) -> OpenAIRequest:
        if self.model_extra:
            logger.debug("ignoring unknown request fields: %s", sorted(self.model_extra))
        return self

    @property
    def stop_strings(self) -> list[str]:
        if self.stop is None:
            return []
        return [self.stop] if isinstance(self.stop, str) else list(self.stop)

    @property
    def include_usage_in_stream(self) -> bool:
        return self.stream_options is not None and self.stream_options.include_usage


class TextPart(BaseModel):
    model_config = ConfigDict(extra="allow")

    type: str
    text: str | None = None


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="allow")

    role: Role
    content: str | list[TextPart] | None = None
    name: str | None = None

    @property
    def text(self) -> str:
        """The message's text; list content is joined part by part (non-text parts are refused earlier)."""
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(part.text or "" for part in self.content)


class ChatCompletionRequest(OpenAIRequest):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    logprobs: bool | None = None
    top_logprobs: int | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: Any = None
    response_format: dict[str, Any] | None = None

    @property
    def max_new_tokens(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens


class CompletionRequest(OpenAIRequest):
    prompt: str | list[str] = Field(min_length=1)
    logprobs: int | None = None
    echo: bool = False
    suffix: str | None = None
    best_of: int | None = None

    @property
    def prompt_text(self) -> str:
        return self.prompt if isinstance(self.prompt, str) else "".join(self.prompt[:1])

    @property
    def max_new_tokens(self) -> int | None:
        # OpenAI's legacy completions default to 16 new tokens.
        return self.max_tokens if self.max_tokens is not None else 16


class PromptTokensDetails(BaseModel):
    cached_tokens: int = 0


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails = Field(default_factory=PromptTokensDetails)


class ResponseMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str


class ChatChoice(BaseModel):
    index: int = 0
    message: ResponseMessage
    finish_reason: FinishReason
    logprobs: None = None


class ChatCompletion(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: list[ChatChoice]
    usage: Usage
    system_fingerprint: str | None = None


class ChunkDelta(BaseModel):
    role: Literal["assistant"] | None = None
    content: str | None = None


class ChatChunkChoice(BaseModel):
    index: int = 0
    delta: ChunkDelta
    finish_reason: FinishReason | None = None
    logprobs: None = None


class ChatCompletionChunk(BaseModel):
    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChatChunkChoice]
    usage: Usage | None = None


class CompletionChoice(BaseModel):
    index: int = 0
    text: str
    finish_reason: FinishReason | None
    logprobs: None = None


class Completion(BaseModel):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: list[CompletionChoice]
    usage: Usage | None = None


class ResponsesRequest(OpenAIRequest):
    """`POST /v1/responses`: `input` is one text or a list of input items; a request that names earlier
    state (`previous_response_id`, `conversation`) is stateful, and passes through uncached."""

    input: str | list[dict[str, Any]]
    instructions: str | None = None
    max_output_tokens: int | None = Field(default=None, ge=1)
    previous_response_id: str | None = None
    conversation: str | dict[str, Any] | None = None
    tools: list[dict[str, Any]] | None = None

    @property
    def stateful(self) -> bool:
        return self.previous_response_id is not None or self.conversation is not None

    @property
    def prompt_text(self) -> str:
        return self.input if isinstance(self.input, str) else json.dumps(self.input, sort_keys=True)

    @property
    def max_new_tokens(self) -> int | None:
        return self.max_output_tokens


class AnthropicMessage(BaseModel):
    model_config = ConfigDict(extra="allow")

    role: Literal["user", "assistant"]
    content: str | list[dict[str, Any]]

    @property
    def text(self) -> str:
        if isinstance(self.content, str):
            return self.content
        return "\n".join(
            str(block.get("text") or "") for block in self.content if block.get("type") == "text"
        )


class MessagesRequest(BaseModel):
    """Anthropic's `POST /v1/messages` (`max_tokens` is required there); fields kvgate does not know pass on."""

    model_config = ConfigDict(extra="allow")

    model: str = Field(min_length=1, max_length=256)
    messages: list[AnthropicMessage] = Field(min_length=1)
    max_tokens: int = Field(ge=1)
    system: str | list[dict[str, Any]] | None = None
    stream: bool = False
    temperature: float = Field(default=1.0, ge=0.0, le=1.0)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    stop_sequences: list[str] | None = None
    tools: list[dict[str, Any]] | None = None

    seed: None = None  # the Messages API has none
    include_usage_in_stream: bool = False  # usage always travels in its events

    @property
    def stop_strings(self) -> list[str]:
        return list(self.stop_sequences or [])

    @property
    def max_new_tokens(self) -> int:
        return self.max_tokens

    @property
    def system_text(self) -> str:
        if self.system is None or isinstance(self.system, str):
            return self.system or ""
        return "\n".join(str(block.get("text") or "") for block in self.system)

    @property
    def prompt_text(self) -> str:
        return "\n".join([self.system_text, *(message.text for message in self.messages)])


class EmbeddingRequest(BaseModel):
    """`POST /v1/embeddings`: one input or a batch (texts, or token arrays), answered per input."""

    model_config = ConfigDict(extra="allow")

    model: str = Field(min_length=1, max_length=256)
    input: str | list[str] | list[int] | list[list[int]]
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: int | None = Field(default=None, ge=1)
    user: str | None = Field(default=None, max_length=256)

    @property
    def inputs(self) -> list[str | list[int]]:
        """The inputs as a batch: one text, texts, one token array or token arrays."""
        if isinstance(self.input, str):
            return [self.input]
        items: list[Any] = list(self.input)
        if items and all(isinstance(item, int) for item in items):
            return [items]
        return items


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "kvgate"


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


class ErrorDetail(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: str | None = None


class ErrorResponse(BaseModel):
    error: ErrorDetail
