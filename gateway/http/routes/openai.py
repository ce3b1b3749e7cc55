"""OpenAI-compatible routes: chat completions, legacy completions, models."""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncGenerator, AsyncIterator, Iterator
from typing import Any

from fastapi import APIRouter, Request, Response
from opentelemetry.trace import Span
from starlette.routing import Route

from gateway.answers import usage_of
from gateway.api.chunks import accumulate_chat, accumulate_text, chat_chunks, text_chunks
from gateway.api.errors import InvalidRequest, KvgateError, ServiceUnavailable
from gateway.api.objects import (
    ChatCompletionRequest,
    CompletionRequest,
    FinishReason,
    ModelCard,
    ModelList,
    ResponsesRequest,
)
from gateway.api.response_objects import response_events
from gateway.backends.protocol import Chunk, Finished, GenerationEvent, TextDelta, Whole
from gateway.http.deps import CurrentTenant, ServiceDep
from gateway.http.rendering import (
    SSE_DONE,
    Renderer,
    first_event,
    json_body,
    named_sse,
    named_sse_stream,
    sse,
    sse_response,
)
from gateway.http.request_body import parse_body
from gateway.observability.request_log import log_request
from gateway.observability.tracing import Tracing
from gateway.service import CachedAnswer, CompletionCall, CompletionService, LiveAnswer
from gateway.traffic.controls import STRICTNESS_HEADER, TAGS_HEADER, parse_cache_control, parse_tags
from gateway.traffic.limits import refuse_unsupported
from gateway.traffic.ratelimit import Admission, RateLimiter
from gateway.traffic.tenant_policy import PRIORITY_HEADER
from semantic.cache import CacheControl

router = APIRouter(prefix="/v1")
OpenAIRequestBody = ChatCompletionRequest | CompletionRequest | ResponsesRequest
JSON = "application/json"


# The completion routes are where cache hits are served, so they run without FastAPI's per-request machinery
# (dependency resolution, body and header parameters, the included routers' matching: a quarter of an
# exact hit's CPU). `served_routes()` are plain Starlette routes placed first in the app; the two APIRoutes
# below declare the same operations for the OpenAPI schema and the docs, and are never reached by a POST.
@router.post("/chat/completions")
async def chat_completions(request: ChatCompletionRequest, tenant: CurrentTenant, http: Request) -> Response:
    """Create a chat completion (JSON or SSE), from the cache when it can. Headers: `Cache-Control`,
    `x-kvgate-semantic-strictness`, `x-kvgate-tags`, `x-kvgate-priority`."""
    return await _complete(request, tenant.name, http)


@router.post("/completions")
async def completions(request: CompletionRequest, tenant: CurrentTenant, http: Request) -> Response:
    """Create a legacy text completion (JSON or SSE), from the cache when it can (same headers as chat)."""
    return await _complete(request, tenant.name, http)


@router.post("/responses")
async def responses(request: ResponsesRequest, tenant: CurrentTenant, http: Request) -> Response:
    """Create a response (the Responses API; JSON or SSE events) in reverse-proxy mode: a stateless request
    is cached as chat is; one naming `previous_response_id` or a `conversation` passes through uncached."""
    return await _complete(request, tenant.name, http)


def served_routes() -> list[Route]:
    """The completion routes as requests meet them: the caller first (a bad key is refused before the body
    is read), then the body, then the same `_complete` as the APIRoutes."""

    def endpoint(
        model: type[ChatCompletionRequest] | type[CompletionRequest] | type[ResponsesRequest],
    ) -> Any:
        async def serve(http: Request) -> Response:
            tenant = http.app.state.keys.tenant_for(http.headers.get("authorization"))
            return await _complete(await parse_body(http, model), tenant.name, http)

        return serve

    return [
        Route("/v1/chat/completions", endpoint(ChatCompletionRequest), methods=["POST"]),
        Route("/v1/completions", endpoint(CompletionRequest), methods=["POST"]),
        Route("/v1/responses", endpoint(ResponsesRequest), methods=["POST"]),
    ]


@router.get("/models")
async def models(service: ServiceDep, tenant: CurrentTenant) -> ModelList:
    """List the models this gateway answers to."""
    created = int(service.stats.started)
    return ModelList(data=[ModelCard(id=name, created=created) for name in service.backend.served_models()])


async def _complete(request: OpenAIRequestBody, tenant: str, http: Request) -> Response:
    state = http.app.state
    service: CompletionService = state.service
    limiter: RateLimiter = state.limiter
    tracing: Tracing = state.tracing
    headers = http.headers
    with tracing.completion_span(_operation(request), request.model, _span_request(request)) as span:
        started = time.perf_counter()
        if isinstance(request, ResponsesRequest) and not service.backend.passes_through:
            raise InvalidRequest(
                "The Responses API is served in reverse-proxy mode (KVGATE_UPSTREAM_URL); use chat completions.",
                code="unsupported_endpoint",
            )
        if not service.backend.passes_through:  # an upstream decides for itself what it serves
            refuse_unsupported(request)
        admission = Admission(limiter, tenant, limiter.estimate_tokens(request))
        if limiter.count_hits:
            await admission()
        control = parse_cache_control(headers.get("cache-control"), headers.get(STRICTNESS_HEADER))
        if isinstance(request, ResponsesRequest) and request.stateful:  # the upstream holds its state
            control = CacheControl(bypass=True, no_store=True)
        call = CompletionCall(
            request,
            tenant,
            control,
            parse_tags(headers.get(TAGS_HEADER)),
            priority=limiter.policy.priority_for(tenant, headers.get(PRIORITY_HEADER)),
            admit=None if limiter.count_hits else admission,
        )
        answer = await service.answer(call)
        reply_headers = _cache_headers(answer) | {"x-request-id": call.request_id} | await admission.headers()
        response = await _respond(request, answer, reply_headers)
        route = _route(request)
        cache = reply_headers["x-kvgate-cache"]
        service.metrics.request_seconds.labels(route, cache).observe(time.perf_counter() - started)
        _log(service, call, answer, route, cache, response.status_code, started)
        _annotate(span, answer, cache)
        return response


def _operation(request: OpenAIRequestBody) -> str:
    if isinstance(request, ResponsesRequest):
        return "responses"
    return "chat" if isinstance(request, ChatCompletionRequest) else "text_completion"


def _route(request: OpenAIRequestBody) -> str:
    if isinstance(request, ResponsesRequest):
        return "responses"
    return "chat" if isinstance(request, ChatCompletionRequest) else "completions"


def _span_request(request: OpenAIRequestBody) -> dict[str, Any]:
    return {
        "max_tokens": request.max_new_tokens,
        "temperature": request.temperature,
        "top_p": request.top_p,
        "seed": request.seed,
    }


def _annotate(span: Span, answer: CachedAnswer | LiveAnswer, cache: str) -> None:
    """GenAI usage attributes (when known by now) and the cache result on the request's span."""
    span.set_attribute("kvgate.cache.result", cache)
    if answer.lookup is not None and answer.lookup.similarity is not None:
        span.set_attribute("kvgate.cache.similarity", answer.lookup.similarity)
    if isinstance(answer, CachedAnswer):
        usage = (answer.answer.prompt_tokens, answer.answer.completion_tokens, answer.answer.finish_reason)
    else:
        finished = answer.flight.finished
        if finished is None:
            return  # a live stream: usage is not known when the headers go out
        usage = (finished.prompt_tokens, finished.completion_tokens, finished.finish_reason)
    span.set_attribute("gen_ai.usage.input_tokens", usage[0])
    span.set_attribute("gen_ai.usage.output_tokens", usage[1])
    span.set_attribute("gen_ai.response.finish_reasons", [usage[2]])


def _log(
    service: CompletionService,
    call: CompletionCall,
    answer: CachedAnswer | LiveAnswer,
    route: str,
    cache: str,
    status: int,
    started: float,
) -> None:
    """One structured line per request; tokens are known unless a live stream is still running."""
    lookup = answer.lookup
    if isinstance(answer, CachedAnswer):
        tokens: tuple[int | None, int | None] = (answer.answer.prompt_tokens, answer.answer.completion_tokens)
    else:
        finished = answer.flight.finished
        tokens = (finished.prompt_tokens, finished.completion_tokens) if finished else (None, None)
    log_request(
        request_id=call.request_id,
        route=route,
        tenant=call.tenant,
        model=call.request.model,
        cache=cache,
        status=status,
        started=started,
        similarity=lookup.similarity if lookup is not None else None,
        prompt_tokens=tokens[0],
        completion_tokens=tokens[1],
        prompt=service.prompt_for_log(call),
    )


async def _respond(
    request: OpenAIRequestBody, answer: CachedAnswer | LiveAnswer, headers: dict[str, str]
) -> Response:
    if isinstance(request, ResponsesRequest):
        return await _respond_responses(request, answer, headers)
    chat = isinstance(request, ChatCompletionRequest)
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


async def _respond_responses(
    request: ResponsesRequest, answer: CachedAnswer | LiveAnswer, headers: dict[str, str]
) -> Response:
    """A Responses answer: the stored response as it was (its id too: the entry is this tenant's own, and a
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


def _cache_headers(answer: CachedAnswer | LiveAnswer) -> dict[str, str]:
    if isinstance(answer, LiveAnswer):
        headers = {"x-kvgate-cache": answer.result.replace("_", "-")}
        if answer.shadowed:
            headers["x-kvgate-shadow"] = "semantic-hit"
        return headers
    lookup = answer.lookup
    headers = {"x-kvgate-cache": lookup.kind.value.replace("_", "-")}
    if lookup.entry is not None:
        headers["x-kvgate-entry-id"] = lookup.entry.entry_id
    if lookup.kind.value == "semantic_hit" and lookup.similarity is not None:
        headers["x-kvgate-similarity"] = f"{lookup.similarity:.4f}"
    return headers


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
