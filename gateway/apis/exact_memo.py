"""Exact hits without re-reading the request: a request whose bytes (path, `Authorization`, body) a true exact
hit answered is answered again from a copy of what the pipeline read for it (the parsed request, its scope,
the stored answer), without parsing the body, building the scope or asking Redis, while the copy is good:

- its scope's change epoch has not moved: no entry of the scope was deleted, purged or replaced since the copy
  was read, in this process or another (the change stream; `semantic/index/epochs.py`);
- it was read from Redis less than `revalidate_s` ago, which bounds what no event tells (an entry Redis evicted
  or someone deleted by hand), and its entry has not expired.

Otherwise it is read again, with the exact layer's own Lua script (which counts the hits served meanwhile on
the entry), before it serves; a read that fails drops the copy and the request takes the pipeline, which fails
open. Only what the pipeline would answer the same way is kept: a true exact hit (not another wording's
remembered one), no request header that changes the cache's behaviour (`Cache-Control`, `x-kvgate-*`), no
tracing, and no rate limit on the tenant (a hit would be charged to it or carry its headers). Each answer goes through
the adapter's own rendering, the pipeline's access line and metric, and the hit-rate statistics.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from redis.exceptions import RedisError
from starlette.datastructures import Headers
from starlette.responses import Response

from gateway.api.errors import KvgateError
from gateway.api.ids import random_hex
from gateway.apis.pipeline import finish
from gateway.observability.outcomes import record_outcome
from gateway.service import CachedAnswer
from semantic import Lookup, LookupKind

if TYPE_CHECKING:
    from gateway.apis.completion_api import CompletionApi
    from gateway.apis.exchange import Exchange

MemoKey = tuple[str, bytes, bytes]
"""(path, the credential's bytes (`credential()`), the body's bytes)."""

DEFAULT_MAX_BODY = 64 * 1024
DEFAULT_MAX_BYTES = 16 * 1024 * 1024


@dataclass(slots=True)
class _Copy:
    api: CompletionApi[Any]
    request: Any
    tenant: str
    model: str
    answer: CachedAnswer
    lookup: Lookup  # the answer's, as a lookup that took no time
    epoch: tuple[int, int]
    read_at: float  # monotonic
    size: int
    unflushed: int = 0  # hits served since the copy was read, counted on the entry at the next read


class ExactMemo:
    """The copies, bounded in count of bytes (oldest learnt first out)."""

    def __init__(
        self,
        revalidate_s: float = 1.0,
        max_body: int = DEFAULT_MAX_BODY,
        max_bytes: int = DEFAULT_MAX_BYTES,
    ) -> None:
        self.revalidate_s = revalidate_s
        self.max_body = max_body
        self.max_bytes = max_bytes
        self.served = 0  # for tests and the note: answers given from a copy
        self._copies: dict[MemoKey, _Copy] = {}
        self._bytes = 0
        self._paths: dict[str, int] = {}  # copies per path

    def __len__(self) -> int:
        return len(self._copies)

    def keeps(self, path: str) -> bool:
        """Whether a copy of a request to `path` is kept (else its body is not worth reading here)."""
        return path in self._paths

    def learn(
        self,
        api: CompletionApi[Any],
        exchange: Exchange[Any],
        answer: CachedAnswer,
        body: bytes,
        moves_before: int,
    ) -> None:
        """After the pipeline answered `exchange` with `answer`: keep a copy if the same bytes may be answered
        from it the same way. `moves_before`: the change epochs' moves before the lookup read the entry; if any
        entry anywhere went or was replaced since, the copy is not kept (it could hold what was deleted)."""
        state = exchange.state
        lookup, scope = answer.lookup, answer.scope
        if (
            state.service.cache.epochs.moves != moves_before
            or lookup.kind is not LookupKind.EXACT_HIT
            or scope is None
            or lookup.entry is None
            or lookup.entry.exact_key != scope.exact_key  # another wording's remembered hit: its record
            or state.tracing.enabled
            or len(body) > self.max_body
            or state.limiter.policy.limits_for(exchange.tenant) != (None, None)
            or servable_length(exchange.http.scope["headers"]) is None
        ):
            return
        key = (exchange.http.scope["path"], credential(exchange.http.scope["headers"]), body)
        size = len(body) + len(answer.answer.whole_json) + len(lookup.entry.prompt) + 1024
        self._drop(key)
        self._paths[key[0]] = self._paths.get(key[0], 0) + 1
        self._copies[key] = _Copy(
            api,
            exchange.request,
            exchange.tenant,
            str(exchange.request.model),
            answer,
            dataclasses.replace(lookup, total_ms=0.0),
            state.service.cache.epochs.of(scope.scope_id),
            time.monotonic(),
            size,
        )
        self._bytes += size
        while self._bytes > self.max_bytes and self._copies:
            self._drop(next(iter(self._copies)))

    async def answer(
        self, key: MemoKey, headers: list[tuple[bytes, bytes]], state: Any, started: float
    ) -> Response | None:
        """The answer from a good copy (logged and counted), or None: the pipeline answers."""
        copy = self._copies.get(key)
        if copy is None:
            return None
        try:
            tenant = state.keys.tenant_for(copy.api.credentials(Headers(raw=headers))).name
        except KvgateError:
            return None  # the key was revoked: the pipeline says so
        service = state.service
        if tenant != copy.tenant or not service.backend.serves_model(copy.model):
            return None
        answer, lookup = copy.answer, copy.lookup
        scope, entry = answer.scope, lookup.entry
        assert scope is not None and entry is not None
        if entry.expires is not None and time.time() >= entry.expires:
            self._drop(key)
            return None
        now = time.monotonic()
        if now - copy.read_at >= self.revalidate_s or service.cache.epochs.of(scope.scope_id) != copy.epoch:
            if not await self._read_again(key, copy, service):
                return None
            lookup = dataclasses.replace(lookup, total_ms=(time.perf_counter() - started) * 1000.0)
        else:
            copy.unflushed += 1
        stored = answer.answer
        record_outcome(
            service.stats,
            service.metrics,
            tenant,
            scope,
            lookup,
            LookupKind.EXACT_HIT.value,
            (stored.prompt_tokens + stored.completion_tokens, stored.generation_s),
        )
        reply = await copy.api.render(copy.request, answer, state)
        self.served += 1
        return finish(copy.api, state, reply, random_hex(12), tenant, copy.model, started)

    async def _read_again(self, key: MemoKey, copy: _Copy, service: Any) -> bool:
        scope = copy.answer.scope
        assert scope is not None and copy.answer.lookup.entry is not None
        epoch = service.cache.epochs.of(scope.scope_id)  # before the read: a delete during it reads again
        hits, copy.unflushed = copy.unflushed + 1, 0
        if not service.store.healthy:
            self._drop(key)
            return False
        try:
            entry = await service.cache.store.get_exact(scope, 0.0, hits)
        except (RedisError, OSError):
            self._drop(key)  # the pipeline fails open, and its breaker counts the failure
            return False
        if entry is None or entry.entry_id != copy.answer.lookup.entry.entry_id:
            self._drop(key)  # gone, or replaced by a newer answer: the pipeline reads it
            return False
        copy.epoch, copy.read_at = epoch, time.monotonic()
        return True

    def _drop(self, key: MemoKey) -> None:
        copy = self._copies.pop(key, None)
        if copy is not None:
            self._bytes -= copy.size
            left = self._paths[key[0]] - 1
            if left:
                self._paths[key[0]] = left
            else:
                del self._paths[key[0]]


def servable_length(headers: list[tuple[bytes, bytes]]) -> int | None:
    """The Content-Length of a request a copy may answer; None for one with a header that changes how the
    cache answers (`Cache-Control`, `x-kvgate-*`), or with no or a bad Content-Length (chunked). What the way
    in reads before it reads a body, and what `learn` asks of a request before it keeps a copy."""
    length: int | None = None
    for name, value in headers:
        if name == b"content-length":
            if not value.isdigit():
                return None
            length = int(value)
        elif name == b"cache-control" or name.startswith(b"x-kvgate-"):
            return None
    return length


def credential(headers: list[tuple[bytes, bytes]]) -> bytes:
    """What names the caller, as bytes: `Authorization`, else Anthropic's `x-api-key` (marked apart)."""
    api_key = b""
    for name, value in headers:
        if name == b"authorization":
            return value
        if name == b"x-api-key":
            api_key = b"x-api-key " + value
    return api_key
