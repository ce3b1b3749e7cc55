"""Liveness, readiness and Prometheus metrics."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request, Response
from fastapi.responses import JSONResponse
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from gateway.traffic.breaker import BreakerState

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
        "semantic_languages": _semantic_languages(state.service.cache.rule),
        "multilingual": _multilingual(state.service.cache),
        "generator": {
            "kind": generator.kind.value,
            "location": generator.location,
            "present": generator.present,
            "weights": _weights(state.backend),
        },
        "store": store,
        "workers": _workers(state),
        "fleet": _fleet(state.backend),
    }


def _fleet(backend: Any) -> dict[str, Any] | None:
    """Every pool and backend (state, in flight, ejections) when misses go to a fleet (gateway/fleet/)."""
    status = getattr(backend, "fleet_status", None)
    return None if status is None else dict(status())


def _workers(state: Any) -> dict[str, int] | None:
    """With `kvgate serve --workers N`: how many, and which one answered (None in a single process)."""
    if state.peers is None:
        return None
    return {"count": state.peers.workers, "this": state.worker}


def _engine(backend: Any) -> str | None:
    """`up` or `down` (misses answer 503 while the engine process restarts); None in reverse-proxy mode."""
    available = getattr(backend, "available", None)
    return None if available is None else ("up" if available else "down")


def _weights(backend: Any) -> dict[str, object] | None:
    """How the engine stores its weights and why (None in reverse-proxy mode)."""
    choice = getattr(backend, "weights", None)
    return None if choice is None else dict(choice.describe())


def _semantic_languages(rule: Any) -> list[str] | None:
    """The languages whose prompts may get semantic hits (the calibration's); other prompts get exact hits
    only. None: a rule that compares prompts in any language (read by attribute: any rule fits)."""
    languages = getattr(rule, "languages", None)
    return None if languages is None else list(languages)


def _multilingual(cache: Any) -> dict[str, object] | None:
    """What judges prompts in the languages beside English: their embedder, verifier and languages (None
    when the served rule has no multilingual part; read by attribute: any rule and embedder fit)."""
    rule = getattr(getattr(cache.rule, "multilingual", None), "verifier", None)
    embedder = getattr(cache.embedder, "multilingual", None)
    if rule is None or embedder is None:
        return None
    return {
        "languages": list(cache.rule.multilingual.languages),
        "embedder": {"name": embedder.name, "dimension": embedder.dimension},
        "verifier": _multilingual_verifier(rule),
    }


def _multilingual_verifier(verifier: Any) -> dict[str, Any]:
    """Its name, and where it runs once loaded: it loads with the first pair it judges."""
    choice = getattr(verifier, "runtime", None)
    if choice is None:
        return {"name": str(verifier.name), "loaded": False, "runtime": None}
    return {"name": str(verifier.name), "loaded": True, "runtime": choice.runtime, "reason": choice.reason}


def _verifier(rule: Any) -> dict[str, str] | None:
    """The verifier's runtime, when the rule has a verifier that says (read by attribute: any rule fits)."""
    choice = getattr(getattr(rule, "verifier", None), "runtime", None)
    if choice is None:
        return None
    return {"name": str(rule.verifier.name), "runtime": choice.runtime, "reason": choice.reason}


@router.get("/readyz")
async def readyz(request: Request) -> JSONResponse:
    """200 while requests can be answered; `degraded` when the cache store is down (answers still flow) or
    the upstream's breaker is not closed (hits still flow, misses get a fast 503); `engine` and `upstream`
    say whether misses can reach the engine or the upstream now.

    Still 200 when degraded: a readiness probe that failed whenever a shared dependency did would take
    every replica out of rotation at once, and with them the cache hits they can still serve.
    """
    state = request.app.state
    store = await state.store.describe()
    service = state.service
    upstream = _upstream(state)
    healthy = store["reachable"] and upstream in (None, "up")
    body = {
        "status": "ready" if healthy else "degraded",
        "store": "up" if store["reachable"] else "down",
        "upstream": upstream,
        "pending_generations": service.pending,
        "max_pending": service.max_pending,
        "breakers": {name: breaker.describe() for name, breaker in state.breakers.items()},
        "rate_limiter": "redis" if state.limiter.last_shared else "local",
        "engine": _engine(state.backend),
    }
    return JSONResponse(body, status_code=200)


def _upstream(state: Any) -> str | None:
    """`up`, or the upstream breaker's state while it is not closed (`open`, `half_open`); None in engine
    mode."""
    if not state.settings.reverse_proxy:
        return None
    readiness = getattr(state.backend, "readiness", None)  # a fleet: every pool has a member in rotation
    if readiness is not None:
        return str(readiness())
    breaker = state.breakers["upstream"].state
    return "up" if breaker is BreakerState.CLOSED else str(breaker.value)


@router.get("/metrics")
async def metrics(request: Request) -> Response:
    """Prometheus text exposition of the gateway's (and engine's) series; with workers, all of theirs."""
    registry = await current_registry(request.app.state)
    return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)


async def current_registry(state: Any) -> CollectorRegistry:
    """The registry to expose, with this worker's gauges and the engine process's series read now."""
    refresh_engine = getattr(state.backend, "refresh_metrics", None)
    if refresh_engine is not None:
        await refresh_engine()
    state.metrics.refresh()
    registry: CollectorRegistry = state.metrics.scrape
    return registry
