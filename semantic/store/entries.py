"""Cache entries in Redis, the source of truth: written atomically, read by exact key or id, purged.

Key layout (prefix `P`, default `kvgate:sc`; `S` a scope id, `{...}` a Redis Cluster hash tag, so
all keys of one scope, and hence of one entry, share a slot and one Lua script can touch them):

    P:{S}:e:<entry id>   hash    the entry (fields below); TTL = the entry's
    P:{S}:x:<exact key>  string  entry id of the request with this exact key; same TTL (SET NX-like); also
                                 another wording's key, once a semantic hit served it that entry
    P:{S}:a:<entry id>   set     the other wordings' exact keys remembered for the entry; same TTL
    P:{S}:v:<exact key>  set     exact keys of the stored prompts never to serve this wording (hits
                                 reported wrong); no TTL: a pair of prompts outlives its entries
    P:{S}:m              zset    entry ids of the scope, scored by created time (purge by age, rebuild)
    P:{S}:meta           hash    tenant, model of the scope (purge by tenant / model without reading
                                 entries); the zset and this live as long as the scope's longest entry
    P:id:{<entry id>}    string  scope id of an entry (purge by id); its own slot, best effort
    P:changes            stream  adds and deletes, tailed by every process (`semantic/store/changes.py`)

Entry fields: id, scope, tenant, model, prompt, response (canonical JSON text), created and
expires (epoch seconds, 0 = never), hits, tags (JSON list), exact (its exact key), vector (float32
bytes; absent when the prompt is not cached semantically).

Knows Redis and the entry format; knows nothing about FAISS, embeddings or the decision rule.
"""

from __future__ import annotations

import json
import secrets
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
from redis.typing import EncodableT

from semantic.store.changes import ChangeFeed, RedisClient, Vectors
from semantic.store.scope import RequestScope
from semantic.store.scripts import (
    DELETE_ENTRIES,
    GET_EXACT,
    PUT_ENTRY,
    RECORD_HIT,
    REMEMBER_ALIAS,
    VETO_PAIR,
)

ENTRY_FIELDS = (
    "id",
    "scope",
    "tenant",
    "model",
    "prompt",
    "response",
    "created",
    "expires",
    "hits",
    "tags",
    "exact",
)
BATCH = 500


@dataclass(frozen=True, slots=True)
class CacheEntry:
    """A stored answer, as read back (without its vector)."""

    entry_id: str
    scope_id: str
    tenant: str
    model: str
    prompt: str
    response: str
    created: float
    expires: float | None
    hits: int
    tags: tuple[str, ...]
    exact_key: str
    """The exact key it was stored under (another one, when it was found through a remembered wording)."""


class EntryStore(Protocol):
    """What the cache needs of its source of truth."""

    feed: ChangeFeed

    async def put(
        self,
        scope: RequestScope,
        response: str,
        vector: Vectors | None,
        ttl_s: float | None,
        tags: Sequence[str],
        replace_before: float = 0.0,
    ) -> tuple[str, bool]: ...
    async def get_exact(
        self, scope: RequestScope, min_created: float, hits: int = 1
    ) -> CacheEntry | None: ...
    async def get_many(self, scope_id: str, entry_ids: Sequence[str]) -> list[CacheEntry | None]: ...
    async def record_hit(self, scope_id: str, entry_id: str) -> None: ...
    async def remember(self, scope: RequestScope, entry_id: str) -> bool: ...
    async def veto(self, scope: RequestScope, entry_id: str, stored_key: str) -> None: ...
    async def candidates(
        self, scope: RequestScope, entry_ids: Sequence[str]
    ) -> tuple[list[CacheEntry | None], frozenset[str]]: ...
    async def delete(self, scope_id: str, entry_ids: Sequence[str]) -> list[str]: ...
    async def scope_of_entry(self, entry_id: str) -> str | None: ...
    def scope_ids(self, tenant: str | None = None, model: str | None = None) -> AsyncIterator[str]: ...
    def member_batches(
        self, scope_id: str, created_before: float | None = None
    ) -> AsyncIterator[list[str]]: ...
    async def scope_size(self, scope_id: str) -> int: ...
    def scope_vectors(
        self, scope_id: str
    ) -> AsyncIterator[tuple[list[str], Vectors, list[float | None]]]: ...


class RedisEntryStore:
    """`EntryStore` over a Redis (or Redis Cluster, or Valkey) client with `decode_responses=False`."""

    def __init__(self, client: RedisClient, prefix: str = "kvgate:sc", stream_maxlen: int = 10_000) -> None:
        self.client = client
        self.prefix = prefix
        self.feed = ChangeFeed(client, f"{prefix}:changes", stream_maxlen)
        self._put = client.register_script(PUT_ENTRY)
        self._get_exact = client.register_script(GET_EXACT)
        self._record_hit = client.register_script(RECORD_HIT)
        self._remember = client.register_script(REMEMBER_ALIAS)
        self._veto = client.register_script(VETO_PAIR)
        self._delete = client.register_script(DELETE_ENTRIES)

    async def put(
        self,
        scope: RequestScope,
        response: str,
        vector: Vectors | None,
        ttl_s: float | None,
        tags: Sequence[str] = (),
        replace_before: float = 0.0,
    ) -> tuple[str, bool]:
        """Store an answer unless the scope already holds one for this exact key.

        Returns (entry id, new): the existing entry's id and False when it was there first, so
        concurrent writes of one prompt leave one entry. An existing entry created before
        `replace_before` (epoch seconds) is replaced instead. Publishes the add (and the replaced
        entry's delete) on the change stream.
        """
        entry_id = secrets.token_urlsafe(12)
        created = time.time()
        ttl_ms = 0 if ttl_s is None else max(1, round(ttl_s * 1000))
        expires = None if ttl_s is None else created + ttl_s
        values: list[EncodableT] = ["id", entry_id, "scope", scope.scope_id, "tenant", scope.tenant]
        values += [
            "model",
            scope.model,
            "prompt",
            scope.prompt,
            "response",
            response,
            "created",
            repr(created),
        ]
        values += ["expires", repr(expires or 0.0), "hits", 0, "tags", json.dumps(list(tags))]
        values += ["exact", scope.exact_key]
        if vector is not None:
            values += ["vector", np.ascontiguousarray(vector, dtype=np.float32).tobytes()]
        keys = [self._exact_key(scope.scope_id, scope.exact_key), self._entry_key(scope.scope_id, entry_id)]
        keys += [self._members_key(scope.scope_id), self._meta_key(scope.scope_id)]
        args: list[EncodableT] = [entry_id, ttl_ms, repr(created), self._entry_key(scope.scope_id, "")]
        args += [scope.tenant, scope.model, repr(replace_before)]
        stored, replaced = (_text(value) for value in await self._put(keys=keys, args=[*args, *values]))
        if stored != entry_id:
            return stored, False
        await self.client.set(self._locator_key(entry_id), scope.scope_id, px=ttl_ms or None)
        if replaced:
            await self.client.delete(self._locator_key(replaced))
            await self.feed.publish_delete(scope.scope_id, [replaced])
        if vector is not None:
            await self.feed.publish_add(scope.scope_id, entry_id, vector, expires)
        return entry_id, True

    async def get_exact(
        self, scope: RequestScope, min_created: float = 0.0, hits: int = 1
    ) -> CacheEntry | None:
        """The entry stored under the scope's exact key, if created at or after `min_created`; counts `hits`
        hits (those an in-process copy served since it was last read, and this one)."""
        keys = [self._exact_key(scope.scope_id, scope.exact_key)]
        args: list[EncodableT] = [self._entry_key(scope.scope_id, ""), repr(min_created), hits, *ENTRY_FIELDS]
        values = await self._get_exact(keys=keys, args=args)
        return None if not values else _entry(values)

    async def get_many(self, scope_id: str, entry_ids: Sequence[str]) -> list[CacheEntry | None]:
        """The entries with these ids (None where gone), in one round trip; counts no hit."""
        async with self.client.pipeline(transaction=False) as pipe:
            for entry_id in entry_ids:
                pipe.hmget(self._entry_key(scope_id, entry_id), ENTRY_FIELDS)
            replies = await pipe.execute()
        return [None if values[0] is None else _entry(values) for values in replies]

    async def candidates(
        self, scope: RequestScope, entry_ids: Sequence[str]
    ) -> tuple[list[CacheEntry | None], frozenset[str]]:
        """`get_many` of the scope's entries, and the exact keys of the stored prompts this wording was reported
        wrongly served (never to serve it again), in one round trip."""
        async with self.client.pipeline(transaction=False) as pipe:
            for entry_id in entry_ids:
                pipe.hmget(self._entry_key(scope.scope_id, entry_id), ENTRY_FIELDS)
            pipe.smembers(self._vetoes_key(scope.scope_id, scope.exact_key))
            *replies, members = await pipe.execute()
        entries = [None if values[0] is None else _entry(values) for values in replies]
        return entries, frozenset(_text(member) for member in members)

    async def record_hit(self, scope_id: str, entry_id: str) -> None:
        await self._record_hit(keys=[self._entry_key(scope_id, entry_id)])

    async def remember(self, scope: RequestScope, entry_id: str) -> bool:
        """Point this request's exact key at `entry_id` (of the same scope) for the entry's lifetime."""
        keys = [
            self._exact_key(scope.scope_id, scope.exact_key),
            self._entry_key(scope.scope_id, entry_id),
            self._aliases_key(scope.scope_id, entry_id),
            self._vetoes_key(scope.scope_id, scope.exact_key),
        ]
        return bool(await self._remember(keys=keys, args=[entry_id, scope.exact_key]))

    async def veto(self, scope: RequestScope, entry_id: str, stored_key: str) -> None:
        """Never again serve this request's wording the prompt stored under `stored_key` (of its scope);
        forget the wording's remembered alias to `entry_id`, if it has one."""
        keys = [
            self._exact_key(scope.scope_id, scope.exact_key),
            self._vetoes_key(scope.scope_id, scope.exact_key),
            self._aliases_key(scope.scope_id, entry_id),
        ]
        await self._veto(keys=keys, args=[entry_id, stored_key, scope.exact_key])

    async def delete(self, scope_id: str, entry_ids: Sequence[str]) -> list[str]:
        """Delete entries of one scope (also forgetting ids already gone); returns the ids that existed."""
        deleted: list[str] = []
        for start in range(0, len(entry_ids), BATCH):
            batch = list(entry_ids[start : start + BATCH])
            keys = [self._members_key(scope_id), self._meta_key(scope_id)]
            args = [
                self._entry_key(scope_id, ""),
                self._exact_key(scope_id, ""),
                self._aliases_key(scope_id, ""),
            ]
            args += batch
            gone = [_text(entry_id) for entry_id in await self._delete(keys=keys, args=args)]
            if gone:
                async with self.client.pipeline(transaction=False) as pipe:
                    for entry_id in gone:  # one DEL each: locators live on other slots
                        pipe.delete(self._locator_key(entry_id))
                    await pipe.execute()
                await self.feed.publish_delete(scope_id, gone)
            deleted += gone
        return deleted

    async def scope_of_entry(self, entry_id: str) -> str | None:
        """The scope an entry id belongs to (from its locator), or None when unknown."""
        scope_id = await self.client.get(self._locator_key(entry_id))
        return None if scope_id is None else _text(scope_id)

    async def scope_ids(self, tenant: str | None = None, model: str | None = None) -> AsyncIterator[str]:
        """Every scope holding entries, optionally only a tenant's / model's: SCAN over the meta keys
        (never KEYS), on every node of a cluster, in bounded batches."""
        pattern = f"{_glob_escape(self.prefix)}:{{*}}:meta"
        meta_keys: list[bytes] = []
        async for key in self.client.scan_iter(match=pattern, count=1000):
            meta_keys.append(key)
            if len(meta_keys) == BATCH:
                for scope_id in await self._filter_scopes(meta_keys, tenant, model):
                    yield scope_id
                meta_keys = []
        for scope_id in await self._filter_scopes(meta_keys, tenant, model):
            yield scope_id

    async def member_batches(
        self, scope_id: str, created_before: float | None = None
    ) -> AsyncIterator[list[str]]:
        """The scope's entry ids (created before `created_before`, if given) in batches of at most `BATCH`."""
        cutoff = float("inf") if created_before is None else created_before
        batch: list[str] = []
        async for member, created in self.client.zscan_iter(self._members_key(scope_id), count=BATCH):
            if created < cutoff:
                batch.append(_text(member))
            if len(batch) == BATCH:
                yield batch
                batch = []
        if batch:
            yield batch

    async def scope_size(self, scope_id: str) -> int:
        return int(await self.client.zcard(self._members_key(scope_id)))

    async def scope_vectors(
        self, scope_id: str
    ) -> AsyncIterator[tuple[list[str], Vectors, list[float | None]]]:
        """The scope's entries that have a vector, in batches: ids, vectors (len(ids), dimension), expiries.

        Members whose entry has expired are dropped from the scope on the way.
        """
        batch: list[str] = []
        async for member, _created in self.client.zscan_iter(self._members_key(scope_id), count=BATCH):
            batch.append(_text(member))
            if len(batch) == BATCH:
                yield await self._vectors(scope_id, batch)
                batch = []
        if batch:
            yield await self._vectors(scope_id, batch)

    async def _vectors(
        self, scope_id: str, entry_ids: list[str]
    ) -> tuple[list[str], Vectors, list[float | None]]:
        async with self.client.pipeline(transaction=False) as pipe:
            for entry_id in entry_ids:
                pipe.hmget(self._entry_key(scope_id, entry_id), ["id", "vector", "expires"])
            replies = await pipe.execute()
        gone = [entry_id for entry_id, (found, _, _) in zip(entry_ids, replies, strict=True) if found is None]
        if gone:
            await self.delete(scope_id, gone)
        ids: list[str] = []
        rows: list[Vectors] = []
        expiries: list[float | None] = []
        for entry_id, (_, vector, expires) in zip(entry_ids, replies, strict=True):
            if vector is not None:
                ids.append(entry_id)
                rows.append(np.frombuffer(vector, dtype=np.float32))
                expiries.append(float(expires) or None)
        return ids, np.vstack(rows) if rows else np.zeros((0, 0), dtype=np.float32), expiries

    async def _filter_scopes(
        self, meta_keys: list[bytes], tenant: str | None, model: str | None
    ) -> list[str]:
        if not meta_keys:
            return []
        async with self.client.pipeline(transaction=False) as pipe:
            for key in meta_keys:
                pipe.hmget(key, ["tenant", "model"])
            replies = await pipe.execute()
        found: list[str] = []
        for key, (scope_tenant, scope_model) in zip(meta_keys, replies, strict=True):
            if (tenant is None or _text(scope_tenant) == tenant) and (
                model is None or _text(scope_model) == model
            ):
                found.append(_text(key).rsplit("{", 1)[1].split("}", 1)[0])
        return found

    def _entry_key(self, scope_id: str, entry_id: str) -> str:
        return f"{self.prefix}:{{{scope_id}}}:e:{entry_id}"

    def _exact_key(self, scope_id: str, exact_key: str) -> str:
        return f"{self.prefix}:{{{scope_id}}}:x:{exact_key}"

    def _aliases_key(self, scope_id: str, entry_id: str) -> str:
        return f"{self.prefix}:{{{scope_id}}}:a:{entry_id}"

    def _vetoes_key(self, scope_id: str, exact_key: str) -> str:
        return f"{self.prefix}:{{{scope_id}}}:v:{exact_key}"

    def _members_key(self, scope_id: str) -> str:
        return f"{self.prefix}:{{{scope_id}}}:m"

    def _meta_key(self, scope_id: str) -> str:
        return f"{self.prefix}:{{{scope_id}}}:meta"

    def _locator_key(self, entry_id: str) -> str:
        return f"{self.prefix}:id:{{{entry_id}}}"


def _entry(values: Sequence[Any]) -> CacheEntry:
    (entry_id, scope_id, tenant, model, prompt, response, created, expires, hits, tags, exact) = (
        _text(value) if value is not None else "" for value in values
    )
    return CacheEntry(
        entry_id=entry_id,
        scope_id=scope_id,
        tenant=tenant,
        model=model,
        prompt=prompt,
        response=response,
        created=float(created),
        expires=float(expires) or None,
        hits=int(hits),
        tags=tuple(json.loads(tags)),
        exact_key=exact,
    )


def _glob_escape(text: str) -> str:
    return "".join(f"\\{char}" if char in "*?[]\\" else char for char in text)


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
