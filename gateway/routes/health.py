"""Liveness, readiness and Prometheus metrics."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request, Response
from fastapi.responses import JSONResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

router = APIRouter()


@router.get("/healthz")
async def healthz(request: Request) -> dict[str, Any]:
    """Report the components in use; `status` is `ok` when the store answers."""
    state = request.app.state
    store = await state.store.describe()
    generator = state.generator_source
    return {
        "status": "ok" if store["reachable"] else "degraded",
        "backend": state.backend.name,
        "models": state.backend.served_models(),
        "models_mode": state.backend.models_mode,
        "embedder": {
            "name": state.embedder.name,
            "dimension": state.embedder.dimension,
            "runtime": state.embedder.runtime.runtime,
        },
        "verifier": _verifier(state.service.cache.rule),
        "generator": {
            "kind": generator.kind.value,
            "location": generator.location,
            "present": generator.present,
            "weights": _weights(state.backend),
        },
        "store": store,
    }


def _weights(backend: Any) -> dict[str, object] | None:
    """How the engine stores its weights and why (None in reverse-proxy mode)."""
    choice = getattr(backend, "weights", None)
    return None if choice is None else dict(choice.describe())


def _verifier(rule: Any) -> dict[str, str] | None:
    """The verifier's runtime, when the rule has a verifier that says (read by attribute: any rule fits)."""
    choice = getattr(getattr(rule, "verifier", None), "runtime", None)
    if choice is None:
        return None
    return {"name": str(rule.verifier.name), "runtime": choice.runtime, "reason": choice.reason}


@router.get("/readyz")
async def readyz(request: Request) -> JSONResponse:
    """200 while requests can be answered; `degraded` when the cache store is down (answers still flow)."""
    state = request.app.state
    store = await state.store.describe()
    service = state.service
    body = {
        "status": "ready" if store["reachable"] else "degraded",
        "store": "up" if store["reachable"] else "down",
        "pending_generations": service.pending,
        "max_pending": service.max_pending,
        "breakers": {name: breaker.describe() for name, breaker in state.breakers.items()},
        "rate_limiter": "redis" if state.limiter.last_shared else "local",
    }
    return JSONResponse(body, status_code=200)


@router.get("/metrics")
async def metrics(request: Request) -> Response:
    """Prometheus text exposition of the gateway's (and engine's) series."""
    return Response(generate_latest(request.app.state.metrics.registry), media_type=CONTENT_TYPE_LATEST)
