"""The request flow, top to bottom: scope -> exact layer -> semantic layer -> backend -> store.

    answer():   which model  ->  scope (semantic.store.scope)  ->  cache lookup (exact, then semantic)
                -> hit: a `CachedAnswer` (a semantic one is remembered: its wording becomes an exact hit;
                   the pair is kept for the feedback window, so that it can be reported: `feedback.py`)
                -> miss: join the identical generation already in flight, or start one (bounded)
    on finish:  store the answer if it is complete and the client allowed it: the whole object the backend
                sent (`StoredAnswer`), never an error, a refusal or a content-filtered answer; an answer that
                is not plain text (tool calls, logprobs, several choices) serves the same request only

What differs per API (the scope's body, the generation, what may be stored) is the call's `kind`: its
adapter in `gateway/apis/`. The cache fails open (`fail_open.py`): a store that is down never fails a request.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any, Protocol

from gateway.answers import StoredAnswer
from gateway.api.chunks import answer_text
from gateway.api.errors import InvalidRequest, NotFound, RateLimited
from gateway.api.ids import random_hex
from gateway.backends.protocol import Backend, Finished, GenerationEvent, GenerationRequest
from gateway.fail_open import FailOpenCache
from gateway.observability.metrics import GatewayMetrics
from gateway.observability.outcomes import record_outcome
from gateway.observability.served_hits import ServedHit
from gateway.observability.shadow import ShadowStats
from gateway.observability.stats import HitStats
from gateway.traffic.coalescing import Flight
from semantic import CacheControl, CacheEntry, Lookup, LookupKind, RequestScope, SemanticCache, build_scope


class RequestKind(Protocol):
    """What the flow needs of one API: its adapter (`gateway/apis/`)."""

    @property
    def endpoint(self) -> str | None:
        """The scope's endpoint (None: chat or completions, read from the body)."""
        ...

    def scope_body(self, request: Any) -> tuple[dict[str, Any], str | None]:
        """The body the scope is built from, and why it may not hit semantically (None: it may)."""
        ...

    def generation(self, call: CompletionCall) -> GenerationRequest: ...

    def storable(self, whole: dict[str, Any], store_truncated: bool) -> tuple[bool, bool]:
        """(may the answer be stored, may it serve a reworded request)."""
        ...

    def whole_of(self, events: list[GenerationEvent], finished: Finished, model: str) -> dict[str, Any]:
        """The whole response object a finished generation adds up to (empty: it never completed)."""
        ...

    def stored(self, raw: str, model: str) -> StoredAnswer: ...


@dataclass(frozen=True, slots=True)
class CompletionCall:
    """One client request as the service sees it."""

    request: Any
    tenant: str
    kind: RequestKind
    control: CacheControl = field(default_factory=CacheControl)
    tags: tuple[str, ...] = ()
    request_id: str = field(default_factory=lambda: random_hex(12))
    priority: int = 0
    admit: Callable[[], Awaitable[None]] | None = None
    """Charged once the call is known to need the backend (the rate limiter, when hits are free)."""
    upstream_headers: dict[str, str] = field(default_factory=dict)
    """Headers an upstream needs for this API besides kvgate's own (Anthropic's `anthropic-version`)."""


@dataclass(frozen=True, slots=True)
class CachedAnswer:
    answer: StoredAnswer
    lookup: Lookup
    scope: RequestScope | None = None
    """Where it was found (the exact-hit memo reads it again there, `gateway/apis/exact_memo.py`)."""


@dataclass(frozen=True, slots=True)
class LiveAnswer:
    flight: Flight
    result: str  # "miss" or "bypass"
    lookup: Lookup | None
    shadowed: bool = False  # shadow mode: a semantic hit was found but not served


class CompletionService:
    """Answers completion calls from the cache or the backend, and stores what the backend computes."""

    def __init__(
        self,
        store: FailOpenCache,
        backend: Backend,
        stats: HitStats,
        *,
        scope_secret: bytes,
        max_pending: int,
        store_truncated: bool = True,
        max_stored_answer_bytes: int = 1024 * 1024,
        log_prompts: bool = False,
        shadow_mode: bool = False,
    ) -> None:
        self.store = store
        self.cache: SemanticCache = store.cache
        self.metrics: GatewayMetrics = store.metrics
        self.backend = backend
        self.stats = stats
        self.scope_secret = scope_secret
        self.max_pending = max_pending
        self.store_truncated = store_truncated
        self.max_stored_answer_bytes = max_stored_answer_bytes
        self.log_prompts = log_prompts
        self.shadow_mode = shadow_mode
        self.shadow = ShadowStats()
        self.pending = 0
        self._flights: dict[str, Flight] = {}
        self._bookkeeping: set[asyncio.Task[None]] = set()

    @property
    def store_healthy(self) -> bool:
        return self.store.healthy

    async def answer(self, call: CompletionCall) -> CachedAnswer | LiveAnswer:
        """A stored answer, or a generation (possibly shared with identical concurrent calls)."""
        model = call.request.model
        if not self.backend.serves_model(model):
            raise NotFound(f"The model '{model}' does not exist.", param="model", code="model_not_found")
        scope = self.scope_of(call)
        lookup = await self.store.lookup(scope, call.control)
        shadowed: CacheEntry | None = None
        if lookup is not None and lookup.hit and lookup.entry is not None:
            if lookup.kind is LookupKind.SEMANTIC_HIT and self.shadow_mode:
                self.shadow.record_candidate()  # counted and compared, never served
                shadowed = lookup.entry
            else:
                stored = call.kind.stored(lookup.entry.response, model)
                if lookup.entry.exact_key != scope.exact_key and not call.control.no_store:
                    self._in_background(
                        self.store.keep_served(ServedHit.of(call.request_id, scope, lookup.entry))
                    )
                if lookup.kind is LookupKind.SEMANTIC_HIT and not call.control.no_store:
                    await self.store.remember(scope, lookup.entry)
                saved = (stored.prompt_tokens + stored.completion_tokens, stored.generation_s)
                record_outcome(self.stats, self.metrics, call.tenant, scope, lookup, lookup.kind.value, saved)
                return CachedAnswer(stored, lookup, scope)
        if call.admit is not None:
            await call.admit()
        result = LookupKind.BYPASS.value if call.control.bypass else LookupKind.MISS.value
        record_outcome(self.stats, self.metrics, call.tenant, scope, lookup, result)
        coalesce = not call.control.bypass and not call.control.no_store
        flight = self._flights.get(self._flight_key(call, scope)) if coalesce else None
        if flight is None:
            flight = self._launch(call, scope, lookup, coalesce, shadowed)
        return LiveAnswer(flight, result, lookup, shadowed is not None)

    def scope_of(self, call: CompletionCall) -> RequestScope:
        body, refusal = call.kind.scope_body(call.request)
        try:
            scope = build_scope(
                body,
                tenant=call.tenant,
                embedder=self.cache.scope_embedder,
                secret=self.scope_secret,
                endpoint=call.kind.endpoint,
            )
        except ValueError as error:
            raise InvalidRequest(str(error)) from error
        if refusal is not None and scope.semantic:
            scope = dataclasses.replace(scope, semantic_refusal=refusal)
        return scope

    def _flight_key(self, call: CompletionCall, scope: RequestScope) -> str:
        """Identical requests share one generation; from an upstream, a stream and a JSON answer are two."""
        if self.backend.passes_through and call.request.stream:
            return scope.exact_key + ":stream"
        return scope.exact_key

    def _launch(
        self,
        call: CompletionCall,
        scope: RequestScope,
        lookup: Lookup | None,
        coalesce: bool,
        shadowed: CacheEntry | None,
    ) -> Flight:
        if self.pending >= self.max_pending:
            raise RateLimited(
                "kvgate is at capacity; retry shortly.", code="overloaded", headers={"Retry-After": "1"}
            )
        self.pending += 1
        self.metrics.pending.set(self.pending)
        key = self._flight_key(call, scope)
        model = call.request.model
        ahead = self._vector_ahead(call, scope, lookup)

        async def before_finish(flight: Flight, finished: Finished) -> None:
            whole = call.kind.whole_of(flight.events, finished, model)
            if shadowed is not None:
                cached = call.kind.stored(shadowed.response, model).text
                self.shadow.record_comparison(cached, answer_text(whole), call.request_id, shadowed.entry_id)
            vector = lookup.vector if lookup is not None else None
            if vector is None and ahead is not None:
                with contextlib.suppress(Exception):  # the insert embeds it itself
                    vector = await ahead
            await self._store(call, scope, whole, finished, flight.duration_s, vector)

        async def on_done(flight: Flight) -> None:
            if ahead is not None:
                ahead.cancel()
            self.pending -= 1
            self.metrics.pending.set(self.pending)
            if self._flights.get(key) is flight:
                del self._flights[key]

        flight = Flight(self.backend, call.kind.generation(call), before_finish, on_done)
        if coalesce:
            self._flights[key] = flight
        return flight

    def _vector_ahead(
        self, call: CompletionCall, scope: RequestScope, lookup: Lookup | None
    ) -> asyncio.Future[Any] | None:
        """A miss whose lookup did not embed (an empty scope: nothing to compare with) went to the backend
        first; its vector for the insert is computed meanwhile, not after the answer."""
        if call.control.no_store or lookup is None or lookup.vector is not None or not scope.semantic:
            return None  # nothing will be stored, the store is down, or the lookup's vector serves
        return asyncio.ensure_future(self.cache.vector_for(scope))

    async def _store(
        self,
        call: CompletionCall,
        scope: RequestScope,
        whole: dict[str, Any],
        finished: Finished,
        generation_s: float,
        vector: Any,
    ) -> None:
        keep, text_only = call.kind.storable(whole, self.store_truncated)
        if call.control.no_store or not keep:
            return
        stored = StoredAnswer.of(whole, finished.prompt_tokens, finished.completion_tokens, generation_s)
        raw = stored.to_json()
        if len(raw.encode()) > self.max_stored_answer_bytes:  # bounds Redis memory per entry
            return
        exact_only = None if text_only else "the answer is not plain text"
        await self.store.insert(
            scope, raw, call.control, tags=call.tags, vector=vector, exact_only=exact_only
        )

    def _in_background(self, work: Coroutine[Any, Any, None]) -> None:
        """Bookkeeping the answer need not wait for: started now (its first command goes out before the
        answer does), held until done."""
        task = asyncio.get_running_loop().create_task(work)
        self._bookkeeping.add(task)
        task.add_done_callback(self._bookkeeping.discard)
