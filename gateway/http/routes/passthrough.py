"""Any other `/v1/` path the operator lists (`KVGATE_PASSTHROUGH_PATHS`) goes to the upstream unchanged.

Reverse-proxy mode only. The body streams up and the answer streams back as sent (status, body, content
type); nothing is cached, and the request counts as `bypass`. A tenant's key is required as on every route;
the upstream sees kvgate's own upstream key, so a path that stores or fetches objects would let tenants reach
each other's: such paths pass only when listed (see the setting).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator

import httpx
from fastapi import APIRouter, Request, Response
from fastapi.responses import StreamingResponse

from gateway.api.errors import MethodNotAllowed, NotFound
from gateway.backends.upstream import UpstreamBackend
from gateway.http.deps import CurrentTenant
from gateway.observability.request_log import log_request
from gateway.observability.stats import NO_LANGUAGE
from gateway.service import CompletionService
from gateway.traffic.ratelimit import Admission, RateLimiter

router = APIRouter(prefix="/v1")
METHODS = ["GET", "POST", "PUT", "PATCH", "DELETE"]
# kvgate's own routes: another method on them is a 405, as without this route, never a pass-through.
OWN_PATHS = frozenset({"chat/completions", "completions", "responses", "embeddings", "models", "messages"})
# What travels on besides the body: how to read it, and what the client accepts.
FORWARDED_HEADERS = ("content-type", "accept", "openai-beta", "idempotency-key")
RETURNED_HEADERS = ("content-type", "content-disposition", "openai-processing-ms", "x-request-id")


def listed(path: str, paths: str) -> bool:
    """`path` is one of the comma-separated `paths`, or under one of them."""
    path = path.strip("/")
    for entry in (item.strip().strip("/") for item in paths.split(",")):
        if entry and (path == entry or path.startswith(entry + "/")):
            return True
    return False


@router.api_route("/{path:path}", methods=METHODS, include_in_schema=False)
async def passthrough(path: str, tenant: CurrentTenant, http: Request) -> Response:
    """Pass a listed path to the upstream as sent, and its answer back as sent."""
    state = http.app.state
    service: CompletionService = state.service
    upstream = service.backend
    if path.strip("/") in OWN_PATHS:
        raise MethodNotAllowed(f"Method {http.method} is not allowed on /v1/{path}.")
    if not isinstance(upstream, UpstreamBackend) or not listed(path, state.settings.passthrough_paths):
        raise NotFound(f"Unknown path /v1/{path}.", code="unknown_url")
    limiter: RateLimiter = state.limiter
    admission = Admission(limiter, tenant.name, 1)
    await admission()
    started = time.perf_counter()
    headers = {name: value for name in FORWARDED_HEADERS if (value := http.headers.get(name)) is not None}
    answer = await upstream.forward(http.method, path, http.url.query, headers, http.stream())
    service.stats.record(tenant.name, "", "bypass", 0, 0.0, route="passthrough")
    service.metrics.requests.labels("passthrough", tenant.name, "", "bypass").inc()
    service.metrics.requests_by_language.labels(NO_LANGUAGE, "bypass").inc()
    reply = {name: value for name in RETURNED_HEADERS if (value := answer.headers.get(name)) is not None}
    reply |= {"x-kvgate-cache": "bypass"} | await admission.headers()
    log_request(
        request_id=answer.headers.get("x-request-id", ""),
        route="passthrough",
        tenant=tenant.name,
        model="",
        cache="bypass",
        status=answer.status_code,
        started=started,
    )
    return StreamingResponse(_body(answer), status_code=answer.status_code, headers=reply)


async def _body(answer: httpx.Response) -> AsyncIterator[bytes]:
    try:
        async for piece in answer.aiter_raw():
            yield piece
    finally:
        with contextlib.suppress(Exception):
            await answer.aclose()
