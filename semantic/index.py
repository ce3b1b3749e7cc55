"""FAISS indexes over the stored prompts' vectors, one per scope: the in-memory, rebuildable half.

Knows vectors, entry ids and scope ids; knows nothing about Redis, prompts or answers. Everything
here can be thrown away and rebuilt from the store (`SemanticCache.rebuild`).

A scope is searched exactly (inner product over unit vectors == cosine, `IndexFlatIP` in an
`IndexIDMap2`) until it holds `hnsw_threshold` vectors; past that it is rebuilt as HNSW. HNSW cannot
remove ids, so removals there are tombstones, filtered out of results, and the scope is rebuilt once
`tombstone_ratio` of it is dead. Entry ids (strings) map to int64 labels local to each scope.

Not thread-safe: the cache calls it from the event loop only, so a search never races an update.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

import faiss
import numpy as np
import numpy.typing as npt

Vectors = npt.NDArray[np.float32]
RebuildProgress = Callable[[int, int], None]


@dataclass(frozen=True, slots=True)
class IndexConfig:
    """How scopes are indexed. `search_threads` sets FAISS's OpenMP threads for the whole process."""

    dimension: int
    hnsw_threshold: int = 100_000
    hnsw_m: int = 32
    hnsw_ef_construction: int = 40
    hnsw_ef_search: int = 64
    tombstone_ratio: float = 0.2
    search_threads: int | None = 1

    def __post_init__(self) -> None:
        if self.dimension <= 0 or self.hnsw_threshold <= 0 or self.hnsw_m <= 0:
            raise ValueError("dimension, hnsw_threshold and hnsw_m must be positive")
        if not 0.0 < self.tombstone_ratio < 1.0:
            raise ValueError("tombstone_ratio must be in (0, 1)")


@dataclass(frozen=True, slots=True)
class Neighbour:
    """One search result: a stored entry and its cosine similarity to the query."""

    entry_id: str
    similarity: float


class ScopeIndex:
    """The vectors of one scope: exact inner product, HNSW past `hnsw_threshold` live vectors."""

    def __init__(self, config: IndexConfig) -> None:
        self.config = config
        self._index = self._new_flat()
        self._hnsw = False
        self._labels: dict[str, int] = {}
        self._entry_ids: dict[int, str] = {}
        self._dead: set[int] = set()  # HNSW tombstones: labels still in FAISS, no longer live
        self._next_label = 0

    @property
    def kind(self) -> str:
        return "hnsw" if self._hnsw else "flat"

    def __len__(self) -> int:
        return len(self._labels)

    def __contains__(self, entry_id: object) -> bool:
        return entry_id in self._labels

    def add(self, entry_ids: Sequence[str], vectors: Vectors) -> int:
        """Add vectors (rows of `vectors`, unit length); ids already present are skipped. Returns added."""
        keep = [row for row, entry_id in enumerate(entry_ids) if entry_id not in self._labels]
        keep = list({entry_ids[row]: row for row in keep}.values())  # a batch may repeat an id
        if not keep:
            return 0
        labels = np.arange(self._next_label, self._next_label + len(keep), dtype=np.int64)
        self._next_label += len(keep)
        for row, label in zip(keep, labels.tolist(), strict=True):
            self._labels[entry_ids[row]] = label
            self._entry_ids[label] = entry_ids[row]
        self._index.add_with_ids(np.ascontiguousarray(vectors[keep], dtype=np.float32), labels)
        if not self._hnsw and len(self._labels) >= self.config.hnsw_threshold:
            self._rebuild(hnsw=True)
        return len(keep)

    def remove(self, entry_ids: Sequence[str]) -> int:
        """Forget these entries; unknown ids are ignored. Returns how many were removed."""
        labels = [self._labels.pop(entry_id) for entry_id in entry_ids if entry_id in self._labels]
        for label in labels:
            del self._entry_ids[label]
        if not labels:
            return 0
        if self._hnsw:
            self._dead.update(labels)
            if len(self._dead) > self.config.tombstone_ratio * self._index.ntotal:
                self._rebuild(hnsw=len(self._labels) >= self.config.hnsw_threshold)
        else:
            self._index.remove_ids(faiss.IDSelectorBatch(np.asarray(labels, dtype=np.int64)))
        return len(labels)

    def search(self, vector: Vectors, k: int) -> list[Neighbour]:
        """The `k` nearest live entries to `vector` (shape (dimension,)), most similar first."""
        if not self._labels or k <= 0:
            return []
        asked = min(k + len(self._dead), self._index.ntotal)
        similarities, labels = self._index.search(vector.reshape(1, -1), asked)  # (1, asked) each
        found: list[Neighbour] = []
        for similarity, label in zip(similarities[0].tolist(), labels[0].tolist(), strict=True):
            entry_id = self._entry_ids.get(label)
            if entry_id is not None:  # -1 (no result) and tombstones have no entry id
                found.append(Neighbour(entry_id, float(similarity)))
                if len(found) == k:
                    break
        return found

    def _new_flat(self) -> faiss.IndexIDMap2:
        return faiss.IndexIDMap2(faiss.IndexFlatIP(self.config.dimension))

    def _new_hnsw(self) -> faiss.IndexIDMap2:
        hnsw = faiss.IndexHNSWFlat(self.config.dimension, self.config.hnsw_m, faiss.METRIC_INNER_PRODUCT)
        hnsw.hnsw.efConstruction = self.config.hnsw_ef_construction
        hnsw.hnsw.efSearch = self.config.hnsw_ef_search
        return faiss.IndexIDMap2(hnsw)

    def _rebuild(self, *, hnsw: bool) -> None:
        """Copy the live vectors into a fresh index (dropping tombstones). Blocks for large scopes."""
        labels = faiss.vector_to_array(self._index.id_map).astype(np.int64)
        live = np.asarray([label not in self._dead for label in labels.tolist()], dtype=bool)
        vectors = self._index.index.reconstruct_n(0, self._index.ntotal)[live]  # (live, dimension)
        self._index = self._new_hnsw() if hnsw else self._new_flat()
        self._hnsw = hnsw
        self._dead.clear()
        if len(vectors):
            self._index.add_with_ids(vectors, labels[live])


class VectorIndex:
    """Every scope's `ScopeIndex`, keyed by scope id; a scope appears on its first add."""

    def __init__(self, config: IndexConfig) -> None:
        self.config = config
        self._scopes: dict[str, ScopeIndex] = {}
        if config.search_threads is not None:
            # Single-query searches gain nothing from OpenMP, and on a busy box its spinning threads
            # make a 5 ms search take 30 ms.
            faiss.omp_set_num_threads(config.search_threads)

    def __len__(self) -> int:
        return sum(len(scope) for scope in self._scopes.values())

    def scope_size(self, scope_id: str) -> int:
        scope = self._scopes.get(scope_id)
        return 0 if scope is None else len(scope)

    def scope_kind(self, scope_id: str) -> str | None:
        scope = self._scopes.get(scope_id)
        return None if scope is None else scope.kind

    def contains(self, scope_id: str, entry_id: str) -> bool:
        scope = self._scopes.get(scope_id)
        return scope is not None and entry_id in scope

    def add(self, scope_id: str, entry_ids: Sequence[str], vectors: Vectors) -> int:
        if len(entry_ids) != len(vectors):
            raise ValueError(f"{len(entry_ids)} ids for {len(vectors)} vectors")
        scope = self._scopes.get(scope_id)
        if scope is None:
            scope = self._scopes[scope_id] = ScopeIndex(self.config)
        return scope.add(entry_ids, vectors)

    def remove(self, scope_id: str, entry_ids: Sequence[str]) -> int:
        scope = self._scopes.get(scope_id)
        if scope is None:
            return 0
        removed = scope.remove(entry_ids)
        if not scope:
            del self._scopes[scope_id]
        return removed

    def search(self, scope_id: str, vector: Vectors, k: int) -> list[Neighbour]:
        scope = self._scopes.get(scope_id)
        return [] if scope is None else scope.search(vector, k)

    def clear(self) -> None:
        self._scopes.clear()


@contextmanager
def rich_progress(description: str = "rebuilding semantic index") -> Iterator[RebuildProgress]:
    """A rich progress bar as a `RebuildProgress` callback: `with rich_progress() as progress: ...`."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn())
    with Progress(*columns, transient=False) as bar:
        task = bar.add_task(description, total=None)

        def update(done: int, total: int) -> None:
            bar.update(task, completed=done, total=total)

        yield update
