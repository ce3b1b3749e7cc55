"""Anthropic's `POST /v1/messages`: the same cache and flow as chat, Anthropic's objects, events and errors.

The key comes as `x-api-key` (Anthropic's SDK) or `Authorization: Bearer`. In reverse-proxy mode the request
goes to the upstream's `/messages` as sent, with its `anthropic-version`; with the engine, the engine answers
it (one generation, a second protocol). Every error on this route has Anthropic's shape:
`{"type": "error", "error": {"type", "message"}}`.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any

from fastapi import APIRouter, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse

from gateway.api.anthropic_objects import message_events, message_from_text
from gateway.api.errors import InvalidRequest, KvgateError, ServiceUnavailable
from gateway.api.ids import random_hex
from gateway.api.objects import MessagesRequest
from gateway.backends.protocol import Chunk, Finished, GenerationEvent, TextDelta, Whole
from gateway.http.rendering import first_event, json_body, named_sse, named_sse_stream, sse_response
from gateway.http.request_body import parse_body
from gateway.observability.request_log import log_request
from gateway.service import CachedAnswer, CompletionCall, CompletionService, LiveAnswer
from gateway.traffic.controls import STRICTNESS_HEADER, TAGS_HEADER, parse_cache_control, parse_tags
from gateway.traffic.ratelimit import Admission, RateLimiter

router = APIRouter(prefix="/v1")
ANTHROPIC_VERSION = "2023-06-01"
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


@router.post("/messages")
async def messages(http: Request) -> Response:
    """Create a message (Anthropic's Messages API; JSON or SSE events), from the cache when it can."""
    try:
        return await _messages(http)
    except KvgateError as error:
        return anthropic_error(error.status_code, error.error_type, error.message, error.headers)
    except RequestValidationError as error:
        first = error.errors()[0] if error.errors() else {}
        where = ".".join(str(part) for part in first.get("loc", ())[1:])
        message = (
            f"{where}: {first.get('msg', 'invalid value')}"
            if where
            else str(first.get("msg", "invalid body"))
        )
        return anthropic_error(400, "invalid_request_error", message)


async def _messages(http: Request) -> Response:
    state = http.app.state
    service: CompletionService = state.service
    limiter: RateLimiter = state.limiter
    key = http.headers.get("x-api-key")
    tenant = state.keys.tenant_for(
        http.headers.get("authorization") or (f"Bearer {key}" if key else None)
    ).name
    request = await parse_body(http, MessagesRequest)
    started = time.perf_counter()
    if not service.backend.passes_through:
        _refuse_for_engine(request)
    admission = Admission(limiter, tenant, limiter.estimate_tokens(request))
    if limiter.count_hits:
        await admission()
    version = http.headers.get("anthropic-version") or ANTHROPIC_VERSION
    upstream_key = getattr(service.backend, "api_key", None)
    upstream_headers = {"anthropic-version": version} | ({"x-api-key": upstream_key} if upstream_key else {})
    if beta := http.headers.get("anthropic-beta"):
        upstream_headers["anthropic-beta"] = beta
    call = CompletionCall(
        request,
        tenant,
        parse_cache_control(http.headers.get("cache-control"), http.headers.get(STRICTNESS_HEADER)),
        parse_tags(http.headers.get(TAGS_HEADER)),
        admit=None if limiter.count_hits else admission,
        upstream_headers=upstream_headers,
    )
    answer = await service.answer(call)
    cache = _cache_result(answer)
    headers = {"x-kvgate-cache": cache, "x-request-id": call.request_id} | await admission.headers()
    if isinstance(answer, CachedAnswer) and answer.lookup.entry is not None:
        headers["x-kvgate-entry-id"] = answer.lookup.entry.entry_id
    response = await _respond(request, answer, headers)
    service.metrics.request_seconds.labels("messages", cache).observe(time.perf_counter() - started)
    log_request(
        request_id=call.request_id,
        route="messages",
        tenant=tenant,
        model=request.model,
        cache=cache,
        status=response.status_code,
        started=started,
        similarity=answer.lookup.similarity if answer.lookup is not None else None,
    )
    return response


def anthropic_error(
    status: int, error_type: str, message: str, headers: dict[str, str] | None = None
) -> JSONResponse:
    body = {"type": "error", "error": {"type": ERROR_TYPES.get(error_type, error_type), "message": message}}
    return JSONResponse(body, status_code=status, headers=headers)


def _refuse_for_engine(request: MessagesRequest) -> None:
    """What the engine cannot honour, refused with a clear 400 (as `traffic/limits.py` does for chat)."""
    if request.tools:
        raise InvalidRequest("Tool use is not supported by kvgate's engine.", param="tools")
    for index, message in enumerate(request.messages):
        if isinstance(message.content, list) and any(
            block.get("type") != "text" for block in message.content
        ):
            raise InvalidRequest("Only text content blocks are supported.", param=f"messages.{index}.content")
    if request.messages[-1].role != "user":
        raise InvalidRequest("The last message must be from the user.", param="messages")


def _cache_result(answer: CachedAnswer | LiveAnswer) -> str:
    kind = answer.lookup.kind.value if isinstance(answer, CachedAnswer) else answer.result
    return kind.replace("_", "-")


async def _respond(
    request: MessagesRequest, answer: CachedAnswer | LiveAnswer, headers: dict[str, str]
) -> Response:
    if isinstance(answer, CachedAnswer):
        whole = answer.answer.whole | {"id": "msg_" + random_hex(12)}
        if request.stream:
            return sse_response(named_sse_stream(message_events(whole)), headers)
        return Response(json_body(whole), media_type="application/json", headers=headers)
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
                whole = sent or _from_engine(request, "".join(text), event)
                return Response(json_body(whole), media_type="application/json", headers=headers)
    raise ServiceUnavailable("The generation ended without finishing.")


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
                start = _from_engine(request, "", None, message_id) | {"content": [], "stop_reason": None}
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
                        whole = _from_engine(request, "", event, message_id)
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


def _from_engine(
    request: MessagesRequest, text: str, finished: Finished | None, message_id: str | None = None
) -> dict[str, Any]:
    return message_from_text(
        model=request.model,
        text=text,
        finish_reason=finished.finish_reason if finished is not None else "stop",
        input_tokens=finished.prompt_tokens if finished is not None else 0,
        output_tokens=finished.completion_tokens if finished is not None else 0,
        message_id=message_id or "msg_" + random_hex(12),
    )
