"""A reported hit's flow: the pair it names -> veto it (when wrong) -> keep it as a labelled pair -> count it.

    report(request id | entry id, verdict)
        ->  the hit served (`observability/served_hits.py`: kept in Redis for the feedback window)
        ->  claimed: a served hit is reported once
        ->  wrong: `SemanticCache.veto`: the tenant's next identical request is a miss, other tenants keep
            their hits (the veto is in the tenant's scope, in Redis: every worker, after restarts)
        ->  the pair appended to `feedback.jsonl` (`observability/feedback_log.py`), for `kvgate calibrate`
        ->  counted in `/admin/stats` under the tenant, model, route and language of the request

A step that fails (Redis, the file) gives the claim back, so the same report can be sent again (a veto
twice is one veto). Routes call `report`; errors are raised as `api/errors.py` errors.
"""

from __future__ import annotations

import contextlib
import logging
from dataclasses import dataclass

from redis.exceptions import RedisError

from gateway.api.errors import Conflict, InvalidRequest, NotFound, ServiceUnavailable, Unprocessable
from gateway.observability.feedback_log import FeedbackLog, Verdict
from gateway.observability.served_hits import ServedHit, ServedHits
from gateway.observability.stats import HitStats
from semantic import SemanticCache, language_of

logger = logging.getLogger("kvgate.feedback")


@dataclass(frozen=True, slots=True)
class FeedbackReceipt:
    """What a report did: which hit it named and whether that pair is now vetoed."""

    request_id: str
    entry_id: str
    tenant: str
    verdict: Verdict
    vetoed: bool


class FeedbackService:
    """Turns reports on served semantic hits into vetoes, labelled pairs and counts."""

    def __init__(self, cache: SemanticCache, hits: ServedHits, log: FeedbackLog, stats: HitStats) -> None:
        self.cache = cache
        self.hits = hits
        self.log = log
        self.stats = stats

    async def report(
        self,
        verdict: Verdict,
        *,
        request_id: str | None = None,
        entry_id: str | None = None,
        tenant: str | None = None,
    ) -> FeedbackReceipt:
        """Report the hit served under `request_id` (else the latest served from `entry_id`); `tenant`, when
        given, must be the one it was served to."""
        if request_id is None and entry_id is None:
            raise InvalidRequest(
                "Name the hit you report: its request_id (the x-request-id header of the answer) or its "
                "entry_id (the x-kvgate-entry-id header).",
                param="request_id",
                code="missing_required_parameter",
            )
        try:
            hit = await self._find(request_id, entry_id, tenant)
            if not await self.hits.claim(hit.request_id):
                raise Conflict(
                    f"The hit served under request {hit.request_id} was already reported.",
                    code="already_reported",
                )
            await self._apply(hit, verdict)
        except (RedisError, OSError) as error:
            logger.error("a %s report was not recorded: %s", verdict, error)
            raise ServiceUnavailable(
                "The report could not be recorded (the cache store or the feedback file is unavailable); "
                "send it again."
            ) from error
        scope = hit.scope
        self.stats.record_feedback(
            scope.tenant, scope.model, scope.endpoint, language_of(scope.prompt), verdict
        )
        return FeedbackReceipt(hit.request_id, hit.entry_id, hit.tenant, verdict, vetoed=verdict == "wrong")

    async def _find(self, request_id: str | None, entry_id: str | None, tenant: str | None) -> ServedHit:
        hit = await self.hits.find(request_id, entry_id)
        if hit is None or (tenant is not None and hit.tenant != tenant):
            named = f"request {request_id}" if request_id is not None else f"entry {entry_id}"
            raise NotFound(
                f"No semantic hit served under {named} is known{f' for tenant {tenant}' if tenant else ''}: "
                "only semantic hits (and wordings remembered from them) can be reported, within "
                f"{self.hits.window_ms / 1000:g} s of being served.",
                param="request_id" if request_id is not None else "entry_id",
                code="hit_not_found",
            )
        if entry_id is not None and hit.entry_id != entry_id:
            raise Unprocessable(
                f"Request {hit.request_id} was served entry {hit.entry_id}, not {entry_id}.",
                param="entry_id",
                code="entry_mismatch",
            )
        return hit

    async def _apply(self, hit: ServedHit, verdict: Verdict) -> None:
        """Veto the pair (when wrong) and keep it; on a failure the claim is given back, so that the same
        report may be sent again."""
        try:
            if verdict == "wrong":
                await self.cache.veto(hit.scope, hit.entry_id, hit.entry_key)
            await self.log.append(
                stored=hit.entry_prompt,
                asked=hit.scope.prompt,
                verdict=verdict,
                tenant=hit.tenant,
                request_id=hit.request_id,
                entry_id=hit.entry_id,
            )
        except Exception:
            with contextlib.suppress(RedisError):
                await self.hits.release(hit.request_id)
            raise
