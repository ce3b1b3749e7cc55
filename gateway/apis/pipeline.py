"""The one pipeline every API runs: caller -> body -> refusals -> span -> admission -> controls -> the adapter ->
headers -> metric -> access line. An error anywhere is answered in the API's own shape, and logged and
counted like any other answer.

The API routes are plain Starlette routes (`routes()`), placed before FastAPI's: FastAPI's per-request
machinery (dependency resolution, body and header parameters, the included routers' matching) was a
quarter of an exact hit's CPU. `gateway/http/routes/api_docs.py` declares the same operations for the
OpenAPI schema.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

from fastapi.exceptions import RequestValidationError
from opentelemetry.trace import Span, StatusCode
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from gateway.api.errors import KvgateError, ServerError
from gateway.api.ids import random_hex
from gateway.apis.exchange import Api, Exchange, Reply
from gateway.observability.request_log import log_request
from gateway.traffic.controls import STRICTNESS_HEADER, TAGS_HEADER, parse_cache_control, parse_tags
from gateway.traffic.ratelimit import Admission
from gateway.traffic.tenant_policy import PRIORITY_HEADER

logger = logging.getLogger("kvgate.pipeline")
ERROR = "error"


def endpoint(api: Api[Any]) -> Callable[[Request], Awaitable[Response]]:
    """The Starlette endpoint that runs `api` through the pipeline."""

    async def serve(http: Request) -> Response:
        return await run(api, http)

    return serve


def route(path: str, api: Api[Any], methods: list[str] | None = None) -> Route:
    return Route(path, endpoint(api), methods=methods or ["POST"])


async def run(api: Api[Any], http: Request) -> Response:
    """Answer one request of `api`; every outcome, error or not, gets its metric and access line (inside
    the request's span, when it has one: the line carries the span's ids)."""
    started = time.perf_counter()
    state = http.app.state
    request_id = random_hex(12)
    tenant, model = "-", ""
    try:
        tenant = state.keys.tenant_for(api.credentials(http.headers)).name
        request = await api.parse(http)
        model = api.model(request)
        tracing = state.tracing
        attributes = api.span_attributes(request) if tracing.enabled else {}
        with tracing.completion_span(api.operation, model, attributes) as span:
            try:
                api.check(request, state)
                reply = await _answer(api, http, request, tenant, request_id)
            except Exception as error:  # every error becomes an answer in the API's own shape
                reply = _failed(api, http, error)
            _annotate(span, reply)
            return finish(api, state, reply, request_id, tenant, model, started)
    except Exception as error:  # before the span: the caller or the body
        return finish(api, state, _failed(api, http, error), request_id, tenant, model, started)


def _failed(api: Api[Any], http: Request, error: Exception) -> Reply:
    if isinstance(error, KvgateError):
        return Reply(api.error(error), ERROR)
    if isinstance(error, RequestValidationError):
        return Reply(api.invalid(error), ERROR)
    logger.error("unexpected error on %s %s", http.method, http.url.path, exc_info=error)
    return Reply(api.error(ServerError("The server had an error processing your request.")), ERROR)


def finish(
    api: Api[Any], state: Any, reply: Reply, request_id: str, tenant: str, model: str, started: float
) -> Response:
    """The request id on the answer; its metric and its access line."""
    response = reply.response
    if "x-request-id" not in response.headers:
        response.headers["x-request-id"] = request_id
    _count(state, api.route, reply, started)
    log_request(
        request_id=response.headers["x-request-id"],
        route=api.route,
        tenant=tenant,
        model=model,
        cache=reply.cache,
        status=response.status_code,
        started=started,
        similarity=reply.similarity,
        prompt_tokens=reply.prompt_tokens,
        completion_tokens=reply.completion_tokens,
        prompt=reply.prompt,
    )
    return response


async def _answer(api: Api[Any], http: Request, request: Any, tenant: str, request_id: str) -> Reply:
    """Admission and the request's controls, then the adapter; the rate-limit headers on its answer."""
    limiter = http.app.state.limiter
    headers = http.headers
    admission = Admission(limiter, tenant, api.cost(request, limiter))
    charged = limiter.count_hits or not api.free_hits
    if charged:
        await admission()
    exchange = Exchange(
        http=http,
        request=request,
        tenant=tenant,
        request_id=request_id,
        control=parse_cache_control(headers.get("cache-control"), headers.get(STRICTNESS_HEADER)),
        tags=parse_tags(headers.get(TAGS_HEADER)),
        priority=limiter.policy.priority_for(tenant, headers.get(PRIORITY_HEADER)),
        admission=admission,
        charged=charged,
    )
    reply = await api.serve(exchange)
    reply.response.headers.update(await admission.headers())
    return reply


def _count(state: Any, route: str, reply: Reply, started: float) -> None:
    metrics = state.metrics
    metrics.request_seconds.labels(route, reply.cache).observe(time.perf_counter() - started)
    if reply.cache == ERROR:
        metrics.errors.labels(route, str(reply.response.status_code)).inc()


def _annotate(span: Span, reply: Reply) -> None:
    """The cache result and, when known by now, GenAI usage on the request's span."""
    if not span.is_recording():
        return
    span.set_attribute("kvgate.cache.result", reply.cache)
    if reply.cache == ERROR:
        span.set_status(StatusCode.ERROR, str(reply.response.status_code))
    if reply.similarity is not None:
        span.set_attribute("kvgate.cache.similarity", reply.similarity)
    if reply.prompt_tokens is not None and reply.completion_tokens is not None:
        span.set_attribute("gen_ai.usage.input_tokens", reply.prompt_tokens)
        span.set_attribute("gen_ai.usage.output_tokens", reply.completion_tokens)
    if reply.finish_reason is not None:
        span.set_attribute("gen_ai.response.finish_reasons", [reply.finish_reason])
