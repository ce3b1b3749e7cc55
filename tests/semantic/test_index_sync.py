"""IndexSync on a real Redis: large scopes are built as HNSW at start-up, and a scope that grows past
the threshold or fills with tombstones is rebuilt in the background while lookups go on."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from semantic.index import IndexConfig
from semantic.store import RedisEntryStore
from semantic.sync import IndexSync
from tests.semantic.builders import make_scope

pytestmark = [pytest.mark.redis]

DIMENSION = 16


def unit_vectors(count: int) -> np.ndarray:
    vectors = np.random.default_rng(1).standard_normal((count, DIMENSION)).astype(np.float32)
    return vectors / np.linalg.norm(vectors, axis=1, keepdims=True)


async def fill(store: RedisEntryStore, vectors: np.ndarray) -> tuple[str, list[str]]:
    entry_ids = []
    for row, vector in enumerate(vectors):
        entry_id, _ = await store.put(make_scope(f"question {row}"), "{}", vector, None)
        entry_ids.append(entry_id)
    return make_scope().scope_id, entry_ids


async def test_a_start_up_rebuild_builds_a_large_scope_as_hnsw(store: RedisEntryStore) -> None:
    vectors = unit_vectors(60)
    scope_id, entry_ids = await fill(store, vectors)
    sync = IndexSync(store, IndexConfig(DIMENSION, hnsw_threshold=50, build_threads=2))
    try:
        assert await sync.start() == 60
        assert sync.index.scope_kind(scope_id) == "hnsw"
        assert sync.index.search(scope_id, vectors[33], 1)[0].entry_id == entry_ids[33]
    finally:
        await sync.stop()


async def test_growing_and_purged_scopes_are_rebuilt_in_the_background(store: RedisEntryStore) -> None:
    vectors = unit_vectors(80)
    scope_id, entry_ids = await fill(store, vectors[:30])
    sync = IndexSync(store, IndexConfig(DIMENSION, hnsw_threshold=50, tombstone_ratio=0.2))
    try:
        await sync.start()
        assert sync.index.scope_kind(scope_id) == "flat"
        for row in range(30, 80):  # as the cache does after each store.put
            sync.add_local(scope_id, f"local-{row}", vectors[row], None)
        assert sync.index.scope_kind(scope_id) == "flat"  # the copy runs off the loop, not in add_local
        assert sync.index.search(scope_id, vectors[70], 1)[0].entry_id == "local-70"
        await sync.settle()
        assert sync.index.scope_kind(scope_id) == "hnsw" and sync.index.scope_size(scope_id) == 80

        await store.delete(scope_id, entry_ids[:20])  # a purge, seen through the change stream
        scope = sync.index.scope(scope_id)
        assert scope is not None
        for _ in range(100):
            if sync.index.scope_size(scope_id) == 60:
                break
            await asyncio.sleep(0.05)
        await sync.settle()
        assert scope.tombstones < 20 and scope.kind == "hnsw"  # 20 of 80 dead > 20 %: rebuilt
        assert sync.index.search(scope_id, vectors[25], 1)[0].entry_id == entry_ids[25]
        assert not {n.entry_id for n in sync.index.search(scope_id, vectors[5], 10)} & set(entry_ids[:20])
    finally:
        await sync.stop()
