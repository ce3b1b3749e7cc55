"""Chat and legacy completions answered as OpenAI does: a stored object replayed (JSON, or as the chunks of a
stream), an upstream's own JSON or chunks relayed as sent, or the engine's text rendered."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncGenerator, AsyncIterator, Iterator
from typing import Any

from starlette.responses import Response

from gateway.answers import usage_of
from gateway.api.chunks import accumulate_chat, accumulate_text, chat_chunks, text_chunks
from gateway.api.errors import KvgateError, ServiceUnavailable
from gateway.api.objects import ChatCompletionRequest, CompletionRequest, FinishReason
from gateway.apis.rendering import SSE_DONE, Renderer, first_event, json_body, sse, sse_response
from gateway.backends.protocol import Chunk, Finished, GenerationEvent, TextDelta, Whole
from gateway.service import CachedAnswer, LiveAnswer

JSON = "application/json"


async def respond(
    request: ChatCompletionRequest | CompletionRequest,
    answer: CachedAnswer | LiveAnswer,
    headers: dict[str, str],
    *,
    chat: bool,
) -> Response:
    renderer = Renderer(chat=chat, model=request.model)
    if isinstance(answer, CachedAnswer):
        # The stored object as the backend sent it; only what is per response is new.
        replayed = answer.answer.whole | {"id": renderer.id, "created": renderer.created}
        if request.stream:
            unfold = chat_chunks if chat else text_chunks
            return sse_response(_replay(unfold(replayed, request.include_usage_in_stream)), headers)
        return Response(json_body(replayed), media_type=JSON, headers=headers)
    events = answer.flight.follow()
    if request.stream:
        first = await first_event(events)  # errors before the first token are plain HTTP errors
        return sse_response(_live(renderer, first, events, request.include_usage_in_stream), headers)
    text: list[str] = []
    chunks: list[dict[str, Any]] = []  # the engine's answer as chunks: choices, logprobs, tool calls
    sent: dict[str, Any] | None = None
    async with contextlib.aclosing(events):
        async for event in events:
            if isinstance(event, Whole):
                sent = event.payload  # answered once stored: `Finished` is published after the store
            elif isinstance(event, Chunk):
                chunks.append(event.payload)
            elif isinstance(event, Finished):
                if sent is None and chunks:
                    sent = accumulate_chat(chunks) if chat else accumulate_text(chunks)
                if sent is not None:
                    return Response(json_body(sent), media_type=JSON, headers=headers)
                body = renderer.whole("".join(text), _finish(event.finish_reason), usage_of(event))
                return Response(body, media_type=JSON, headers=headers)
            elif isinstance(event, TextDelta):
                text.append(event.text)
    raise ServiceUnavailable("The generation ended without finishing.")


async def _live(
    renderer: Renderer,
    first: GenerationEvent,
    events: AsyncGenerator[GenerationEvent, None],
    include_usage: bool,
) -> AsyncIterator[str]:
    """A live stream: an upstream's chunks as they arrive (its usage only to a client that asked for it),
    or the engine's text rendered chunk by chunk."""
    relayed = isinstance(first, Chunk)
    if not relayed:
        opening = renderer.opening_chunk()
        if opening:
            yield opening
    async with contextlib.aclosing(events):
        event: GenerationEvent | None = first
        try:
            while event is not None:
                if isinstance(event, Chunk):
                    chunk = _as_asked(event.payload, include_usage)
                    if chunk is not None:
                        yield sse(chunk)
                elif isinstance(event, Finished):
                    if not relayed:  # an upstream's own chunks carried its finish and usage
                        yield renderer.finish_chunk(_finish(event.finish_reason))
                        if include_usage:
                            yield renderer.usage_chunk(usage_of(event))
                    break
                elif isinstance(event, TextDelta) and event.text:
                    yield renderer.text_chunk(event.text)
                event = await anext(events, None)
        except KvgateError as error:
            yield sse(error.body())
        except Exception:
            yield sse(ServiceUnavailable("The generation failed.").body())
    yield SSE_DONE


async def _replay(chunks: Iterator[dict[str, Any]]) -> AsyncIterator[str]:
    for chunk in chunks:
        yield sse(chunk)
    yield SSE_DONE


def _as_asked(chunk: dict[str, Any], include_usage: bool) -> dict[str, Any] | None:
    """An upstream chunk as the client would have had it: kvgate asks every stream for its usage, so a client
    that did not gets neither the usage chunk nor the `usage` fields the upstream adds to the others."""
    if include_usage or "usage" not in chunk:
        return chunk
    if not chunk.get("choices"):
        return None
    return {name: value for name, value in chunk.items() if name != "usage"}


def _finish(reason: str) -> FinishReason:
    """The engine's finish reasons, as its renderer knows them."""
    return "length" if reason == "length" else "stop"
