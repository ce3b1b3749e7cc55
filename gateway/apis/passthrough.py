"""Any other `/v1/` path the operator lists (`KVGATE_PASSTHROUGH_PATHS`) goes to the upstream unchanged.

Reverse-proxy mode only. The body streams up and the answer streams back as sent (status, body, content
type); nothing is cached, and the request counts as `bypass`. A tenant's key is required as on every route;
the upstream sees kvgate's own upstream key, so a path that stores or fetches objects would let tenants reach
each other's: such paths pass only when listed (see the setting).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import httpx
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, StreamingResponse
from starlette.datastructures import Headers
from starlette.requests import Request
from starlette.responses import Response

from gateway.api.errors import KvgateError, MethodNotAllowed, NotFound, validation_error_body
from gateway.apis.exchange import Exchange, Reply
from gateway.backends.upstream import UpstreamBackend
from gateway.fleet.backend import FleetBackend
from gateway.observability.stats import NO_LANGUAGE
from gateway.service import CompletionService
from gateway.traffic.ratelimit import RateLimiter

METHODS = ["GET", "POST", "PUT", "PATCH", "DELETE"]
# kvgate's own routes: another method on them is a 405, as without this route, never a pass-through.
OWN_PATHS = frozenset({"chat/completions", "completions", "responses", "embeddings", "models", "messages"})
# What travels on besides the body: how to read it, and what the client accepts.
FORWARDED_HEADERS = ("content-type", "accept", "openai-beta", "idempotency-key")
RETURNED_HEADERS = ("content-type", "content-disposition", "openai-processing-ms", "x-request-id")


@dataclass(frozen=True, slots=True)
class Forwarded:
    """A pass-through request: where it goes; its body streams on unread."""

    method: str
    path: str


def listed(path: str, paths: str) -> bool:
    """`path` is one of the comma-separated `paths`, or under one of them."""
    path = path.strip("/")
    for entry in (item.strip().strip("/") for item in paths.split(",")):
        if entry and (path == entry or path.startswith(entry + "/")):
            return True
    return False


class PassthroughApi:
    route = "passthrough"
    operation = "passthrough"
    free_hits = False

    def credentials(self, headers: Headers) -> str | None:
        return headers.get("authorization")

    async def parse(self, http: Request) -> Forwarded:
        return Forwarded(http.method, http.path_params["path"])

    def model(self, request: Forwarded) -> str:
        return ""

    def check(self, request: Forwarded, state: Any) -> None:
        if request.path.strip("/") in OWN_PATHS:
            raise MethodNotAllowed(f"Method {request.method} is not allowed on /v1/{request.path}.")
        upstream = state.service.backend
        if not isinstance(upstream, UpstreamBackend | FleetBackend) or not listed(
            request.path, state.settings.passthrough_paths
        ):
            raise NotFound(f"Unknown path /v1/{request.path}.", code="unknown_url")

    def span_attributes(self, request: Forwarded) -> dict[str, Any]:
        return {}

    def cost(self, request: Forwarded, limiter: RateLimiter) -> int:
        return 1

    async def serve(self, exchange: Exchange[Forwarded]) -> Reply:
        """Pass the request to the upstream as sent, and its answer back as sent."""
        http, request = exchange.http, exchange.request
        service: CompletionService = exchange.state.service
        upstream: UpstreamBackend | FleetBackend = service.backend  # type: ignore[assignment]  # `check` made sure
        headers = {name: value for name in FORWARDED_HEADERS if (value := http.headers.get(name)) is not None}
        answer = await upstream.forward(request.method, request.path, http.url.query, headers, http.stream())
        service.stats.record(exchange.tenant, "", "bypass", 0, 0.0, route="passthrough")
        service.metrics.requests.labels("passthrough", exchange.tenant, "", "bypass").inc()
        service.metrics.requests_by_language.labels(NO_LANGUAGE, "bypass").inc()
        reply = {name: value for name in RETURNED_HEADERS if (value := answer.headers.get(name)) is not None}
        reply["x-kvgate-cache"] = "bypass"
        return Reply(
            StreamingResponse(_body(answer), status_code=answer.status_code, headers=reply), "bypass"
        )

    def error(self, error: KvgateError) -> Response:
        return JSONResponse(error.body(), status_code=error.status_code, headers=error.headers)

    def invalid(self, error: RequestValidationError) -> Response:
        return JSONResponse(validation_error_body(error), status_code=400)


async def _body(answer: httpx.Response) -> AsyncIterator[bytes]:
    try:
        async for piece in answer.aiter_raw():
            yield piece
    finally:
        with contextlib.suppress(Exception):
            await answer.aclose()


PASSTHROUGH = PassthroughApi()
