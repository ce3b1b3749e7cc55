"""`POST /v1/embeddings`: answered per input, from the cache where an input was seen (`gateway/embeddings.py`).
The answer says `x-kvgate-cached-inputs: cached/total`."""

from __future__ import annotations

import json
from typing import Any

from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.datastructures import Headers
from starlette.requests import Request
from starlette.responses import Response

from gateway.api.errors import KvgateError, validation_error_body
from gateway.api.objects import EmbeddingRequest
from gateway.apis.exchange import Exchange, Reply
from gateway.apis.request_body import parse_body
from gateway.embeddings import EmbeddingsCall, EmbeddingsService
from gateway.traffic.ratelimit import RateLimiter

CACHED_INPUTS_HEADER = "x-kvgate-cached-inputs"


class EmbeddingsApi:
    route = "embeddings"
    operation = "embeddings"
    free_hits = False  # every input costs, stored or not

    def credentials(self, headers: Headers) -> str | None:
        return headers.get("authorization")

    async def parse(self, http: Request) -> EmbeddingRequest:
        return await parse_body(http, EmbeddingRequest)

    def model(self, request: EmbeddingRequest) -> str:
        return request.model

    def check(self, request: EmbeddingRequest, state: Any) -> None:
        """Nothing up front: the model and the inputs are checked by the service, per mode."""

    def span_attributes(self, request: EmbeddingRequest) -> dict[str, Any]:
        return {"encoding_formats": [request.encoding_format] if request.encoding_format else None}

    def cost(self, request: EmbeddingRequest, limiter: RateLimiter) -> int:
        characters = sum(len(item) if isinstance(item, str) else len(item) * 4 for item in request.inputs)
        return characters // 4 + 1

    async def serve(self, exchange: Exchange[EmbeddingRequest]) -> Reply:
        service: EmbeddingsService = exchange.state.embeddings
        call = EmbeddingsCall(
            exchange.request, exchange.tenant, exchange.control, exchange.tags, exchange.request_id
        )
        answer = await service.answer(call)
        cache = answer.result.replace("_", "-")
        headers = {"x-kvgate-cache": cache, CACHED_INPUTS_HEADER: f"{answer.cached}/{answer.total}"}
        body = json.dumps(answer.whole, separators=(",", ":")).encode()
        response = Response(body, media_type="application/json", headers=headers)
        return Reply(response, cache)

    def error(self, error: KvgateError) -> Response:
        return JSONResponse(error.body(), status_code=error.status_code, headers=error.headers)

    def invalid(self, error: RequestValidationError) -> Response:
        return JSONResponse(validation_error_body(error), status_code=400)


EMBEDDINGS = EmbeddingsApi()
