"""Per-tenant rate limits shared by every replica: two token buckets (requests, tokens) per tenant in Redis.

Each bucket holds up to its per-minute limit and refills continuously at limit/60 per second. One Lua
script reads both buckets, refills them from the Redis server's clock (so replicas with skewed clocks agree)
and takes from both or from neither, atomically. Keys are hash-tagged per tenant
(`kvgate:ratelimit:{tenant}:requests`), so a tenant's two buckets share a Redis Cluster slot.

Tokens are estimated before the call (prompt characters / 4 + max_tokens); no correction afterwards.
When Redis fails (or its breaker is open) the limiter falls back to buckets of this process: limits then
hold per replica instead of across them, and no request fails because the limiter is down.
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass

import redis.asyncio as aioredis
from redis.exceptions import RedisError

from gateway.api.errors import RateLimited
from gateway.observability.metrics import GatewayMetrics
from gateway.traffic.breaker import CircuitBreaker
from gateway.traffic.tenant_policy import TenantPolicy

logger = logging.getLogger("kvgate.ratelimit")

KEY_PREFIX = "kvgate:ratelimit"
WINDOW_S = 60.0

# KEYS: requests bucket, tokens bucket. ARGV: rpm, tpm (0 = unlimited), request cost, token cost.
# Returns {allowed, requests level, tokens level} (levels as strings: Lua numbers become integers).
_TAKE_SCRIPT = """
local now_parts = redis.call('TIME')
local now = tonumber(now_parts[1]) * 1000 + math.floor(tonumber(now_parts[2]) / 1000)
local function level(key, capacity)
  if capacity <= 0 then return 0 end
  local stored = redis.call('HMGET', key, 'level', 'at')
  local value, at = tonumber(stored[1]), tonumber(stored[2])
  if value == nil or at == nil then return capacity end
  return math.min(capacity, value + math.max(0, now - at) * capacity / 60000)
end
local rpm, tpm = tonumber(ARGV[1]), tonumber(ARGV[2])
local request_cost, token_cost = tonumber(ARGV[3]), tonumber(ARGV[4])
local requests, tokens = level(KEYS[1], rpm), level(KEYS[2], tpm)
local allowed = 1
if rpm > 0 and requests < request_cost then allowed = 0 end
if tpm > 0 and tokens < token_cost then allowed = 0 end
if allowed == 1 then
  requests = requests - request_cost
  tokens = tokens - token_cost
end
if rpm > 0 then
  redis.call('HSET', KEYS[1], 'level', tostring(requests), 'at', now)
  redis.call('PEXPIRE', KEYS[1], 120000)
end
if tpm > 0 then
  redis.call('HSET', KEYS[2], 'level', tostring(tokens), 'at', now)
  redis.call('PEXPIRE', KEYS[2], 120000)
end
return {allowed, tostring(requests), tostring(tokens)}
"""


@dataclass(frozen=True, slots=True)
class Bucket:
    """One bucket after a take: its per-minute limit, what is left, and the cost that was asked."""

    limit: int
    level: float
    cost: float

    @property
    def remaining(self) -> int:
        return max(0, math.floor(self.level))

    @property
    def reset_s(self) -> float:
        """Seconds until the bucket is full again."""
        return max(0.0, (self.limit - self.level) * WINDOW_S / self.limit)

    @property
    def wait_s(self) -> float:
        """Seconds until `cost` would fit (0 when it fits now)."""
        return max(0.0, (self.cost - self.level) * WINDOW_S / self.limit)


@dataclass(frozen=True, slots=True)
class Quota:
    """A limiter decision and the `x-ratelimit-*` headers OpenAI clients read."""

    allowed: bool
    requests: Bucket | None
    tokens: Bucket | None
    shared: bool
    """True when decided in Redis (across replicas), False when by this process's fallback buckets."""

    def headers(self) -> dict[str, str]:
        headers: dict[str, str] = {}
        for suffix, bucket in (("requests", self.requests), ("tokens", self.tokens)):
            if bucket is not None:
                headers[f"x-ratelimit-limit-{suffix}"] = str(bucket.limit)
                headers[f"x-ratelimit-remaining-{suffix}"] = str(bucket.remaining)
                headers[f"x-ratelimit-reset-{suffix}"] = _duration(bucket.reset_s)
        return headers

    def retry_after_s(self) -> float:
        return max(
            (bucket.wait_s for bucket in (self.requests, self.tokens) if bucket is not None), default=0.0
        )


class RateLimiter:
    """Takes from a tenant's buckets; raises `RateLimited` (429 with Retry-After) when either is short."""

    def __init__(
        self,
        policy: TenantPolicy,
        client: aioredis.Redis | aioredis.RedisCluster | None,
        metrics: GatewayMetrics,
        *,
        count_hits: bool = True,
        default_max_tokens: int = 256,
        breaker: CircuitBreaker | None = None,
        key_prefix: str = KEY_PREFIX,
    ) -> None:
        self.policy = policy
        self.count_hits = count_hits
        self.default_max_tokens = default_max_tokens
        self._client = client
        self._metrics = metrics
        self._breaker = breaker
        self._key_prefix = key_prefix
        self._script = client.register_script(_TAKE_SCRIPT) if client is not None else None
        self._local: dict[str, tuple[float, float]] = {}
        self._error_logged_at = 0.0
        self.last_shared = client is not None

    async def take(self, tenant: str, tokens: int) -> Quota | None:
        """Charge one request and `tokens`; None when the tenant is unlimited. Raises `RateLimited`."""
        quota = await self._take(tenant, 1, tokens)
        if quota is not None and not quota.allowed:
            self._metrics.rate_limited.labels(tenant).inc()
            retry = quota.retry_after_s()
            raise RateLimited(
                f"Rate limit reached for tenant '{tenant}'; retry in {retry:.1f}s.",
                code="rate_limit_exceeded",
                headers=quota.headers()
                | {
                    "Retry-After": str(max(1, math.ceil(retry))),
                    "retry-after-ms": str(math.ceil(retry * 1000)),
                },
            )
        return quota

    async def peek(self, tenant: str) -> Quota | None:
        """The tenant's buckets without charging anything (headers for a hit that is not counted)."""
        return await self._take(tenant, 0, 0)

    async def _take(self, tenant: str, requests: int, tokens: int) -> Quota | None:
        rpm, tpm = self.policy.limits_for(tenant)
        if rpm is None and tpm is None:
            return None
        token_cost = min(tokens, tpm) if tpm is not None else tokens  # a huge request must not wait forever
        if self._script is not None and (self._breaker is None or self._breaker.allow()):
            try:
                allowed, request_level, token_level = await self._script(
                    keys=[self._key(tenant, "requests"), self._key(tenant, "tokens")],
                    args=[rpm or 0, tpm or 0, requests, token_cost],
                )
            except (RedisError, OSError) as error:
                self._redis_failed(error)
            else:
                if self._breaker is not None:
                    self._breaker.record_success()
                self.last_shared = True
                return _quota(bool(int(allowed)), rpm, tpm, requests, token_cost, request_level, token_level)
        self.last_shared = False
        return self._take_local(tenant, rpm, tpm, requests, token_cost)

    def _take_local(self, tenant: str, rpm: int | None, tpm: int | None, requests: int, tokens: int) -> Quota:
        now = time.monotonic()
        request_level = self._level(f"{tenant}:requests", rpm, now)
        token_level = self._level(f"{tenant}:tokens", tpm, now)
        allowed = (rpm is None or request_level >= requests) and (tpm is None or token_level >= tokens)
        if allowed:
            request_level -= requests
            token_level -= tokens
        if rpm is not None:
            self._local[f"{tenant}:requests"] = (request_level, now)
        if tpm is not None:
            self._local[f"{tenant}:tokens"] = (token_level, now)
        quota = _quota(allowed, rpm, tpm, requests, tokens, str(request_level), str(token_level))
        return Quota(quota.allowed, quota.requests, quota.tokens, shared=False)

    def _level(self, key: str, capacity: int | None, now: float) -> float:
        if capacity is None:
            return 0.0
        level, at = self._local.get(key, (float(capacity), now))
        return min(float(capacity), level + (now - at) * capacity / WINDOW_S)

    def _key(self, tenant: str, kind: str) -> str:
        return f"{self._key_prefix}:{{{tenant}}}:{kind}"

    def _redis_failed(self, error: Exception) -> None:
        if self._breaker is not None:
            self._breaker.record_failure()
        now = time.monotonic()
        if now - self._error_logged_at >= 60.0:
            self._error_logged_at = now
            logger.error("rate limiter cannot reach Redis (using per-process buckets): %s", error)


class Admission:
    """Charges a request once, when the caller decides it costs something; remembers the quota."""

    def __init__(self, limiter: RateLimiter, tenant: str, tokens: int) -> None:
        self._limiter = limiter
        self._tenant = tenant
        self._tokens = tokens
        self.quota: Quota | None = None
        self.charged = False

    async def __call__(self) -> None:
        if not self.charged:
            self.charged = True
            self.quota = await self._limiter.take(self._tenant, self._tokens)

    async def headers(self) -> dict[str, str]:
        """The rate-limit headers for the response (read without charging when nothing was charged)."""
        quota = self.quota if self.charged else await self._limiter.peek(self._tenant)
        return quota.headers() if quota is not None else {}


def _quota(
    allowed: bool,
    rpm: int | None,
    tpm: int | None,
    requests: int,
    tokens: int,
    request_level: bytes | str,
    token_level: bytes | str,
) -> Quota:
    request_bucket = Bucket(rpm, _number(request_level), requests) if rpm is not None else None
    token_bucket = Bucket(tpm, _number(token_level), tokens) if tpm is not None else None
    return Quota(allowed, request_bucket, token_bucket, shared=True)


def _number(raw: bytes | str) -> float:
    return float(raw.decode() if isinstance(raw, bytes) else raw)


def _duration(seconds: float) -> str:
    """OpenAI's reset format: `250ms`, `1.5s`, `6m0s`."""
    if seconds < 1.0:
        return f"{math.ceil(seconds * 1000)}ms"
    minutes, rest = divmod(seconds, 60.0)
    return f"{int(minutes)}m{rest:.0f}s" if minutes else f"{rest:.3g}s"
