"""FAISS indexes over the stored prompts' vectors, one `ScopeIndex` per scope: the rebuildable half.

Knows vectors, entry ids and scope ids; knows nothing about Redis, prompts or answers. Everything
here can be thrown away and rebuilt from the store (`IndexSync.rebuild`).

Not thread-safe: the cache calls it from the event loop only, so a search never races an update.
The slow FAISS work (a start-up rebuild into a fresh `VectorIndex` that nothing else sees yet, a
scope's `build` step) goes to `IndexBuilder`'s thread, with every core, while the loop keeps
serving from what is already built.
"""

from __future__ import annotations

import asyncio
import os
import queue
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from typing import ParamSpec, TypeVar, cast

import faiss

from semantic.index.scope_index import IndexConfig, Neighbour, ScopeIndex, Vectors

__all__ = ["IndexBuilder", "IndexConfig", "Neighbour", "RebuildProgress", "VectorIndex"]

RebuildProgress = Callable[[int, int], None]
P = ParamSpec("P")
R = TypeVar("R")


class VectorIndex:
    """Every scope's `ScopeIndex`, keyed by scope id; a scope appears on its first add."""

    def __init__(self, config: IndexConfig) -> None:
        self.config = config
        self._scopes: dict[str, ScopeIndex] = {}
        self._due: set[str] = set()  # scopes whose last add or remove made a rebuild due
        if config.search_threads is not None:
            # Single-query searches gain nothing from OpenMP, and on a busy box its spinning threads
            # make a 5 ms search take 30 ms. The setting is per calling thread (libgomp).
            faiss.omp_set_num_threads(config.search_threads)

    def __len__(self) -> int:
        return sum(len(scope) for scope in self._scopes.values())

    def scope_size(self, scope_id: str) -> int:
        scope = self._scopes.get(scope_id)
        return 0 if scope is None else len(scope)

    def scope_kind(self, scope_id: str) -> str | None:
        scope = self._scopes.get(scope_id)
        return None if scope is None else scope.kind

    def scope(self, scope_id: str) -> ScopeIndex | None:
        return self._scopes.get(scope_id)

    def contains(self, scope_id: str, entry_id: str) -> bool:
        scope = self._scopes.get(scope_id)
        return scope is not None and entry_id in scope

    def add(self, scope_id: str, entry_ids: Sequence[str], vectors: Vectors, expected_size: int = 0) -> int:
        """Add to a scope; `expected_size` sizes a scope this call creates (see `ScopeIndex`)."""
        if len(entry_ids) != len(vectors):
            raise ValueError(f"{len(entry_ids)} ids for {len(vectors)} vectors")
        scope = self._scopes.get(scope_id)
        if scope is None:
            scope = self._scopes[scope_id] = ScopeIndex(self.config, expected_size)
        added = scope.add(entry_ids, vectors)
        if scope.due:
            self._due.add(scope_id)
        return added

    def remove(self, scope_id: str, entry_ids: Sequence[str]) -> int:
        scope = self._scopes.get(scope_id)
        if scope is None:
            return 0
        removed = scope.remove(entry_ids)
        if not scope:
            del self._scopes[scope_id]
            self._due.discard(scope_id)
        elif scope.due:
            self._due.add(scope_id)
        return removed

    def take_due(self) -> list[tuple[str, ScopeIndex]]:
        """The scopes that need a rebuild now, with their ids; the caller should `begin_rebuild` each
        at once (a scope stays `due`, and is handed out again, until one has begun)."""
        due = [
            (scope_id, scope) for scope_id in self._due if (scope := self._scopes.get(scope_id)) and scope.due
        ]
        self._due.clear()
        return due

    def search(self, scope_id: str, vector: Vectors, k: int) -> list[Neighbour]:
        scope = self._scopes.get(scope_id)
        return [] if scope is None else scope.search(vector, k)

    def clear(self) -> None:
        self._scopes.clear()
        self._due.clear()


class IndexBuilder:
    """One daemon worker thread, with `config.build_threads` OpenMP threads, for FAISS work off the loop.

    OpenMP's thread count is per calling thread (libgomp), so this thread's setting leaves the event
    loop's single-threaded searches alone. Jobs run one at a time, in the order they are given. The
    thread is a daemon: a FAISS build cannot be interrupted, and a process shutting down should not
    wait minutes for one whose result it would throw away.
    """

    def __init__(self, config: IndexConfig) -> None:
        self.threads = config.build_threads or len(os.sched_getaffinity(0)) or 1
        self._jobs: queue.SimpleQueue[tuple[Callable[[], object], Future[object]] | None] | None = None

    async def run(self, work: Callable[P, R], *args: P.args, **kwargs: P.kwargs) -> R:
        """`work(*args, **kwargs)` on the builder thread; what it touches must not be used meanwhile.

        Cancelling the caller drops a job that has not started; one that has runs to its end."""
        if self._jobs is None:
            self._jobs = queue.SimpleQueue()
            threading.Thread(target=self._serve, args=(self._jobs,), name="faiss-build", daemon=True).start()
        done: Future[object] = Future()
        self._jobs.put((lambda: work(*args, **kwargs), done))
        return cast(R, await asyncio.wrap_future(done))

    def close(self) -> None:
        """Let the thread end after its current job; a later `run` starts a new one."""
        jobs, self._jobs = self._jobs, None
        if jobs is not None:
            jobs.put(None)

    def _serve(self, jobs: queue.SimpleQueue[tuple[Callable[[], object], Future[object]] | None]) -> None:
        faiss.omp_set_num_threads(self.threads)
        while (job := jobs.get()) is not None:
            work, done = job
            if not done.set_running_or_notify_cancel():
                continue  # its caller was cancelled before it started
            try:
                done.set_result(work())
            except BaseException as error:  # handed to the awaiting caller
                done.set_exception(error)
            del job, work, done  # a finished job's arguments (a scope's snapshot) must not outlive it
