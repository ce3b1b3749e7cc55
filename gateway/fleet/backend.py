"""A fleet behind the `Backend` protocol: the service and the pipeline see one backend, as before.

    generate(request)  the pool serving its model (none: 404 `model_not_found`) -> its route (pool.py)
                       -> try members in order until one begins answering (failover.py says which failures
                          go on, to the next member at once); when every member has failed it, back off
                          and go round again while the connect deadline allows (a pool of one behaves as
                          the single upstream does: refused connections retried for a second)
                       -> `Routed(member)` (the response's `x-kvgate-backend`), then the member's events
                          as it sent them; an error after the first event ends the answer (a stream's last
                          event is an error, never a truncated success)
                       -> counted: latency, errors, tokens and reused tokens per member; its health; what
                          routing learns; a copy to the pool's shadow members

`KVGATE_UPSTREAM_URL` with one URL never builds this (gateway/http/app.py keeps the single upstream), so
one URL behaves exactly as before fleets existed.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from typing import Any

import httpx
from prometheus_client import CollectorRegistry

from gateway.api.errors import NotFound, ServiceUnavailable
from gateway.backends.protocol import Chunk, Finished, GenerationEvent, GenerationRequest, Routed, Whole
from gateway.backends.upstream_retry import Attempts, RetryPolicy
from gateway.fleet.canary import ShadowMirror
from gateway.fleet.config import FleetConfig
from gateway.fleet.failover import Failure, classify, transport_cause
from gateway.fleet.fleet import Fleet, FleetOptions
from gateway.fleet.member import Member
from gateway.fleet.metrics import FleetCollector, MemberRow
from gateway.fleet.pool import Pool, Route


class FleetBackend:
    """Misses answered by pools of upstream servers."""

    name = "fleet"
    passes_through = True
    models_mode = "fleet"

    def __init__(self, config: FleetConfig, options: FleetOptions) -> None:
        self.fleet = Fleet(config, options)
        self.options = options
        self._shadow = ShadowMirror()

    async def start(self) -> None:
        await self.fleet.start()

    async def close(self) -> None:
        await self._shadow.close()
        await self.fleet.close()

    async def generate(self, request: GenerationRequest) -> AsyncIterator[GenerationEvent]:
        pool = self._pool(request.model)
        route = pool.route(request)
        attempts = RetryPolicy(self.options.connect_budget_s).start(replayable=not request.stream)
        tried: set[str] = set()
        error: Exception | None = None
        while True:
            member = next((member for member in route.members if member.name not in tried), None)
            if member is None:  # every member failed it before answering: a back-off, then again
                await _back_off(attempts, error, pool)
                tried.clear()
                route = pool.route(request)
                continue
            tried.add(member.name)
            pool.sent(member, route)
            events = member.client.generate(member.request_for(request))
            started = time.monotonic()
            member.began()
            try:
                first = await anext(events)
                break
            except Exception as failed:
                member.ended()
                failure = classify(failed)
                _account(member, started, failure, ended=True)
                pool.failed(member, route)  # it computed nothing of this prompt
                if not failure.may_fail_over(stream=request.stream):
                    raise
                member.stats.failovers += 1
                error = failed
            except BaseException:  # the client left while it waited: nothing to say of the member
                member.ended()
                _account(member, started, None, ended=False)
                raise
        async for event in self._relay(pool, route, member, request, first, events, started):
            yield event

    async def embed(self, body: dict[str, Any]) -> dict[str, Any]:
        """An embeddings request on the least-loaded member of its model's pool (idempotent: a member
        that fails before answering hands it to the next)."""
        pool = self._pool(str(body.get("model")))
        members = sorted(_routable(pool), key=lambda member: member.in_flight / member.share)
        for index, member in enumerate(members):
            started = time.monotonic()
            member.began()
            try:
                model = member.spec.model
                answer = await member.client.embed(body | {"model": model} if model else body)
            except Exception as failed:
                failure = classify(failed)
                _account(member, started, failure, ended=True)
                if index + 1 == len(members) or not failure.may_fail_over(stream=False):
                    raise
                member.stats.failovers += 1
                continue
            finally:
                member.ended()
            _account(member, started, None, ended=True)
            return answer
        raise _no_backend(pool)

    async def forward(
        self, method: str, path: str, query: str, headers: dict[str, str], body: AsyncIterator[bytes]
    ) -> httpx.Response:
        """A pass-through path (`KVGATE_PASSTHROUGH_PATHS`) on the least-loaded member of the first pool:
        these requests name no model, and their body streams on unread, so they are never sent twice."""
        members = _routable(self.fleet.pools[0]) if self.fleet.pools else []
        if not members:
            raise ServiceUnavailable(
                "No backend is available.", code="no_backend", headers={"Retry-After": "1"}
            )
        member = min(members, key=lambda member: member.in_flight / member.share)
        return await member.client.forward(method, path, query, headers, body)

    async def abort(self, request_id: str) -> None:
        return None  # closing the member's stream (the flight leaving the generator) is how HTTP aborts

    def served_models(self) -> list[str]:
        return self.fleet.models()

    def serves_model(self, model: str) -> bool:
        return self.fleet.pool_for(model) is not None

    def max_context_tokens(self) -> int | None:
        return None

    def register_metrics(self, registry: CollectorRegistry) -> None:
        """Export the per-backend series (gateway/fleet/metrics.py) on the gateway's registry."""
        registry.register(FleetCollector(self._rows))

    def fleet_status(self) -> dict[str, Any]:
        """Every pool and member (`/healthz`, `/admin/stats`, `kvgate report`)."""
        return {
            "source": self.fleet.config.source,
            "pools": [
                {
                    "name": pool.name,
                    "routing": pool.spec.routing,
                    "models": pool.listed_models(),
                    "backends": [member.describe() for member in pool.everyone],
                }
                for pool in self.fleet.pools
            ],
        }

    def readiness(self) -> str:
        """`up` while every pool has a member in rotation, else `degraded` (`/readyz`'s `upstream`)."""
        return "up" if all(_routable(pool, panic=False) for pool in self.fleet.pools) else "degraded"

    # --- private ------------------------------------------------------------------------------------------

    def _pool(self, model: str) -> Pool:
        pool = self.fleet.pool_for(model)
        if pool is None:
            raise NotFound(f"The model '{model}' does not exist.", param="model", code="model_not_found")
        return pool

    async def _relay(
        self,
        pool: Pool,
        route: Route,
        member: Member,
        request: GenerationRequest,
        first: GenerationEvent,
        events: AsyncIterator[GenerationEvent],
        started: float,
    ) -> AsyncIterator[GenerationEvent]:
        """The chosen member's events, counted; its health, reuse and shadows once it ends."""
        finished: Finished | None = None
        failure: Failure | None = None
        usage: dict[str, Any] = {}
        served: list[GenerationEvent] = []
        keep = bool(pool.shadows)
        try:
            yield Routed(member.name)
            event: GenerationEvent | None = first
            while event is not None:
                if isinstance(event, Finished):
                    finished = event
                elif isinstance(event, Whole | Chunk):
                    usage = _reported_usage(event.payload) or usage
                if keep:
                    served.append(event)
                yield event
                event = await anext(events, None)
        except Exception as failed:
            failure = classify(failed)
            raise
        finally:
            with contextlib.suppress(Exception):
                await events.aclose()  # type: ignore[attr-defined]
            member.ended()
            _account(member, started, failure, ended=finished is not None or failure is not None)
            if finished is not None and failure is None:
                cached = _cached_tokens(usage)
                member.stats.record_tokens(finished.prompt_tokens, cached)
                pool.finished(
                    member, route, finished.prompt_tokens, cached if member.stats.reports_cache else None
                )
                self._shadow.mirror(pool.shadows, request, served)

    def _rows(self) -> list[MemberRow]:
        return [
            MemberRow(pool.name, member.name, member.stats, member.health.routable, member.health.ejections)
            for pool in self.fleet.pools
            for member in pool.everyone
        ]


def _account(member: Member, started: float, failure: Failure | None, *, ended: bool) -> None:
    """One attempt's latency and outcome in the member's counters and health (`ended`: it ran to its end
    or its error; a client that left says nothing of the member's health)."""
    failed = failure is not None and failure.members_fault
    member.stats.record(time.monotonic() - started, failed=failed)
    if failed:
        member.health.record_failure()
    elif failure is None and ended:
        member.health.record_success()


async def _back_off(attempts: Attempts, error: Exception | None, pool: Pool) -> None:
    """Wait before trying the pool's members again, or raise the last failure when the request's connect
    deadline (or the one-second budget for refused connections) is spent."""
    if error is None:
        raise _no_backend(pool)
    cause = transport_cause(error)
    wait = attempts.backoff_s(cause) if cause is not None else None
    if wait is None:
        raise error
    await asyncio.sleep(wait)


def _routable(pool: Pool, *, panic: bool = True) -> list[Member]:
    """The pool's members in rotation (with `panic`, all of them when none is)."""
    live = [member for member in pool.members if not member.draining]
    routable = [member for member in live if member.health.routable]
    return routable or (live if panic else [])


def _no_backend(pool: Pool) -> ServiceUnavailable:
    return ServiceUnavailable(
        f"No backend of the '{pool.name}' pool is available.", code="no_backend", headers={"Retry-After": "1"}
    )


def _reported_usage(payload: dict[str, Any]) -> dict[str, Any] | None:
    """What a payload says of its prompt: OpenAI's usage, or llama-server's timings."""
    found: dict[str, Any] = {}
    usage = payload.get("usage")
    if isinstance(usage, dict):
        found["usage"] = usage
    timings = payload.get("timings")
    if isinstance(timings, dict):
        found["timings"] = timings
    return found or None


def _cached_tokens(reported: dict[str, Any]) -> int | None:
    """Reused prompt tokens, as the backend said (None: it did not say)."""
    details = (reported.get("usage") or {}).get("prompt_tokens_details")
    if isinstance(details, dict) and details.get("cached_tokens") is not None:
        return int(details["cached_tokens"])
    timings = reported.get("timings") or {}
    if timings.get("cache_n") is not None:
        return int(timings["cache_n"])
    return None
