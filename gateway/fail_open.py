"""The cache as the request flow uses it: failing open. A store that is down never fails a request: the
operation is skipped (a lookup is a miss, an insert is lost), a breaker skips the store fast while it keeps
failing, and the error is logged once a minute."""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Awaitable
from typing import Any, TypeVar

from redis.exceptions import RedisError

from gateway.observability.metrics import GatewayMetrics
from gateway.observability.served_hits import ServedHit, ServedHits
from gateway.traffic.breaker import CircuitBreaker
from semantic import CacheControl, CacheEntry, Lookup, RequestScope, SemanticCache

logger = logging.getLogger("kvgate.service")
Result = TypeVar("Result")


class FailOpenCache:
    """`SemanticCache`'s lookup, insert and remember, and the served-hit record, each failing open."""

    def __init__(
        self,
        cache: SemanticCache,
        metrics: GatewayMetrics,
        breaker: CircuitBreaker | None = None,
        served_hits: ServedHits | None = None,
        error_log_interval_s: float = 60.0,
    ) -> None:
        self.cache = cache
        self.metrics = metrics
        self.breaker = breaker
        self.served_hits = served_hits
        self.error_log_interval_s = error_log_interval_s
        self.healthy = True
        self._error_logged_at = -math.inf

    async def lookup(self, scope: RequestScope, control: CacheControl) -> Lookup | None:
        """The cache's lookup; None while the store is down (answer from the backend)."""
        return await self._guarded("lookup", self.cache.lookup(scope, control))

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
        """Store an answer (a store that is down loses the entry, never the request)."""
        work = self.cache.insert(scope, raw, control, tags=tags, vector=vector, exact_only=exact_only)
        await self._guarded("insert", work)

    async def remember(self, scope: RequestScope, entry: CacheEntry) -> None:
        """A served semantic hit: asking the same wording again becomes an exact hit."""
        await self._guarded("remember", self.cache.remember(scope, entry))

    async def keep_served(self, hit: ServedHit) -> None:
        """A pair of prompts was served: kept for the feedback window, so that it can be reported."""
        if self.served_hits is not None:
            await self._guarded("keep served hit", self.served_hits.remember(hit))

    async def _guarded(self, operation: str, work: Awaitable[Result]) -> Result | None:
        if self.breaker is not None and not self.breaker.allow():
            _discard(work)
            return None  # the store keeps failing: skip it fast
        try:
            result = await work
        except (RedisError, OSError) as error:
            self._failed(operation, error)
            return None
        if self.breaker is not None:
            self.breaker.record_success()
        self.healthy = True
        self.metrics.store_up.set(1)
        return result

    def _failed(self, operation: str, error: Exception) -> None:
        if self.breaker is not None:
            self.breaker.record_failure()
        self.healthy = False
        self.metrics.store_up.set(0)
        now = time.monotonic()
        if now - self._error_logged_at >= self.error_log_interval_s:
            self._error_logged_at = now
            logger.error(
                "cache store unavailable during %s (failing open to the backend): %s", operation, error
            )


def _discard(work: Awaitable[Any]) -> None:
    """A coroutine that will not run: closed, so Python does not warn that it was never awaited."""
    close = getattr(work, "close", None)
    if close is not None:
        close()
