"""One scope's FAISS index: exact inner product while small, HNSW once large, rebuilt off the loop.

Knows vectors, entry ids and int64 labels; knows nothing about Redis, prompts, answers or threads.
A scope is searched exactly (inner product over unit vectors == cosine, `IndexFlatIP` in an
`IndexIDMap2`) until it holds `hnsw_threshold` vectors; past that it should become HNSW (and go
back to exact search only when a rebuild finds it under half the threshold). HNSW cannot remove
ids, so removals there are tombstones: a bitmap of live labels is passed to FAISS as an
`IDSelector`, so dead vectors are skipped inside the search rather than over-fetched and filtered,
and the scope should be rebuilt once `tombstone_ratio` of it is dead.

Both rebuilds (flat -> HNSW, and dropping tombstones) copy every vector, which takes minutes at a
million, so the scope only says a rebuild is `due`; the owner runs it in three steps:
`begin_rebuild` (snapshot the live vectors, on the owner's thread), `build` (make the new FAISS
index from the snapshot: touches nothing else, so any thread may run it), `finish_rebuild` (add
what arrived meanwhile, carry over what was removed meanwhile, swap). Between the steps the scope
keeps serving from its current index. `rebuild` runs the three in a row.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import faiss
import numpy as np
import numpy.typing as npt

Vectors = npt.NDArray[np.float32]
Labels = npt.NDArray[np.int64]


@dataclass(frozen=True, slots=True)
class IndexConfig:
    """How scopes are indexed.

    `search_threads` sets FAISS's OpenMP threads on the thread that creates the `VectorIndex` (the
    event loop's: one query at a time gains nothing from more); `build_threads` (None: every core)
    is what the index builder thread uses, where HNSW insertion parallelises well.
    """

    dimension: int
    hnsw_threshold: int = 100_000
    hnsw_m: int = 32
    hnsw_ef_construction: int = 40
    hnsw_ef_search: int = 64
    tombstone_ratio: float = 0.2
    search_threads: int | None = 1
    build_threads: int | None = None

    def __post_init__(self) -> None:
        if self.dimension <= 0 or self.hnsw_threshold <= 0 or self.hnsw_m <= 0:
            raise ValueError("dimension, hnsw_threshold and hnsw_m must be positive")
        if not 0.0 < self.tombstone_ratio < 1.0:
            raise ValueError("tombstone_ratio must be in (0, 1)")
        if self.build_threads is not None and self.build_threads <= 0:
            raise ValueError("build_threads must be positive")


@dataclass(frozen=True, slots=True)
class Neighbour:
    """One search result: a stored entry and its cosine similarity to the query."""

    entry_id: str
    similarity: float


@dataclass(frozen=True, slots=True)
class RebuildJob:
    """A snapshot of a scope's live vectors, to be built into a fresh index of the chosen kind."""

    hnsw: bool
    labels: Labels  # (n,)
    vectors: Vectors  # (n, dimension)
    next_label: int  # labels from here on were added after the snapshot


class ScopeIndex:
    """The vectors of one scope.

    `expected_size`: how many vectors are about to be added (a start-up rebuild knows); a scope
    that will end past the threshold starts as HNSW instead of being built flat and then copied.
    """

    def __init__(self, config: IndexConfig, expected_size: int = 0) -> None:
        self.config = config
        self._hnsw = expected_size >= config.hnsw_threshold
        self._index = self._new_index(hnsw=self._hnsw)
        self._labels: dict[str, int] = {}
        self._entry_ids: dict[int, str] = {}
        self._dead: set[int] = set()  # HNSW tombstones: labels still in FAISS, no longer live
        self._live_bits = np.zeros(1024, dtype=np.uint8)  # bit `label` set while the label is live
        self._next_label = 0
        self._rebuilding = False
        self._not_before = 0.0  # after a failed rebuild: not due again before this (monotonic)
        self._params: faiss.SearchParameters | None = None  # rebuilt when the index or bitmap changes
        self._selector: faiss.IDSelector | None = None

    @property
    def kind(self) -> str:
        return "hnsw" if self._hnsw else "flat"

    @property
    def due(self) -> bool:
        """Whether a rebuild should run: flat past the threshold, or too many tombstones."""
        if self._rebuilding or time.monotonic() < self._not_before:
            return False
        if not self._hnsw:
            return len(self._labels) >= self.config.hnsw_threshold
        return len(self._dead) > self.config.tombstone_ratio * self._index.ntotal

    @property
    def tombstones(self) -> int:
        return len(self._dead)

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
        self._mark_live(labels, live=True)
        return len(keep)

    def remove(self, entry_ids: Sequence[str]) -> int:
        """Forget these entries; unknown ids are ignored. Returns how many were removed."""
        labels = [self._labels.pop(entry_id) for entry_id in entry_ids if entry_id in self._labels]
        for label in labels:
            del self._entry_ids[label]
        if not labels:
            return 0
        removed = np.asarray(labels, dtype=np.int64)
        self._mark_live(removed, live=False)
        if self._hnsw:
            self._dead.update(labels)
        else:
            self._index.remove_ids(faiss.IDSelectorBatch(removed))
        return len(labels)

    def search(self, vector: Vectors, k: int) -> list[Neighbour]:
        """The `k` nearest live entries to `vector` (shape (dimension,)), most similar first."""
        if not self._labels or k <= 0:
            return []
        # Without tombstones nothing needs filtering, and the index's own efSearch applies.
        params = self._search_params() if self._dead else None
        similarities, labels = self._index.search(vector.reshape(1, -1), k, params=params)
        found: list[Neighbour] = []
        for similarity, label in zip(similarities[0].tolist(), labels[0].tolist(), strict=True):
            entry_id = self._entry_ids.get(label)
            if entry_id is not None:  # -1 (fewer than k results) has no entry id
                found.append(Neighbour(entry_id, float(similarity)))
        return found

    def rebuild(self) -> None:
        """Run a due rebuild here and now (blocks: the owner normally runs `build` on another thread)."""
        job = self.begin_rebuild()
        self.finish_rebuild(job, self.build(job))

    def begin_rebuild(self) -> RebuildJob:
        """Snapshot the live vectors (copies them: ~1 s at a million); until `finish_rebuild` or
        `abandon_rebuild`, the scope is not `due` and cannot begin another."""
        if self._rebuilding:
            raise RuntimeError("a rebuild of this scope is already running")
        labels = faiss.vector_to_array(self._index.id_map).astype(np.int64)
        vectors = self._index.index.reconstruct_n(0, self._index.ntotal)  # (ntotal, dimension)
        live = self._is_live(labels)
        if not live.all():
            labels, vectors = labels[live], vectors[live]
        self._rebuilding = True
        # Hysteresis: an HNSW scope goes back to exact search only below half the threshold, so a scope
        # hovering around it (purges, then growth) is not copied back and forth.
        hnsw_floor = self.config.hnsw_threshold // 2 if self._hnsw else self.config.hnsw_threshold
        return RebuildJob(len(self._labels) >= hnsw_floor, labels, vectors, self._next_label)

    def build(self, job: RebuildJob) -> faiss.IndexIDMap2:
        """The job's vectors in a fresh index. Reads only `job` and the config: safe on any thread."""
        index = self._new_index(hnsw=job.hnsw)
        if len(job.labels):
            index.add_with_ids(job.vectors, job.labels)
        return index

    def arrivals(self, since: int) -> tuple[Labels, Vectors]:
        """Live entries added from label `since` on (copies), for catching a built index up."""
        labels = np.arange(since, self._next_label, dtype=np.int64)
        labels = labels[self._is_live(labels)]
        if not len(labels):
            return labels, np.zeros((0, self.config.dimension), dtype=np.float32)
        return labels, self._index.reconstruct_batch(labels)  # (len(labels), dimension)

    def finish_rebuild(
        self, job: RebuildJob, built: faiss.IndexIDMap2, caught_up: Labels | None = None
    ) -> None:
        """Swap in `built`, first adding the entries that arrived since the snapshot. `caught_up`:
        arrivals the owner has already added to `built` off the loop (ascending, from `arrivals`)."""
        caught_up = np.zeros(0, dtype=np.int64) if caught_up is None else caught_up
        labels, vectors = self.arrivals(int(caught_up[-1]) + 1 if len(caught_up) else job.next_label)
        if len(labels):
            built.add_with_ids(vectors, labels)
        in_built = np.concatenate([job.labels, caught_up])
        gone = in_built[~self._is_live(in_built)]  # removed since they were copied: still in `built`
        self._index, self._hnsw, self._rebuilding = built, job.hnsw, False
        self._params = None
        if job.hnsw:
            self._dead = set(gone.tolist())
        else:
            self._dead = set()
            if len(gone):
                built.remove_ids(faiss.IDSelectorBatch(gone))

    def abandon_rebuild(self, retry_in_s: float = 0.0) -> None:
        """The build failed or was cancelled: keep the current index; due again after `retry_in_s`."""
        self._rebuilding = False
        self._not_before = time.monotonic() + retry_in_s

    def _search_params(self) -> faiss.SearchParameters | None:
        """HNSW search parameters, kept (with the selector they point to) as long as the bitmap is."""
        if not self._hnsw:
            return None
        if self._params is None:
            hnsw_params: Any = faiss.SearchParametersHNSW()  # type: ignore[attr-defined]  # not in the stub
            hnsw_params.efSearch = self.config.hnsw_ef_search  # else FAISS would use 16, not the index's
            self._selector = faiss.IDSelectorBitmap(len(self._live_bits), faiss.swig_ptr(self._live_bits))
            hnsw_params.sel = self._selector
            self._params = hnsw_params
        return self._params

    def _mark_live(self, labels: Labels, *, live: bool) -> None:
        needed = int(labels.max()) // 8 + 1
        if needed > len(self._live_bits):
            grown = np.zeros(max(needed, 2 * len(self._live_bits)), dtype=np.uint8)
            grown[: len(self._live_bits)] = self._live_bits
            self._live_bits, self._params = grown, None  # the old selector points at the old array
        bits = np.left_shift(1, labels & 7).astype(np.uint8)
        if live:
            np.bitwise_or.at(self._live_bits, labels >> 3, bits)
        else:
            np.bitwise_and.at(self._live_bits, labels >> 3, ~bits)

    def _is_live(self, labels: Labels) -> npt.NDArray[np.bool_]:
        inside = (labels >> 3) < len(self._live_bits)
        live = np.zeros(len(labels), dtype=bool)
        live[inside] = (self._live_bits[labels[inside] >> 3] >> (labels[inside] & 7)) & 1 == 1
        return live

    def _new_index(self, *, hnsw: bool) -> faiss.IndexIDMap2:
        if not hnsw:
            return faiss.IndexIDMap2(faiss.IndexFlatIP(self.config.dimension))
        graph = faiss.IndexHNSWFlat(self.config.dimension, self.config.hnsw_m, faiss.METRIC_INNER_PRODUCT)
        graph.hnsw.efConstruction = self.config.hnsw_ef_construction
        graph.hnsw.efSearch = self.config.hnsw_ef_search
        return faiss.IndexIDMap2(graph)
