"""Operator endpoints behind the admin token: purge entries, report served hits, read hit-rate statistics."""

from __future__ import annotations

import logging
from typing import Any, Literal

from fastapi import APIRouter, Request
from pydantic import BaseModel, ConfigDict, Field

from gateway.api.errors import InvalidRequest
from gateway.api.objects import ChatCompletionRequest, CompletionRequest
from gateway.apis.chat import CHAT
from gateway.apis.completion_api import CompletionApi
from gateway.apis.completions import COMPLETIONS
from gateway.http.deps import AdminCaller, FeedbackDep, ServiceDep
from gateway.http.routes.health import current_registry
from gateway.observability.report_stats import prefix_cache, rule_summary, similarity_histogram
from gateway.service import CompletionCall
from semantic import PurgeSelector

router = APIRouter(prefix="/admin")
logger = logging.getLogger("kvgate.admin")


class PurgeRequest(BaseModel):
    """Every selector given must match; at least one is required (there is no 'purge everything')."""

    model_config = ConfigDict(extra="forbid")

    entry_id: str | None = Field(default=None, max_length=128)
    tenant: str | None = Field(default=None, max_length=64)
    model: str | None = Field(default=None, max_length=256)
    tag: str | None = Field(default=None, max_length=64)
    older_than_s: float | None = Field(default=None, ge=0)
    scope_id: str | None = Field(default=None, max_length=128)
    scope_of: dict[str, Any] | None = None
    """A chat or completions request body: purge everything in its scope (needs `tenant`)."""


class PurgeResult(BaseModel):
    purged: int


@router.post("/purge")
async def purge(body: PurgeRequest, service: ServiceDep, caller: AdminCaller) -> PurgeResult:
    """Delete the entries matching the selectors, on every replica; returns how many went."""
    scope_id = body.scope_id
    if body.scope_of is not None:
        if body.tenant is None:
            raise InvalidRequest(
                "Purging by scope_of needs the tenant the request belongs to.", param="tenant"
            )
        request, kind = _parse_request(body.scope_of)
        scope_id = service.scope_of(CompletionCall(request, body.tenant, kind)).scope_id
    try:
        selector = PurgeSelector(
            entry_id=body.entry_id,
            scope_id=scope_id,
            tenant=body.tenant,
            model=body.model,
            tag=body.tag,
            older_than_s=body.older_than_s,
        )
    except ValueError as error:
        raise InvalidRequest(str(error)) from error
    purged = await service.cache.purge(selector)
    logger.info(
        "purge by %s: %s -> %d entries",
        caller,
        body.model_dump(exclude_none=True, exclude={"scope_of"}),
        purged,
    )
    return PurgeResult(purged=purged)


class FeedbackRequest(BaseModel):
    """A served hit judged by a person: named by the headers of its answer (`x-request-id`, or
    `x-kvgate-entry-id` for the latest hit served from that entry)."""

    model_config = ConfigDict(extra="forbid")

    request_id: str | None = Field(default=None, min_length=1, max_length=128)
    entry_id: str | None = Field(default=None, min_length=1, max_length=128)
    verdict: Literal["wrong", "right"]
    tenant: str | None = Field(default=None, min_length=1, max_length=64)
    """When given, the hit must have been served to this tenant."""


class FeedbackResult(BaseModel):
    request_id: str
    entry_id: str
    tenant: str
    verdict: Literal["wrong", "right"]
    vetoed: bool
    """True when that entry will not be served for that wording again (in that tenant's scope)."""


@router.post("/feedback")
async def feedback(body: FeedbackRequest, reports: FeedbackDep, caller: AdminCaller) -> FeedbackResult:
    """Report a served semantic hit wrong (never served again for that wording) or right; kept as a
    labelled pair in the data dir's feedback.jsonl for `kvgate calibrate`."""
    receipt = await reports.report(
        body.verdict, request_id=body.request_id, entry_id=body.entry_id, tenant=body.tenant
    )
    logger.info(
        "feedback by %s: %s on request %s (tenant %s, entry %s)",
        caller,
        receipt.verdict,
        receipt.request_id,
        receipt.tenant,
        receipt.entry_id,
    )
    return FeedbackResult(
        request_id=receipt.request_id,
        entry_id=receipt.entry_id,
        tenant=receipt.tenant,
        verdict=receipt.verdict,
        vetoed=receipt.vetoed,
    )


@router.get("/stats")
async def stats(
    request: Request, service: ServiceDep, caller: AdminCaller, tenant: str | None = None
) -> dict[str, Any]:
    """Hit rates (exact, semantic, miss) overall, per tenant and per model; last hour and since start.
    With `--workers N`, every worker's traffic."""
    state = request.app.state
    registry = await current_registry(state)
    hits, shadow, workers = service.stats, service.shadow, None
    if state.peers is not None:
        cluster = await state.peers.stats()
        hits, shadow = cluster.stats, cluster.shadow
        workers = {"count": cluster.workers, "answered": cluster.answered}
    return hits.report(tenant) | {
        "similarity": similarity_histogram(registry),
        "rule": rule_summary(service.cache.rule),
        "prefix_cache": prefix_cache(registry),
        "shadow": shadow.report() | {"enabled": service.shadow_mode},
        "workers": workers,
        "backends": _backends(state.backend),
    }


def _backends(backend: Any) -> dict[str, Any] | None:
    """The fleet's pools and backends, with their counters (None: one backend, no fleet)."""
    status = getattr(backend, "fleet_status", None)
    return None if status is None else dict(status())


def _parse_request(
    body: dict[str, Any],
) -> tuple[ChatCompletionRequest | CompletionRequest, CompletionApi[Any]]:
    """A chat request (it has `messages`) or a legacy completion, and its adapter."""
    try:
        if "messages" in body:
            return ChatCompletionRequest.model_validate(body), CHAT
        return CompletionRequest.model_validate(body), COMPLETIONS
    except ValueError as error:
        raise InvalidRequest(f"scope_of is not a valid request: {error}", param="scope_of") from error
