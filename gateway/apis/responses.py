"""`POST /v1/responses`: OpenAI's Responses API, in reverse-proxy mode. A stateless request is cached as chat
is (its `input`, when it is one text, is the compared prompt); one naming `previous_response_id` or a
`conversation` passes through uncached: the upstream holds its state."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any

from starlette.responses import Response

from gateway.answers import chunks_of, sent_whole
from gateway.api.errors import InvalidRequest, KvgateError, ServiceUnavailable
from gateway.api.objects import ResponsesRequest
from gateway.api.response_objects import (
    completed_response,
    plain_text_response,
    response_events,
    storable_response,
)
from gateway.apis.completion_api import CompletionApi
from gateway.apis.openai_generation import openai_generation
from gateway.apis.rendering import first_event, json_body, named_sse, named_sse_stream, sse_response
from gateway.backends.protocol import Backend, Chunk, Finished, GenerationEvent, GenerationRequest, Whole
from gateway.service import CachedAnswer, CompletionCall, LiveAnswer
from semantic import CacheControl

JSON = "application/json"


class ResponsesApi(CompletionApi[ResponsesRequest]):
    route = "responses"
    operation = "responses"
    endpoint = "responses"
    body = ResponsesRequest
    chat_format = False

    def refuse(self, request: ResponsesRequest, backend: Backend) -> None:
        if not backend.passes_through:
            raise InvalidRequest(
                "The Responses API is served in reverse-proxy mode (KVGATE_UPSTREAM_URL); use chat completions.",
                code="unsupported_endpoint",
            )

    def control(self, request: ResponsesRequest, control: CacheControl) -> CacheControl:
        return CacheControl(bypass=True, no_store=True) if request.stateful else control

    def scope_body(self, request: ResponsesRequest) -> tuple[dict[str, Any], str | None]:
        """Its input is the compared text, when it is one text."""
        body = request.model_dump(exclude_unset=True)
        one_text = isinstance(request.input, str)
        body["prompt"] = body.pop("input") if one_text else request.prompt_text
        return body, None if one_text else "input is not one text"

    def prompt_characters(self, request: ResponsesRequest) -> int:
        return len(request.prompt_text)

    def last_turn(self, request: ResponsesRequest) -> str:
        return request.prompt_text

    def storable(self, whole: dict[str, Any], store_truncated: bool) -> tuple[bool, bool]:
        return storable_response(whole), plain_text_response(whole)

    def plain_text(self, whole: dict[str, Any]) -> bool:
        return plain_text_response(whole)

    def generation(self, call: CompletionCall) -> GenerationRequest:
        return openai_generation(call, call.request, path="responses")

    def whole_of(self, events: list[GenerationEvent], finished: Finished, model: str) -> dict[str, Any]:
        """The upstream's object, or a stream's last event's (`response.completed` carries it)."""
        return sent_whole(events) or completed_response(chunks_of(events)) or {}

    async def respond(
        self, request: ResponsesRequest, answer: CachedAnswer | LiveAnswer, headers: dict[str, str]
    ) -> Response:
        """The stored response as it was (its id too: the entry is this tenant's own, and a
        `previous_response_id` naming it reaches what the upstream stored for this tenant), or the upstream's
        own JSON or events as they arrive."""
        if isinstance(answer, CachedAnswer):
            if request.stream:
                return sse_response(named_sse_stream(iter(response_events(answer.answer.whole))), headers)
            return Response(answer.answer.whole_json.encode(), media_type=JSON, headers=headers)  # as stored
        events = answer.flight.follow()
        if request.stream:
            first = await first_event(events)
            return sse_response(_relayed_events(first, events), headers)
        sent: dict[str, Any] | None = None
        async with contextlib.aclosing(events):
            async for event in events:
                if isinstance(event, Whole):
                    sent = event.payload
                elif isinstance(event, Finished) and sent is not None:
                    return Response(json_body(sent), media_type=JSON, headers=headers)
        raise ServiceUnavailable("The generation ended without finishing.")


async def _relayed_events(
    first: GenerationEvent, events: AsyncGenerator[GenerationEvent, None]
) -> AsyncIterator[str]:
    async with contextlib.aclosing(events):
        event: GenerationEvent | None = first
        try:
            while event is not None and not isinstance(event, Finished):
                if isinstance(event, Chunk):
                    yield named_sse(event.payload)
                event = await anext(events, None)
        except KvgateError as error:
            yield named_sse({"type": "error", **error.body()["error"]})
        except Exception:
            yield named_sse({"type": "error", **ServiceUnavailable("The generation failed.").body()["error"]})


RESPONSES = ResponsesApi()
