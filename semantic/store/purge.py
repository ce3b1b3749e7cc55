"""Purging cache entries by selector: entry id, scope, tenant, model, tag, age, or a combination.

Built on the store's primitives (find scopes, list members, read, delete), so the policy lives once
here and works on any `EntryStore`. Scopes are found by SCAN, members read and deleted in bounded
batches; nothing here ever flushes a database. Every delete goes through the store, which tells the
other processes on the change stream.

Knows the `EntryStore` protocol; knows nothing about Redis commands, FAISS or HTTP.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, fields

from semantic.store.entries import CacheEntry, EntryStore

Deleted = Callable[[str, list[str]], None]


@dataclass(frozen=True, slots=True)
class PurgeSelector:
    """Which entries to purge: every condition given must hold. An empty selector is refused."""

    entry_id: str | None = None
    scope_id: str | None = None
    tenant: str | None = None
    model: str | None = None
    tag: str | None = None
    older_than_s: float | None = None

    def __post_init__(self) -> None:
        if all(getattr(self, field.name) is None for field in fields(self)):
            raise ValueError("a purge needs at least one selector (entry id, scope, tenant, model, tag, age)")
        if self.older_than_s is not None and self.older_than_s < 0:
            raise ValueError("older_than_s must not be negative")

    def matches(self, entry: CacheEntry, now: float) -> bool:
        return (
            (self.scope_id is None or entry.scope_id == self.scope_id)
            and (self.tenant is None or entry.tenant == self.tenant)
            and (self.model is None or entry.model == self.model)
            and (self.tag is None or self.tag in entry.tags)
            and (self.older_than_s is None or entry.created < now - self.older_than_s)
        )


async def purge(store: EntryStore, selector: PurgeSelector, on_deleted: Deleted | None = None) -> int:
    """Delete every entry the selector matches; returns how many went.

    `on_deleted(scope_id, ids)` is called after each deleted batch, so a caller can update its own
    index as the purge goes rather than wait for the change stream.
    """
    now = time.time()
    count = 0
    async for scope_id in _scopes(store, selector):
        async for entry_ids in _matching(store, scope_id, selector, now):
            gone = await store.delete(scope_id, entry_ids)
            count += len(gone)
            if gone and on_deleted is not None:
                on_deleted(scope_id, gone)
    return count


async def _scopes(store: EntryStore, selector: PurgeSelector) -> AsyncIterator[str]:
    if selector.entry_id is not None:
        scope_id = await store.scope_of_entry(selector.entry_id)
        if scope_id is not None:
            yield scope_id
        return
    async for scope_id in store.scope_ids(selector.tenant, selector.model):
        if selector.scope_id is None or scope_id == selector.scope_id:
            yield scope_id


async def _matching(
    store: EntryStore, scope_id: str, selector: PurgeSelector, now: float
) -> AsyncIterator[list[str]]:
    """Batches of the scope's entry ids that the selector matches."""
    if selector.entry_id is not None:
        candidates: AsyncIterator[list[str]] = _single(selector.entry_id)
    else:
        cutoff = None if selector.older_than_s is None else now - selector.older_than_s
        candidates = store.member_batches(scope_id, cutoff)
    must_read = selector.entry_id is not None or selector.tag is not None  # only the entry itself tells
    async for entry_ids in candidates:
        if must_read:
            entries = await store.get_many(scope_id, entry_ids)
            entry_ids = [entry.entry_id for entry in entries if entry and selector.matches(entry, now)]
        if entry_ids:
            yield entry_ids


async def _single(entry_id: str) -> AsyncIterator[list[str]]:
    yield [entry_id]
