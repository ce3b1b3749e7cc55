"""Turning answers into OpenAI's objects: whole responses, and the chunks of an SSE stream.

Each response gets a fresh `id` and `created`, also when it replays a stored answer.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncGenerator, AsyncIterator, Iterator
from dataclasses import dataclass, field
from typing import Any

import pydantic_core
from fastapi.responses import StreamingResponse

from gateway.api.errors import ServiceUnavailable
from gateway.api.ids import random_hex
from gateway.api.objects import (
    ChatChoice,
    ChatChunkChoice,
    ChatCompletion,
    ChatCompletionChunk,
    ChunkDelta,
    Completion,
    CompletionChoice,
    FinishReason,
    ResponseMessage,
    Usage,
)
from gateway.backends.protocol import GenerationEvent

REPLAY_CHUNK_CHARS = 24


@dataclass(slots=True)
class Renderer:
    """Builds the objects of one response: chat or legacy completion, with one id and timestamp."""

    chat: bool
    model: str
    id: str = ""
    created: int = field(default_factory=lambda: int(time.time()))

    def __post_init__(self) -> None:
        if not self.id:
            self.id = ("chatcmpl-" if self.chat else "cmpl-") + random_hex(12)

    def whole(self, text: str, finish_reason: FinishReason, usage: Usage) -> bytes:
        """The whole response as JSON bytes (pydantic's serialiser: no intermediate dict, no json.dumps)."""
        if self.chat:
            return (
                ChatCompletion(
                    id=self.id,
                    created=self.created,
                    model=self.model,
                    choices=[ChatChoice(message=ResponseMessage(content=text), finish_reason=finish_reason)],
                    usage=usage,
                )
                .model_dump_json()
                .encode()
            )
        return (
            Completion(
                id=self.id,
                created=self.created,
                model=self.model,
                choices=[CompletionChoice(text=text, finish_reason=finish_reason)],
                usage=usage,
            )
            .model_dump_json()
            .encode()
        )

    def opening_chunk(self) -> str | None:
        """The chat stream's first chunk carries the role; legacy completions have none."""
        if not self.chat:
            return None
        return self._chunk(ChunkDelta(role="assistant", content=""), None)

    def text_chunk(self, text: str) -> str:
        return self._chunk(ChunkDelta(content=text), None) if self.chat else self._text_chunk(text, None)

    def finish_chunk(self, finish_reason: FinishReason) -> str:
        return self._chunk(ChunkDelta(), finish_reason) if self.chat else self._text_chunk("", finish_reason)

    def usage_chunk(self, usage: Usage) -> str:
        if self.chat:
            chunk = ChatCompletionChunk(
                id=self.id, created=self.created, model=self.model, choices=[], usage=usage
            )
            return sse(chunk.model_dump(exclude_none=True) | {"choices": []})
        completion = Completion(id=self.id, created=self.created, model=self.model, choices=[], usage=usage)
        return sse(completion.model_dump())

    def _chunk(self, delta: ChunkDelta, finish_reason: FinishReason | None) -> str:
        chunk = ChatCompletionChunk(
            id=self.id,
            created=self.created,
            model=self.model,
            choices=[ChatChunkChoice(delta=delta, finish_reason=finish_reason)],
        )
        payload = chunk.model_dump(exclude={"usage"})
        payload["choices"][0]["delta"] = delta.model_dump(exclude_none=True)
        return sse(payload)

    def _text_chunk(self, text: str, finish_reason: FinishReason | None) -> str:
        completion = Completion(
            id=self.id,
            created=self.created,
            model=self.model,
            choices=[CompletionChoice(text=text, finish_reason=finish_reason)],
        )
        return sse(completion.model_dump(exclude={"usage"}))


async def first_event(events: AsyncGenerator[GenerationEvent, None]) -> GenerationEvent:
    """A live answer's first event, so that an error before it is a plain HTTP error, not a broken stream."""
    try:
        return await anext(events)
    except StopAsyncIteration as ended:
        await events.aclose()
        raise ServiceUnavailable("The generation ended without output.") from ended
    except BaseException:
        await events.aclose()
        raise


def named_sse(event: dict[str, Any]) -> str:
    """One event of a Responses or Messages stream: its `type` as the SSE event name, as OpenAI and Anthropic
    send them."""
    return f"event: {event.get('type', 'message')}\ndata: {json.dumps(event, separators=(',', ':'))}\n\n"


async def named_sse_stream(events: Iterator[dict[str, Any]]) -> AsyncIterator[str]:
    for event in events:
        yield named_sse(event)


def json_body(payload: dict[str, Any]) -> bytes:
    """Compact UTF-8 JSON, as an upstream's bytes (pydantic-core's serialiser: a third of json.dumps' time)."""
    return pydantic_core.to_json(payload)


def sse_response(stream: AsyncIterator[str], headers: dict[str, str]) -> StreamingResponse:
    return StreamingResponse(
        stream, media_type="text/event-stream", headers=headers | {"cache-control": "no-cache"}
    )


def sse(payload: dict[str, Any]) -> str:
    return f"data: {json.dumps(payload, separators=(',', ':'))}\n\n"


SSE_DONE = "data: [DONE]\n\n"


def replay_pieces(text: str) -> Iterator[str]:
    """A stored answer cut into stream-sized pieces at word boundaries (the exact text, reassembled)."""
    start = 0
    while start < len(text):
        end = min(len(text), start + REPLAY_CHUNK_CHARS)
        if end < len(text):
            space = text.rfind(" ", start + 1, end)
            end = space if space > start else end
        yield text[start:end]
        start = end
