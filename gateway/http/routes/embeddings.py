"""`POST /v1/embeddings`: answered per input, from the cache where an input was seen (`gateway/embeddings.py`)."""

from __future__ import annotations

import json
import time

from fastapi import APIRouter, Request, Response

from gateway.api.objects import EmbeddingRequest
from gateway.embeddings import EmbeddingsCall, EmbeddingsService
from gateway.http.deps import CurrentTenant
from gateway.observability.request_log import log_request
from gateway.traffic.controls import STRICTNESS_HEADER, TAGS_HEADER, parse_cache_control, parse_tags
from gateway.traffic.ratelimit import Admission, RateLimiter

router = APIRouter(prefix="/v1")
CACHED_INPUTS_HEADER = "x-kvgate-cached-inputs"


@router.post("/embeddings")
async def embeddings(request: EmbeddingRequest, tenant: CurrentTenant, http: Request) -> Response:
    """Create embeddings (float or base64), each input from the cache when it was seen before. Headers:
    `Cache-Control`, `x-kvgate-tags`; the answer says `x-kvgate-cached-inputs: cached/total`."""
    state = http.app.state
    service: EmbeddingsService = state.embeddings
    limiter: RateLimiter = state.limiter
    started = time.perf_counter()
    characters = sum(len(item) if isinstance(item, str) else len(item) * 4 for item in request.inputs)
    admission = Admission(limiter, tenant.name, characters // 4 + 1)
    await admission()
    call = EmbeddingsCall(
        request,
        tenant.name,
        parse_cache_control(http.headers.get("cache-control"), http.headers.get(STRICTNESS_HEADER)),
        parse_tags(http.headers.get(TAGS_HEADER)),
    )
    answer = await service.answer(call)
    headers = {
        "x-kvgate-cache": answer.result.replace("_", "-"),
        CACHED_INPUTS_HEADER: f"{answer.cached}/{answer.total}",
        "x-request-id": call.request_id,
    } | await admission.headers()
    metrics = service.completions.metrics
    metrics.request_seconds.labels("embeddings", headers["x-kvgate-cache"]).observe(
        time.perf_counter() - started
    )
    log_request(
        request_id=call.request_id,
        route="embeddings",
        tenant=call.tenant,
        model=request.model,
        cache=headers["x-kvgate-cache"],
        status=200,
        started=started,
        similarity=None,
        prompt_tokens=None,
        completion_tokens=None,
        prompt=None,
    )
    body = json.dumps(answer.whole, separators=(",", ":")).encode()
    return Response(body, media_type="application/json", headers=headers)
