"""Keeps this process's FAISS index equal to what Redis holds: rebuild at start, then tail the stream.

`rebuild` builds a fresh `VectorIndex` from the store and swaps it in whole, then the follower replays
the change stream from where the stream stood when the rebuild began, so nothing written during the
rebuild is lost (replaying an add or delete twice is harmless). The follower also drops entries from
the index as their TTL passes, and rebuilds when it finds it has missed events.

The FAISS work of a rebuild runs on a builder thread in chunks of `BUILD_CHUNK` vectors, so the event
loop keeps serving from the old index while a large scope's HNSW graph is built with every core. So
do the rebuilds a single scope asks for as it changes (flat -> HNSW past the threshold, tombstones
dropped; see `ScopeIndex`): one scope of a million vectors takes minutes, and blocking the loop for
that would stall every lookup of every replica following the same stream.

Knows the store, the change feed and the index; knows nothing about prompts, rules or HTTP.
"""

from __future__ import annotations

import asyncio
import heapq
import logging
import time
from dataclasses import replace

import numpy as np
from redis.exceptions import RedisError

from semantic.index.epochs import ChangeEpochs
from semantic.index.scope_index import RebuildJob, ScopeIndex
from semantic.index.vector_index import IndexBuilder, IndexConfig, RebuildProgress, VectorIndex
from semantic.store.changes import START, Change, StreamId
from semantic.store.entries import EntryStore

log = logging.getLogger(__name__)

BUILD_CHUNK = 65_536  # vectors per builder call: big enough for HNSW's parallel insert, ~100 MB at 384-d
CATCH_UP_ON_LOOP = (
    256  # a rebuilt scope's arrivals added on the loop at the swap; more go to the builder first
)
REBUILD_RETRY_S = 60.0  # after a failed scope rebuild (e.g. out of memory), before the scope is due again


class IndexSync:
    """Owns `index` (replaced on each rebuild: read it through this object, never keep it)."""

    def __init__(self, store: EntryStore, config: IndexConfig, *, block_ms: int = 1000) -> None:
        self.store = store
        self.config = config
        self.block_ms = block_ms
        self.index = VectorIndex(config)
        self.applied = 0  # events applied by the follower, for tests and metrics
        self.epochs = ChangeEpochs()
        self._after: StreamId = START
        self._generation = 0
        self._expiries: list[tuple[float, str, str]] = []  # heap of (expires, scope id, entry id)
        self._task: asyncio.Task[None] | None = None
        self._stopping = False
        self._last_error_log = 0.0
        self._builder = IndexBuilder(config)
        self._scope_rebuilds: set[asyncio.Task[None]] = set()

    @property
    def rebuilds_running(self) -> int:
        """Scope rebuilds in the background now (for metrics)."""
        return len(self._scope_rebuilds)

    @property
    def following(self) -> bool:
        return self._task is not None and not self._task.done()

    async def start(self, progress: RebuildProgress | None = None) -> int:
        """Rebuild, then follow the stream in a background task. Returns the number of vectors indexed."""
        indexed = await self.rebuild(progress)
        if not self.following:
            self._task = asyncio.create_task(self._follow(), name="semantic-index-follower")
        return indexed

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            self._stopping = True
            # A cancel can land inside redis-py's blocking XREAD, which may swallow it while it drops
            # the connection; the flag ends the loop on its next turn, and a second cancel covers the rest.
            while not task.done():
                task.cancel()
                await asyncio.wait({task}, timeout=self.block_ms / 1000 + 1.0)
            self._stopping = False
        await self._cancel_scope_rebuilds()
        self._builder.close()  # a build already running cannot be interrupted: it ends on its own

    async def settle(self) -> None:
        """Wait for the scope rebuilds in flight (and any they make due) to finish."""
        while self._scope_rebuilds:
            await asyncio.gather(*self._scope_rebuilds, return_exceptions=True)

    async def rebuild(self, progress: RebuildProgress | None = None) -> int:
        """Index every stored vector afresh; `progress(done, total)` is called as batches load.

        Scope rebuilds in flight are cancelled first (the index they would swap into is about to be
        replaced), so the chunks do not queue behind them on the builder thread; one whose FAISS
        build has already started still runs to its end there.
        """
        await self._cancel_scope_rebuilds()
        tail = await self.store.feed.last_id()
        fresh = VectorIndex(self.config)
        expiries: list[tuple[float, str, str]] = []
        scope_ids = [scope_id async for scope_id in self.store.scope_ids()]
        sizes = [await self.store.scope_size(scope_id) for scope_id in scope_ids]
        total = sum(sizes)
        done = 0
        if progress is not None:
            progress(done, total)
        for scope_id, size in zip(scope_ids, sizes, strict=True):
            chunk_ids: list[str] = []
            chunk_vectors: list[np.ndarray] = []
            async for entry_ids, vectors, expires in self.store.scope_vectors(scope_id):
                if entry_ids:
                    chunk_ids += entry_ids
                    chunk_vectors.append(vectors)
                if len(chunk_ids) >= BUILD_CHUNK:
                    await self._builder.run(fresh.add, scope_id, chunk_ids, np.vstack(chunk_vectors), size)
                    chunk_ids, chunk_vectors = [], []
                expiries += [
                    (at, scope_id, entry_id) for entry_id, at in zip(entry_ids, expires, strict=True) if at
                ]
                done += len(entry_ids)
                if progress is not None:
                    progress(min(done, total), total)
            if chunk_ids:
                await self._builder.run(fresh.add, scope_id, chunk_ids, np.vstack(chunk_vectors), size)
        if progress is not None:
            progress(total, total)
        heapq.heapify(expiries)
        self.index, self._expiries = fresh, expiries
        self._after = tail
        self._generation += 1
        self.epochs.all_moved()
        self._start_due_rebuilds()  # a scope that grew past the threshold while we read it
        return len(fresh)

    def apply(self, change: Change) -> None:
        """Bring one stream event into the index (idempotent)."""
        if change.op == "add" and change.vector is not None:
            self.index.add(change.scope_id, list(change.entry_ids), change.vector.reshape(1, -1))
            if change.expires is not None:
                heapq.heappush(self._expiries, (change.expires, change.scope_id, change.entry_ids[0]))
        elif change.op == "delete":
            self.index.remove(change.scope_id, list(change.entry_ids))
            self.epochs.moved(change.scope_id)
        self._start_due_rebuilds()

    def add_local(self, scope_id: str, entry_id: str, vector: np.ndarray, expires: float | None) -> None:
        """Index an entry this process just stored, without waiting for its event to come back."""
        self.index.add(scope_id, [entry_id], vector.reshape(1, -1))
        if expires is not None:
            heapq.heappush(self._expiries, (expires, scope_id, entry_id))
        self._start_due_rebuilds()

    def drop_expired(self, now: float | None = None) -> int:
        """Remove entries whose TTL has passed from the index; Redis has already dropped them."""
        now = time.time() if now is None else now
        dropped = 0
        while self._expiries and self._expiries[0][0] <= now:
            _, scope_id, entry_id = heapq.heappop(self._expiries)
            dropped += self.index.remove(scope_id, [entry_id])
        self._start_due_rebuilds()
        return dropped

    def remove_local(self, scope_id: str, entry_ids: list[str]) -> int:
        """Drop entries this process found gone or purged, without waiting for the stream."""
        removed = self.index.remove(scope_id, entry_ids)
        self.epochs.moved(scope_id)
        self._start_due_rebuilds()
        return removed

    def _start_due_rebuilds(self) -> None:
        for scope_id, scope in self.index.take_due():
            self._spawn_rebuild(scope_id, scope)

    def _spawn_rebuild(self, scope_id: str, scope: ScopeIndex) -> None:
        try:
            # Claims the scope now: no second rebuild can start before this task runs.
            job = scope.begin_rebuild()
        except Exception:  # e.g. no memory for the snapshot: the caller's add or remove still stands
            scope.abandon_rebuild(retry_in_s=REBUILD_RETRY_S)
            log.exception("snapshotting a semantic index scope (%d vectors) for a rebuild failed", len(scope))
            return
        task = asyncio.get_running_loop().create_task(
            self._rebuild_scope(scope_id, scope, job), name="semantic-scope-rebuild"
        )
        self._scope_rebuilds.add(task)

        def done(task: asyncio.Task[None]) -> None:
            self._scope_rebuilds.discard(task)
            if task.cancelled():  # perhaps before it started: release the claim (harmless if released)
                scope.abandon_rebuild()

        task.add_done_callback(done)

    async def _rebuild_scope(self, scope_id: str, scope: ScopeIndex, job: RebuildJob) -> None:
        """Build on the builder thread, catch up there with what arrived meanwhile, swap on the loop.

        The scope serves from its current index throughout; only the snapshot (before) and the last
        few arrivals and the swap (after) run on the loop."""
        try:
            built = await self._builder.run(scope.build, job)
            # The snapshot's copy of the vectors is no longer needed: 1.5 GB at a million.
            job = replace(job, vectors=np.zeros((0, self.config.dimension), dtype=np.float32))
            caught_up: list[np.ndarray] = []  # arrivals already added to `built`, in label order
            while True:
                labels, vectors = scope.arrivals(int(caught_up[-1][-1]) + 1 if caught_up else job.next_label)
                if len(labels) <= CATCH_UP_ON_LOOP:
                    break
                await self._builder.run(built.add_with_ids, vectors, labels)
                caught_up.append(labels)
            if self.index.scope(scope_id) is not scope:  # emptied, or a full rebuild replaced the index
                scope.abandon_rebuild()
                return
            scope.finish_rebuild(job, built, np.concatenate(caught_up) if caught_up else None)
        except asyncio.CancelledError:
            scope.abandon_rebuild()
            raise
        except Exception:  # e.g. out of memory: keep serving from the current index, retry later
            scope.abandon_rebuild(retry_in_s=REBUILD_RETRY_S)
            log.exception("rebuilding the semantic index of a scope (%d vectors) failed", len(job.labels))
            return
        if scope.due:  # enough changed during the build to need another
            self._spawn_rebuild(scope_id, scope)

    async def _cancel_scope_rebuilds(self) -> None:
        for rebuild in list(self._scope_rebuilds):  # their scopes keep serving from their current index
            rebuild.cancel()
        await asyncio.gather(*self._scope_rebuilds, return_exceptions=True)

    async def _follow(self) -> None:
        while not self._stopping:
            try:
                generation, after = self._generation, self._after
                changes = await self.store.feed.read(after, block_ms=self.block_ms)
                if generation != self._generation:
                    continue  # a rebuild swapped the index while we waited: replay from its tail
                if await self.store.feed.missed_since(after):
                    log.warning("semantic index missed stream events; rebuilding from the store")
                    await self.rebuild()
                    continue
                for change in changes:
                    self.apply(change)
                    self._after = change.stream_id
                self.applied += len(changes)
                self.drop_expired()
            except asyncio.CancelledError:
                raise
            except (RedisError, OSError) as error:
                self._log_once_per_interval(error)
                await asyncio.sleep(1.0)

    def _log_once_per_interval(self, error: Exception, interval_s: float = 30.0) -> None:
        now = time.monotonic()
        if now - self._last_error_log >= interval_s:
            self._last_error_log = now
            log.warning("semantic index follower cannot read the change stream: %s", error)
