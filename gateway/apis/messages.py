"""`POST /v1/messages`: Anthropic's Messages API, through the same cache and flow as chat.

The key comes as `x-api-key` (Anthropic's SDK) or `Authorization: Bearer`. In reverse-proxy mode the request
goes to the upstream's `/messages` as sent, with its `anthropic-version`; with the engine, the engine answers
it (one generation, a second protocol). Every error has Anthropic's shape:
`{"type": "error", "error": {"type", "message"}}`.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any

from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.datastructures import Headers
from starlette.responses import Response

from gateway.answers import chunks_of, sent_whole, text_of
from gateway.api.anthropic_objects import (
    accumulate_message,
    message_events,
    message_from_text,
    plain_text_message,
    storable_message,
)
from gateway.api.errors import InvalidRequest, KvgateError, ServiceUnavailable
from gateway.api.ids import random_hex
from gateway.api.objects import MessagesRequest
from gateway.apis.completion_api import CompletionApi
from gateway.apis.rendering import first_event, json_body, named_sse, named_sse_stream, sse_response
from gateway.backends.protocol import (
    Backend,
    Chunk,
    Finished,
    GenerationEvent,
    GenerationRequest,
    TextDelta,
    Whole,
)
from gateway.service import CachedAnswer, CompletionCall, LiveAnswer

ANTHROPIC_VERSION = "2023-06-01"
JSON = "application/json"
# OpenAI's error types (kvgate's own errors) as Anthropic names them.
ERROR_TYPES = {
    "invalid_request_error": "invalid_request_error",
    "authentication_error": "authentication_error",
    "permission_error": "permission_error",
    "not_found_error": "not_found_error",
    "rate_limit_error": "rate_limit_error",
    "server_error": "api_error",
    "upstream_error": "api_error",
    "service_unavailable": "overloaded_error",
}


class MessagesApi(CompletionApi[MessagesRequest]):
    route = "messages"
    operation = "chat"
    endpoint = "messages"
    body = MessagesRequest
    chat_format = False

    def credentials(self, headers: Headers) -> str | None:
        key = headers.get("x-api-key")
        return headers.get("authorization") or (f"Bearer {key}" if key else None)

    def refuse(self, request: MessagesRequest, backend: Backend) -> None:
        """What the engine cannot honour, refused with a clear 400 (an upstream decides for itself)."""
        if backend.passes_through:
            return
        if request.tools:
            raise InvalidRequest("Tool use is not supported by kvgate's engine.", param="tools")
        for index, message in enumerate(request.messages):
            if isinstance(message.content, list) and any(
                block.get("type") != "text" for block in message.content
            ):
                raise InvalidRequest(
                    "Only text content blocks are supported.", param=f"messages.{index}.content"
                )
        if request.messages[-1].role != "user":
            raise InvalidRequest("The last message must be from the user.", param="messages")

    def upstream_headers(self, headers: Headers, backend: Backend) -> dict[str, str]:
        """Anthropic's version (and beta features), as the client sent them."""
        upstream = {"anthropic-version": headers.get("anthropic-version") or ANTHROPIC_VERSION}
        if beta := headers.get("anthropic-beta"):
            upstream["anthropic-beta"] = beta
        return upstream

    def prompt_characters(self, request: MessagesRequest) -> int:
        return len(request.prompt_text)

    def last_turn(self, request: MessagesRequest) -> str:
        return request.prompt_text

    def storable(self, whole: dict[str, Any], store_truncated: bool) -> tuple[bool, bool]:
        stop_ok = store_truncated or whole.get("stop_reason") != "max_tokens"
        return storable_message(whole) and stop_ok, plain_text_message(whole)

    def plain_text(self, whole: dict[str, Any]) -> bool:
        return plain_text_message(whole)

    def generation(self, call: CompletionCall) -> GenerationRequest:
        request: MessagesRequest = call.request
        system = [{"role": "system", "content": request.system_text}] if request.system_text else []
        messages = system + [{"role": message.role, "content": message.text} for message in request.messages]
        return GenerationRequest(
            request_id=call.request_id,
            tenant=call.tenant,
            model=request.model,
            messages=messages,
            prompt=None,
            max_tokens=request.max_new_tokens,
            temperature=request.temperature,
            top_p=request.top_p,
            seed=None,
            stop=request.stop_strings,
            priority=call.priority,
            body=request.model_dump(exclude_unset=True),
            stream=request.stream,
            path="messages",
            headers=call.upstream_headers,
        )

    def whole_of(self, events: list[GenerationEvent], finished: Finished, model: str) -> dict[str, Any]:
        """The upstream's message, its events folded, or the engine's text as a message."""
        sent = sent_whole(events)
        if sent is not None:
            return sent
        chunks = chunks_of(events)
        if chunks:
            return accumulate_message(chunks)
        return _message(model, text_of(events), finished)

    async def respond(
        self, request: MessagesRequest, answer: CachedAnswer | LiveAnswer, headers: dict[str, str]
    ) -> Response:
        if isinstance(answer, CachedAnswer):
            whole = answer.answer.whole | {"id": "msg_" + random_hex(12)}
            if request.stream:
                return sse_response(named_sse_stream(message_events(whole)), headers)
            return Response(json_body(whole), media_type=JSON, headers=headers)
        events = answer.flight.follow()
        if request.stream:
            first = await first_event(events)
            return sse_response(_live(request, first, events), headers)
        text: list[str] = []
        sent: dict[str, Any] | None = None
        async with contextlib.aclosing(events):
            async for event in events:
                if isinstance(event, Whole):
                    sent = event.payload
                elif isinstance(event, TextDelta):
                    text.append(event.text)
                elif isinstance(event, Finished):
                    whole = sent or _message(request.model, "".join(text), event)
                    return Response(json_body(whole), media_type=JSON, headers=headers)
        raise ServiceUnavailable("The generation ended without finishing.")

    def error(self, error: KvgateError) -> Response:
        return anthropic_error(error.status_code, error.error_type, error.message, error.headers)

    def invalid(self, error: RequestValidationError) -> Response:
        first = error.errors()[0] if error.errors() else {}
        where = ".".join(str(part) for part in first.get("loc", ())[1:])
        message = str(first.get("msg", "invalid value" if where else "invalid body"))
        return anthropic_error(400, "invalid_request_error", f"{where}: {message}" if where else message)


def anthropic_error(
    status: int, error_type: str, message: str, headers: dict[str, str] | None = None
) -> JSONResponse:
    body = {"type": "error", "error": {"type": ERROR_TYPES.get(error_type, error_type), "message": message}}
    return JSONResponse(body, status_code=status, headers=headers)


async def _live(
    request: MessagesRequest, first: GenerationEvent, events: AsyncGenerator[GenerationEvent, None]
) -> AsyncIterator[str]:
    """An upstream's events as they arrive, or the engine's text as Anthropic's events."""
    relayed = isinstance(first, Chunk)
    message_id = "msg_" + random_hex(12)
    async with contextlib.aclosing(events):
        event: GenerationEvent | None = first
        try:
            if not relayed:
                start = _message(request.model, "", None, message_id) | {"content": [], "stop_reason": None}
                yield named_sse({"type": "message_start", "message": start})
                block = {"type": "text", "text": ""}
                yield named_sse({"type": "content_block_start", "index": 0, "content_block": block})
            while event is not None:
                if isinstance(event, Chunk):
                    yield named_sse(event.payload)
                elif isinstance(event, TextDelta) and event.text:
                    delta = {"type": "text_delta", "text": event.text}
                    yield named_sse({"type": "content_block_delta", "index": 0, "delta": delta})
                elif isinstance(event, Finished):
                    if not relayed:  # an upstream's own events carried its end
                        whole = _message(request.model, "", event, message_id)
                        yield named_sse({"type": "content_block_stop", "index": 0})
                        stop = {"stop_reason": whole["stop_reason"], "stop_sequence": None}
                        usage = {"output_tokens": event.completion_tokens}
                        yield named_sse({"type": "message_delta", "delta": stop, "usage": usage})
                        yield named_sse({"type": "message_stop"})
                    break
                event = await anext(events, None)
        except KvgateError as error:
            kind = ERROR_TYPES.get(error.error_type, "api_error")
            yield named_sse({"type": "error", "error": {"type": kind, "message": error.message}})
        except Exception:
            yield named_sse(
                {"type": "error", "error": {"type": "api_error", "message": "The generation failed."}}
            )


def _message(
    model: str, text: str, finished: Finished | None, message_id: str | None = None
) -> dict[str, Any]:
    """The engine's text as Anthropic's message object."""
    return message_from_text(
        model=model,
        text=text,
        finish_reason=finished.finish_reason if finished is not None else "stop",
        input_tokens=finished.prompt_tokens if finished is not None else 0,
        output_tokens=finished.completion_tokens if finished is not None else 0,
        message_id=message_id or "msg_" + random_hex(12),
    )


MESSAGES = MessagesApi()
