"""OpenAI-compatible routes: chat completions, legacy completions, models."""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Annotated, Any

from fastapi import APIRouter, Header, Response
from fastapi.responses import JSONResponse, StreamingResponse
from opentelemetry.trace import Span

from gateway.backend import Finished, GenerationEvent
from gateway.controls import STRICTNESS_HEADER, TAGS_HEADER, parse_cache_control, parse_tags
from gateway.deps import CurrentTenant, LimiterDep, ServiceDep, TracingDep
from gateway.errors import KvgateError, ServiceUnavailable
from gateway.limits import refuse_unsupported
from gateway.protocol import ChatCompletionRequest, CompletionRequest, FinishReason, ModelCard, ModelList
from gateway.ratelimit import Admission, RateLimiter
from gateway.rendering import SSE_DONE, Renderer, replay_pieces, sse
from gateway.request_log import log_request
from gateway.service import AnyRequest, CachedAnswer, CompletionCall, CompletionService, LiveAnswer, usage_of
from gateway.tenant_policy import PRIORITY_HEADER

router = APIRouter(prefix="/v1")

CacheControlHeader = Annotated[str | None, Header(alias="cache-control")]
StrictnessHeader = Annotated[str | None, Header(alias=STRICTNESS_HEADER)]
TagsHeader = Annotated[str | None, Header(alias=TAGS_HEADER)]
PriorityHeader = Annotated[str | None, Header(alias=PRIORITY_HEADER)]


@router.post("/chat/completions")
async def chat_completions(
    request: ChatCompletionRequest,
    service: ServiceDep,
    tenant: CurrentTenant,
    tracing: TracingDep,
    limiter: LimiterDep,
    cache_control: CacheControlHeader = None,
    strictness: StrictnessHeader = None,
    tags: TagsHeader = None,
    priority: PriorityHeader = None,
) -> Response:
    """Create a chat completion (JSON or SSE), from the cache when it can."""
    with tracing.completion_span(_operation(request), request.model, _span_request(request)) as span:
        return await _complete(
            service, limiter, request, tenant.name, cache_control, strictness, tags, priority, span
        )


@router.post("/completions")
async def completions(
    request: CompletionRequest,
    service: ServiceDep,
    tenant: CurrentTenant,
    tracing: TracingDep,
    limiter: LimiterDep,
    cache_control: CacheControlHeader = None,
    strictness: StrictnessHeader = None,
    tags: TagsHeader = None,
    priority: PriorityHeader = None,
) -> Response:
    """Create a legacy text completion (JSON or SSE), from the cache when it can."""
    with tracing.completion_span(_operation(request), request.model, _span_request(request)) as span:
        return await _complete(
            service, limiter, request, tenant.name, cache_control, strictness, tags, priority, span
        )


@router.get("/models")
async def models(service: ServiceDep, tenant: CurrentTenant) -> ModelList:
    """List the models this gateway answers to."""
    created = int(service.stats.started)
    return ModelList(data=[ModelCard(id=name, created=created) for name in service.backend.served_models()])


async def _complete(
    service: CompletionService,
    limiter: RateLimiter,
    request: AnyRequest,
    tenant: str,
    cache_control: str | None,
    strictness: str | None,
    tags: str | None,
    priority: str | None,
    span: Span,
) -> Response:
    started = time.perf_counter()
    refuse_unsupported(request)
    admission = Admission(limiter, tenant, limiter.estimate_tokens(request))
    if limiter.count_hits:
        await admission()
    call = CompletionCall(
        request,
        tenant,
        parse_cache_control(cache_control, strictness),
        parse_tags(tags),
        priority=limiter.policy.priority_for(tenant, priority),
        admit=None if limiter.count_hits else admission,
    )
    answer = await service.answer(call)
    headers = _cache_headers(answer) | {"x-request-id": call.request_id} | await admission.headers()
    response = await _respond(request, answer, headers)
    route = "chat" if isinstance(request, ChatCompletionRequest) else "completions"
    service.metrics.request_seconds.labels(route, headers["x-kvgate-cache"]).observe(
        time.perf_counter() - started
    )
    _log(service, call, answer, route, headers["x-kvgate-cache"], response.status_code, started)
    _annotate(span, answer, headers["x-kvgate-cache"])
    return response


def _operation(request: AnyRequest) -> str:
    return "chat" if isinstance(request, ChatCompletionRequest) else "text_completion"


def _span_request(request: AnyRequest) -> dict[str, Any]:
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
    request: AnyRequest, answer: CachedAnswer | LiveAnswer, headers: dict[str, str]
) -> Response:
    renderer = Renderer(chat=isinstance(request, ChatCompletionRequest), model=request.model)
    if isinstance(answer, CachedAnswer):
        if request.stream:
            return _sse_response(_replay(renderer, answer, request.include_usage_in_stream), headers)
        stored = answer.answer
        body = renderer.whole(stored.text, _finish(stored.finish_reason), stored.usage())
        return JSONResponse(body, headers=headers)
    events = answer.flight.follow()
    if request.stream:
        first = await _first_event(events)  # errors before the first token are plain HTTP errors
        return _sse_response(_live(renderer, first, events, request.include_usage_in_stream), headers)
    text: list[str] = []
    async with contextlib.aclosing(events):
        async for event in events:
            if isinstance(event, Finished):
                body = renderer.whole("".join(text), event.finish_reason, usage_of(event))
                return JSONResponse(body, headers=headers)
            text.append(event.text)
    raise ServiceUnavailable("The generation ended without finishing.")


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


async def _first_event(events: AsyncGenerator[GenerationEvent, None]) -> GenerationEvent:
    try:
        return await anext(events)
    except StopAsyncIteration as ended:
        await events.aclose()
        raise ServiceUnavailable("The generation ended without output.") from ended
    except BaseException:
        await events.aclose()
        raise


async def _live(
    renderer: Renderer,
    first: GenerationEvent,
    events: AsyncGenerator[GenerationEvent, None],
    include_usage: bool,
) -> AsyncIterator[str]:
    opening = renderer.opening_chunk()
    if opening:
        yield opening
    async with contextlib.aclosing(events):
        event: GenerationEvent | None = first
        try:
            while event is not None:
                if isinstance(event, Finished):
                    yield renderer.finish_chunk(event.finish_reason)
                    if include_usage:
                        yield renderer.usage_chunk(usage_of(event))
                    break
                if event.text:
                    yield renderer.text_chunk(event.text)
                event = await anext(events, None)
        except KvgateError as error:
            yield sse(error.body())
        except Exception:
            yield sse(ServiceUnavailable("The generation failed.").body())
    yield SSE_DONE


async def _replay(renderer: Renderer, answer: CachedAnswer, include_usage: bool) -> AsyncIterator[str]:
    stored = answer.answer
    opening = renderer.opening_chunk()
    if opening:
        yield opening
    for piece in replay_pieces(stored.text):
        yield renderer.text_chunk(piece)
    yield renderer.finish_chunk(_finish(stored.finish_reason))
    if include_usage:
        yield renderer.usage_chunk(stored.usage())
    yield SSE_DONE


def _sse_response(stream: AsyncIterator[str], headers: dict[str, str]) -> StreamingResponse:
    return StreamingResponse(
        stream, media_type="text/event-stream", headers=headers | {"cache-control": "no-cache"}
    )


def _finish(reason: str) -> FinishReason:
    return "length" if reason == "length" else "stop"
