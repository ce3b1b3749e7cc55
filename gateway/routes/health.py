"""Liveness: which embedder, generator and store this process is using."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request

router = APIRouter()


@router.get("/healthz")
async def healthz(request: Request) -> dict[str, Any]:
    """Report the components in use; `status` is `ok` when the store answers."""
    state = request.app.state
    store = await state.store.describe()
    generator = state.generator_source
    return {
        "status": "ok" if store["reachable"] else "degraded",
        "embedder": {"name": state.embedder.name, "dimension": state.embedder.dimension},
        "generator": {
            "kind": generator.kind.value,
            "location": generator.location,
            "present": generator.present,
        },
        "store": store,
    }
