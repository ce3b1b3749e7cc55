"""The request flow, top to bottom: scope -> exact layer -> semantic layer -> backend -> store.

    answer():   which model  ->  scope (semantic.store.scope)  ->  cache lookup (exact, then semantic)
                -> hit: a `CachedAnswer` (a semantic one is remembered: its wording becomes an exact hit;
                   the pair is kept for the feedback window, so that it can be reported: `feedback.py`)
                -> miss: join the identical generation already in flight, or start one (bounded)
    on finish:  store the answer if it is complete and the client allowed it: the whole object the backend
                sent (`StoredAnswer`), never an error, a refusal or a content-filtered answer; an answer that
                is not plain text (tool calls, logprobs, several choices) serves the same request only

A store that is down never fails a request: the cache fails open to the backend, logging once a minute.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import math
import time
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any

from redis.exceptions import RedisError

from gateway.answers import StoredAnswer, policy, whole_of
from gateway.api.chunks import (
    answer_text,
)
from gateway.api.errors import InvalidRequest, NotFound, RateLimited
from gateway.api.ids import random_hex
from gateway.api.objects import (
    ChatCompletionRequest,
    CompletionRequest,
    MessagesRequest,
    ResponsesRequest,
)
from gateway.backends.protocol import (
    Backend,
    Finished,
    GenerationRequest,
)
from gateway.observability.metrics import GatewayMetrics
from gateway.observability.served_hits import ServedHit, ServedHits
from gateway.observability.shadow import ShadowStats
from gateway.observability.stats import HitStats
from gateway.traffic.breaker import CircuitBreaker
from gateway.traffic.coalescing import Flight
from semantic.cache import CacheControl, Lookup, LookupKind, SemanticCache
from semantic.rule.language import language_of
from semantic.store.entries import CacheEntry
from semantic.store.scope import RequestScope, build_scope

logger = logging.getLogger("kvgate.service")

AnyRequest = ChatCompletionRequest | CompletionRequest | ResponsesRequest | MessagesRequest


@dataclass(frozen=True, slots=True)
class CompletionCall:
    """One client request as the service sees it."""

    request: AnyRequest
    tenant: str
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
        cache: SemanticCache,
        backend: Backend,
        stats: HitStats,
        metrics: GatewayMetrics,
        *,
        scope_secret: bytes,
        max_pending: int,
        store_truncated: bool = True,
        max_stored_answer_bytes: int = 1024 * 1024,
        log_prompts: bool = False,
        shadow_mode: bool = False,
        store_breaker: CircuitBreaker | None = None,
        store_error_log_interval_s: float = 60.0,
        served_hits: ServedHits | None = None,
    ) -> None:
        self.cache = cache
        self.backend = backend
        self.stats = stats
        self.metrics = metrics
        self.scope_secret = scope_secret
        self.max_pending = max_pending
        self.store_truncated = store_truncated
        self.max_stored_answer_bytes = max_stored_answer_bytes
        self.log_prompts = log_prompts
        self.shadow_mode = shadow_mode
        self.store_breaker = store_breaker
        self.store_error_log_interval_s = store_error_log_interval_s
        self.served_hits = served_hits
        self.shadow = ShadowStats()
        self._flights: dict[str, Flight] = {}
        self._bookkeeping: set[asyncio.Task[None]] = set()
        self._pending = 0
        self._store_error_logged_at = -math.inf
        self.store_healthy = True

    async def answer(self, call: CompletionCall) -> CachedAnswer | LiveAnswer:
        """A stored answer, or a generation (possibly shared with identical concurrent calls)."""
        if not self.backend.serves_model(call.request.model):
            raise NotFound(
                f"The model '{call.request.model}' does not exist.", param="model", code="model_not_found"
            )
        scope = self.scope_of(call)
        lookup = await self._lookup(scope, call.control)
        shadowed: CacheEntry | None = None
        if lookup is not None and lookup.hit and lookup.entry is not None:
            if lookup.kind is LookupKind.SEMANTIC_HIT and self.shadow_mode:
                self.shadow.record_candidate()  # counted and compared, never served
                shadowed = lookup.entry
            else:
                stored = StoredAnswer.from_json(
                    lookup.entry.response, chat=scope.endpoint == "chat", model=call.request.model
                )
                if lookup.entry.exact_key != scope.exact_key and not call.control.no_store:
                    self._in_background(self._keep_served(ServedHit.of(call.request_id, scope, lookup.entry)))
                if lookup.kind is LookupKind.SEMANTIC_HIT and not call.control.no_store:
                    await self._remember(scope, lookup.entry)
                self._record(call, scope, lookup, lookup.kind.value, stored)
                return CachedAnswer(stored, lookup)
        if call.admit is not None:
            await call.admit()
        result = LookupKind.BYPASS.value if call.control.bypass else LookupKind.MISS.value
        self._record(call, scope, lookup, result, None)
        coalesce = not call.control.bypass and not call.control.no_store
        flight = self._flights.get(self._flight_key(call, scope)) if coalesce else None
        if flight is None:
            flight = self._launch(call, scope, lookup, coalesce, shadowed)
        return LiveAnswer(flight, result, lookup, shadowed is not None)

    def _flight_key(self, call: CompletionCall, scope: RequestScope) -> str:
        """Identical requests share one generation; from an upstream, a stream and a JSON answer are two."""
        if self.backend.passes_through and call.request.stream:
            return scope.exact_key + ":stream"
        return scope.exact_key

    def scope_of(self, call: CompletionCall) -> RequestScope:
        body = call.request.model_dump(exclude_unset=True)
        endpoint = "messages" if isinstance(call.request, MessagesRequest) else None
        if isinstance(call.request, ResponsesRequest):  # its input is the compared text, when it is one text
            endpoint = "responses"
            body["prompt"] = (
                body.pop("input") if isinstance(call.request.input, str) else call.request.prompt_text
            )
        try:
            scope = build_scope(
                body,
                tenant=call.tenant,
                embedder=self.cache.scope_embedder,
                secret=self.scope_secret,
                endpoint=endpoint,
            )
        except ValueError as error:
            raise InvalidRequest(str(error)) from error
        if (
            isinstance(call.request, ResponsesRequest)
            and scope.semantic
            and not isinstance(call.request.input, str)
        ):
            scope = dataclasses.replace(scope, semantic_refusal="input is not one text")
        return scope

    def prompt_for_log(self, call: CompletionCall) -> str | None:
        """The last turn's text, only when the operator asked for prompts in logs."""
        if not self.log_prompts:
            return None
        request = call.request
        return (
            request.messages[-1].text if isinstance(request, ChatCompletionRequest) else request.prompt_text
        )

    @property
    def pending(self) -> int:
        return self._pending

    def _record(
        self,
        call: CompletionCall,
        scope: RequestScope,
        lookup: Lookup | None,
        result: str,
        stored: StoredAnswer | None,
    ) -> None:
        tokens = _tokens(stored) if stored is not None else 0
        seconds = stored.generation_s if stored is not None else 0.0
        # The lookup read the prompt's language already (`language_of` keeps the last 65,536 texts'), and an
        # exact hit's prompt was read when it missed: a dictionary lookup on the hit path.
        language = language_of(scope.prompt)
        self.stats.record(
            call.tenant,
            scope.model,
            result,
            tokens,
            seconds,
            scope_id=scope.scope_id,
            route=scope.endpoint,
            language=language,
        )
        metrics = self.metrics
        metrics.requests.labels(scope.endpoint, call.tenant, scope.model, result).inc()
        metrics.requests_by_language.labels(language, result).inc()
        if stored is not None:
            metrics.tokens_saved.inc(tokens)
            metrics.seconds_saved.inc(seconds)
        if lookup is not None and lookup.kind is not LookupKind.BYPASS:
            metrics.lookup_seconds.observe(lookup.total_ms / 1000.0)
            if lookup.embed_ms:
                metrics.embed_seconds.observe(lookup.embed_ms / 1000.0)
            if lookup.similarity is not None and lookup.kind is not LookupKind.EXACT_HIT:
                label = "hit" if lookup.kind is LookupKind.SEMANTIC_HIT else "miss"
                metrics.similarity.labels(label).observe(lookup.similarity)

    def _launch(
        self,
        call: CompletionCall,
        scope: RequestScope,
        lookup: Lookup | None,
        coalesce: bool,
        shadowed: CacheEntry | None = None,
    ) -> Flight:
        if self._pending >= self.max_pending:
            raise RateLimited(
                "kvgate is at capacity; retry shortly.", code="overloaded", headers={"Retry-After": "1"}
            )
        self._pending += 1
        self.metrics.pending.set(self._pending)

        endpoint = scope.endpoint
        key = self._flight_key(call, scope)

        async def before_finish(flight: Flight, finished: Finished) -> None:
            whole = whole_of(flight.events, finished, endpoint=endpoint, model=call.request.model)
            if shadowed is not None:
                cached = StoredAnswer.from_json(
                    shadowed.response, chat=endpoint == "chat", model=call.request.model
                ).text
                self.shadow.record_comparison(cached, answer_text(whole), call.request_id, shadowed.entry_id)
            await self._store(call, scope, lookup, whole, finished, flight.duration_s)

        async def on_done(flight: Flight) -> None:
            self._pending -= 1
            self.metrics.pending.set(self._pending)
            if self._flights.get(key) is flight:
                del self._flights[key]

        flight = Flight(self.backend, generation_request(call), before_finish, on_done)
        if coalesce:
            self._flights[key] = flight
        return flight

    async def lookup(self, scope: RequestScope, control: CacheControl) -> Lookup | None:
        """The cache's lookup, failing open: None while the store is down (for the other routes' flows)."""
        return await self._lookup(scope, control)

    async def insert(
        self,
        scope: RequestScope,
        raw: str,
        control: CacheControl,
        *,
        tags: tuple[str, ...] = (),
        vector: Any = None,
        exact_only: str | None = None,
    ) -> None:
        """Store an answer, failing open (a store that is down loses the entry, never the request)."""
        if self.store_breaker is not None and not self.store_breaker.allow():
            return
        try:
            await self.cache.insert(scope, raw, control, tags=tags, vector=vector, exact_only=exact_only)
            self._store_ok()
        except (RedisError, OSError) as error:
            self._store_failed("insert", error)

    async def _lookup(self, scope: RequestScope, control: CacheControl) -> Lookup | None:
        if self.store_breaker is not None and not self.store_breaker.allow():
            return None  # the store keeps failing: skip it fast, answer from the backend
        try:
            lookup = await self.cache.lookup(scope, control)
        except (RedisError, OSError) as error:
            self._store_failed("lookup", error)
            return None
        self._store_ok()
        return lookup

    async def _remember(self, scope: RequestScope, entry: CacheEntry) -> None:
        """A served semantic hit: asking the same wording again becomes an exact hit (best effort)."""
        if self.store_breaker is not None and not self.store_breaker.allow():
            return
        try:
            await self.cache.remember(scope, entry)
            self._store_ok()
        except (RedisError, OSError) as error:
            self._store_failed("remember", error)

    def _in_background(self, work: Coroutine[Any, Any, None]) -> None:
        """Bookkeeping the answer need not wait for: started now (its first command goes out before the
        answer does), held until done."""
        task = asyncio.get_running_loop().create_task(work)
        self._bookkeeping.add(task)
        task.add_done_callback(self._bookkeeping.discard)

    async def _keep_served(self, hit: ServedHit) -> None:
        """A pair of prompts was served (a semantic hit, or a wording remembered from one): kept for the
        feedback window, so that it can be reported (best effort)."""
        if self.served_hits is None or (self.store_breaker is not None and not self.store_breaker.allow()):
            return
        try:
            await self.served_hits.remember(hit)
            self._store_ok()
        except (RedisError, OSError) as error:
            self._store_failed("keep served hit", error)

    async def _store(
        self,
        call: CompletionCall,
        scope: RequestScope,
        lookup: Lookup | None,
        whole: dict[str, Any],
        finished: Finished,
        generation_s: float,
    ) -> None:
        keep, text_only = policy(scope.endpoint, whole, self.store_truncated)
        if call.control.no_store or not keep:
            return
        stored = StoredAnswer.of(whole, finished.prompt_tokens, finished.completion_tokens, generation_s)
        raw = stored.to_json()
        if len(raw.encode()) > self.max_stored_answer_bytes:  # bounds Redis memory per entry
            return
        vector = lookup.vector if lookup is not None else None
        exact_only = None if text_only else "the answer is not plain text"
        await self.insert(scope, raw, call.control, tags=call.tags, vector=vector, exact_only=exact_only)

    def _store_ok(self) -> None:
        if self.store_breaker is not None:
            self.store_breaker.record_success()
        self.store_healthy = True
        self.metrics.store_up.set(1)

    def _store_failed(self, operation: str, error: Exception) -> None:
        if self.store_breaker is not None:
            self.store_breaker.record_failure()
        self.store_healthy = False
        self.metrics.store_up.set(0)
        now = time.monotonic()
        if now - self._store_error_logged_at >= self.store_error_log_interval_s:
            self._store_error_logged_at = now
            logger.error(
                "cache store unavailable during %s (failing open to the backend): %s", operation, error
            )


def generation_request(call: CompletionCall) -> GenerationRequest:
    request = call.request
    messages = None
    prompt = None
    path = None
    headers: dict[str, str] = {}
    if isinstance(request, ResponsesRequest):
        path = "responses"
    elif isinstance(request, MessagesRequest):
        path = "messages"
        headers = call.upstream_headers
        system = [{"role": "system", "content": request.system_text}] if request.system_text else []
        messages = system + [{"role": message.role, "content": message.text} for message in request.messages]
    elif isinstance(request, ChatCompletionRequest):
        messages = [{"role": message.role, "content": message.text} for message in request.messages]
    else:
        prompt = request.prompt_text
    return GenerationRequest(
        request_id=call.request_id,
        tenant=call.tenant,
        model=request.model,
        messages=messages,
        prompt=prompt,
        max_tokens=request.max_new_tokens,
        temperature=request.temperature,
        top_p=request.top_p,
        seed=request.seed,
        stop=request.stop_strings,
        priority=call.priority,
        **_sampling_features(request),
        body=request.model_dump(exclude_unset=True),
        stream=request.stream,
        path=path,
        headers=headers,
    )


def _sampling_features(request: AnyRequest) -> dict[str, Any]:
    """n, logprobs, penalties and logit bias, for the routes that have them (the Messages API has none)."""
    if isinstance(request, MessagesRequest):
        return {}
    logprobs: int | None = None
    if isinstance(request, ChatCompletionRequest) and request.logprobs:
        logprobs = request.top_logprobs or 0
    elif isinstance(request, CompletionRequest):
        logprobs = request.logprobs
    return {
        "n": request.n,
        "logprobs": logprobs,
        "presence_penalty": request.presence_penalty,
        "frequency_penalty": request.frequency_penalty,
        # Keys are checked by traffic/limits.py where the engine answers; an upstream reads the body instead.
        "logit_bias": {
            int(token): bias for token, bias in (request.logit_bias or {}).items() if token.isdigit()
        },
    }


def _tokens(stored: StoredAnswer) -> int:
    return stored.prompt_tokens + stored.completion_tokens
