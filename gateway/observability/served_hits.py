"""The semantic hits served lately, kept in Redis so that `/admin/feedback` can name the pair a report is
about: the request's wording (its scope) and the stored entry that answered it.

    P:r:<request id>   hash    the hit (`FIELDS`); TTL = the feedback window (`KVGATE_FEEDBACK_WINDOW_S`)
    P:e:<entry id>     string  the request id of the latest hit served from that entry; same TTL

A hit is kept when a semantic hit was served, or a wording remembered from one (an exact hit through another
wording's entry): both are two different prompts the rule judged alike. An exact hit of the same prompt is
not kept: it matched, and there is no pair to report. Each record names its tenant (the scope is the
tenant's), so a report reaches that tenant's scope only. Knows Redis and a hit's fields; nothing about HTTP
or the rule.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from redis.typing import EncodableT

from semantic import CacheEntry, RedisClient, RequestScope

PREFIX = "kvgate:fb"
FIELDS = (
    "tenant",
    "model",
    "endpoint",
    "scope",
    "query_key",
    "query",
    "entry_id",
    "entry_key",
    "entry_prompt",
)

# KEYS: a hit's record.  Marks it reported, once: 1 the first time, 0 after that or once the record expired
# (HSETNX alone would make a record without a TTL out of an expired one).
_CLAIM = """
if redis.call('EXISTS', KEYS[1]) == 0 then
  return 0
end
return redis.call('HSETNX', KEYS[1], 'reported', '1')
"""


@dataclass(frozen=True, slots=True)
class ServedHit:
    """A pair served: the request (its scope: tenant, wording, exact key) and the entry that answered it."""

    request_id: str
    scope: RequestScope
    entry_id: str
    entry_key: str
    """The exact key the entry was stored under: its prompt's, in that scope."""
    entry_prompt: str

    @classmethod
    def of(cls, request_id: str, scope: RequestScope, entry: CacheEntry) -> ServedHit:
        return cls(request_id, scope, entry.entry_id, entry.exact_key, entry.prompt)

    @property
    def tenant(self) -> str:
        return self.scope.tenant


class ServedHits:
    """The served hits of the last `window_s` seconds, by request id and by entry id (the latest)."""

    def __init__(self, client: RedisClient, window_s: float, prefix: str = PREFIX) -> None:
        if window_s <= 0:
            raise ValueError("window_s must be positive")
        self.client = client
        self.window_ms = max(1, round(window_s * 1000))
        self.prefix = prefix
        self._claim = client.register_script(_CLAIM)

    async def remember(self, hit: ServedHit) -> None:
        scope = hit.scope
        record: dict[EncodableT, EncodableT] = {
            "tenant": scope.tenant,
            "model": scope.model,
            "endpoint": scope.endpoint,
            "scope": scope.scope_id,
            "query_key": scope.exact_key,
            "query": scope.prompt,
            "entry_id": hit.entry_id,
            "entry_key": hit.entry_key,
            "entry_prompt": hit.entry_prompt,
        }
        async with self.client.pipeline(transaction=False) as pipe:
            pipe.hset(self._record_key(hit.request_id), mapping=record)
            pipe.pexpire(self._record_key(hit.request_id), self.window_ms)
            pipe.set(self._entry_key(hit.entry_id), hit.request_id, px=self.window_ms)
            await pipe.execute()

    async def find(self, request_id: str | None = None, entry_id: str | None = None) -> ServedHit | None:
        """The hit served under `request_id`, else the latest served from `entry_id`; None when none is kept
        (never served, an exact hit, or older than the window)."""
        if request_id is None:
            if entry_id is None:
                return None
            latest = await self.client.get(self._entry_key(entry_id))
            if latest is None:
                return None
            request_id = _text(latest)
        values = await self.client.hmget(self._record_key(request_id), list(FIELDS))
        if any(value is None for value in values):
            return None
        found = dict(zip(FIELDS, (_text(value) for value in values), strict=True))
        scope = RequestScope(
            tenant=found["tenant"],
            model=found["model"],
            endpoint=found["endpoint"],
            scope_id=found["scope"],
            exact_key=found["query_key"],
            prompt=found["query"],
        )
        return ServedHit(request_id, scope, found["entry_id"], found["entry_key"], found["entry_prompt"])

    async def claim(self, request_id: str) -> bool:
        """Mark the hit reported; False when it already was (one report per served hit) or has expired."""
        return bool(await self._claim(keys=[self._record_key(request_id)]))

    async def release(self, request_id: str) -> None:
        """Undo `claim`, when the report could not be carried out: it may be sent again."""
        await self.client.hdel(self._record_key(request_id), "reported")

    def _record_key(self, request_id: str) -> str:
        return f"{self.prefix}:r:{request_id}"

    def _entry_key(self, entry_id: str) -> str:
        return f"{self.prefix}:e:{entry_id}"


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
