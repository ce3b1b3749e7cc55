"""IndexSync on a real Redis: large scopes are built as HNSW at start-up, and a scope that grows past
the threshold or fills with tombstones is rebuilt in the background while lookups go on."""

from __future__ import annotations

import asyncio
import gc
import time
import weakref
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import numpy as np
import pytest

from semantic.index import sync as sync_module
from semantic.index.scope_index import RebuildJob, ScopeIndex
from semantic.index.sync import IndexSync
from semantic.index.vector_index import IndexConfig
from semantic.store.entries import RedisEntryStore
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


@asynccontextmanager
async def started(store: RedisEntryStore, **config: Any) -> AsyncIterator[IndexSync]:
    """An `IndexSync` over `store`, started (rebuilt, following the stream) and stopped after."""
    sync = IndexSync(store, IndexConfig(DIMENSION, **config))
    await sync.start()
    try:
        yield sync
    finally:
        await sync.stop()


def index_one_by_one(sync: IndexSync, vectors: np.ndarray, rows: range, scope_id: str = "scope") -> None:
    """Index `vectors[row]` as entry `e{row}` for each row, one at a time, as the cache does after each put."""
    for row in rows:
        sync.add_local(scope_id, f"e{row}", vectors[row], None)


def slow_builds(monkeypatch: pytest.MonkeyPatch, seconds: float) -> None:
    """Make every scope build take `seconds` longer, as a large scope's would."""
    build = ScopeIndex.build

    def slow_build(self: ScopeIndex, job: RebuildJob) -> object:
        time.sleep(seconds)
        return build(self, job)

    monkeypatch.setattr(ScopeIndex, "build", slow_build)


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
    async with started(store, hnsw_threshold=50, tombstone_ratio=0.2) as sync:
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


async def test_a_scope_crossing_the_threshold_is_rebuilt_once(store: RedisEntryStore) -> None:
    vectors = unit_vectors(80)
    async with started(store, hnsw_threshold=50) as sync:
        # every add past the 50th finds the scope due until a rebuild claims it
        index_one_by_one(sync, vectors, range(80))
        assert len(sync._scope_rebuilds) == 1
        await sync.settle()
        assert sync.index.scope_kind("scope") == "hnsw" and sync.index.scope_size("scope") == 80


async def test_a_failed_build_keeps_the_scope_serving_and_is_retried_later(
    store: RedisEntryStore, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    vectors = unit_vectors(60)

    def out_of_memory(self: ScopeIndex, job: object) -> None:
        raise MemoryError("no room for the new graph")

    async with started(store, hnsw_threshold=50) as sync:
        with monkeypatch.context() as patch:
            patch.setattr(ScopeIndex, "build", out_of_memory)
            index_one_by_one(sync, vectors, range(60))
            await sync.settle()
        assert "rebuilding the semantic index of a scope" in caplog.text
        scope = sync.index.scope("scope")
        assert scope is not None and scope.kind == "flat" and not scope.due  # backing off
        assert sync.index.search("scope", vectors[59], 1)[0].entry_id == "e59"
        scope.abandon_rebuild(retry_in_s=0.0)  # as if the back-off had passed
        sync.add_local("scope", "e60", unit_vectors(61)[60], None)
        await sync.settle()
        assert scope.kind == "hnsw"


async def test_a_scope_emptied_or_replaced_during_its_rebuild_is_left_alone(store: RedisEntryStore) -> None:
    vectors = unit_vectors(60)
    async with started(store, hnsw_threshold=50) as sync:
        index_one_by_one(sync, vectors, range(60))
        emptied = sync.index.scope("scope")
        sync.remove_local("scope", [f"e{row}" for row in range(60)])  # before the build finishes
        await sync.settle()
        assert emptied is not None and emptied.kind == "flat" and sync.index.scope("scope") is None

        index_one_by_one(sync, vectors, range(60), scope_id="again")
        assert sync._scope_rebuilds
        assert await sync.rebuild() == 0  # the store holds none of these: the full rebuild wins
        await sync.settle()
        assert sync.index.scope("again") is None and not sync._scope_rebuilds


async def test_stop_during_a_rebuild_returns_and_the_scope_still_serves(
    store: RedisEntryStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    sync = IndexSync(store, IndexConfig(DIMENSION, hnsw_threshold=50))
    vectors = unit_vectors(60)
    slow_builds(monkeypatch, 0.5)  # still running when stop() comes
    await sync.start()
    index_one_by_one(sync, vectors, range(60))
    await asyncio.sleep(0.1)  # the build has started on the builder thread
    await sync.stop()
    assert not sync._scope_rebuilds
    scope = sync.index.scope("scope")
    assert scope is not None and scope.due  # cancelled before its swap: due again, still searchable
    assert sync.index.search("scope", vectors[3], 1)[0].entry_id == "e3"


async def test_many_arrivals_during_a_build_are_caught_up_before_the_swap(
    store: RedisEntryStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sync_module, "CATCH_UP_ON_LOOP", 5)  # more than 5 arrivals go to the builder first
    vectors = unit_vectors(100)
    slow_builds(monkeypatch, 0.3)
    async with started(store, hnsw_threshold=50) as sync:
        index_one_by_one(sync, vectors, range(50))
        await asyncio.sleep(0.05)  # building from a snapshot of 50
        index_one_by_one(sync, vectors, range(50, 100))
        await sync.settle()
        scope = sync.index.scope("scope")
        assert scope is not None and scope.kind == "hnsw" and len(scope) == 100
        for row in (0, 49, 50, 99):
            assert sync.index.search("scope", vectors[row], 1)[0].entry_id == f"e{row}"


async def test_the_snapshot_is_freed_once_built(
    store: RedisEntryStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    vectors = unit_vectors(60)
    snapshots: list[weakref.ref[np.ndarray]] = []
    begin = ScopeIndex.begin_rebuild

    def recording_begin(self: ScopeIndex) -> RebuildJob:
        job = begin(self)
        snapshots.append(weakref.ref(job.vectors))
        return job

    monkeypatch.setattr(ScopeIndex, "begin_rebuild", recording_begin)
    async with started(store, hnsw_threshold=50) as sync:
        index_one_by_one(sync, vectors, range(60))
        await sync.settle()
        gc.collect()
        assert len(snapshots) == 1 and snapshots[0]() is None  # at a million vectors, 1.5 GB


async def test_a_failed_snapshot_does_not_fail_the_insert_that_made_the_scope_due(
    store: RedisEntryStore, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    vectors = unit_vectors(60)

    def no_memory(self: ScopeIndex) -> RebuildJob:
        raise MemoryError("no room for the snapshot")

    monkeypatch.setattr(ScopeIndex, "begin_rebuild", no_memory)
    async with started(store, hnsw_threshold=50) as sync:
        index_one_by_one(sync, vectors, range(60))
        assert sync.index.scope_size("scope") == 60 and not sync._scope_rebuilds
        assert caplog.text.count("snapshotting a semantic index scope") == 1  # then it backs off
