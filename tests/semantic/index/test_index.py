"""FAISS per scope: exact search, removal, HNSW past the threshold with tombstones, rebuilds that
run beside changes, scope isolation, the builder thread."""

from __future__ import annotations

import threading

import faiss
import numpy as np
import pytest

from semantic.index.scope_index import ScopeIndex
from semantic.index.vector_index import IndexBuilder, IndexConfig, VectorIndex

DIMENSION = 16


def unit_vectors(count: int, seed: int = 0) -> np.ndarray:
    vectors = np.random.default_rng(seed).standard_normal((count, DIMENSION)).astype(np.float32)
    return vectors / np.linalg.norm(vectors, axis=1, keepdims=True)


def ids(count: int, start: int = 0) -> list[str]:
    return [f"e{number}" for number in range(start, start + count)]


def test_flat_search_finds_each_vector_first_with_cosine_one() -> None:
    index = ScopeIndex(IndexConfig(DIMENSION))
    vectors = unit_vectors(50)
    assert index.add(ids(50), vectors) == 50
    for row in (0, 17, 49):
        nearest = index.search(vectors[row], 3)
        assert nearest[0].entry_id == f"e{row}"
        assert nearest[0].similarity == pytest.approx(1.0, abs=1e-5)
        assert [neighbour.similarity for neighbour in nearest] == sorted(
            (neighbour.similarity for neighbour in nearest), reverse=True
        )
    assert index.kind == "flat"


def test_adding_an_id_twice_keeps_one_copy() -> None:
    index = ScopeIndex(IndexConfig(DIMENSION))
    vectors = unit_vectors(3)
    index.add(ids(3), vectors)
    assert index.add(["e1", "e1", "new"], vectors) == 1
    assert len(index) == 4
    assert [neighbour.entry_id for neighbour in index.search(vectors[1], 10)].count("e1") == 1


def test_removed_entries_are_never_returned() -> None:
    index = ScopeIndex(IndexConfig(DIMENSION))
    vectors = unit_vectors(20)
    index.add(ids(20), vectors)
    assert index.remove(["e3", "e4", "unknown"]) == 2
    assert "e3" not in index and len(index) == 18
    found = {neighbour.entry_id for neighbour in index.search(vectors[3], 20)}
    assert found == set(ids(20)) - {"e3", "e4"}


def test_past_the_threshold_a_scope_is_due_to_become_hnsw_with_tombstones() -> None:
    config = IndexConfig(DIMENSION, hnsw_threshold=100, tombstone_ratio=0.25)
    index = ScopeIndex(config)
    vectors = unit_vectors(300)
    index.add(ids(99), vectors[:99])
    assert index.kind == "flat" and not index.due
    index.add(ids(201, start=99), vectors[99:])
    assert index.kind == "flat" and index.due  # the owner decides when to pay for the copy
    index.rebuild()
    assert index.kind == "hnsw" and len(index) == 300 and not index.due
    assert index.search(vectors[250], 1)[0].entry_id == "e250"

    index.remove(ids(50))  # 50 tombstones of 300: under the ratio, not due yet
    assert index.tombstones == 50 and not index.due
    found = [neighbour.entry_id for neighbour in index.search(vectors[10], 5)]
    assert len(found) == 5 and not set(found) & set(ids(50))

    index.remove(ids(30, start=50))  # 80 of 300 dead: over 25 %
    assert index.due
    index.rebuild()
    assert index.tombstones == 0 and index._index.ntotal == 220 and index.kind == "hnsw"
    assert index.search(vectors[299], 1)[0].entry_id == "e299"


def test_hnsw_search_returns_k_live_entries_past_many_tombstones() -> None:
    index = ScopeIndex(IndexConfig(DIMENSION, hnsw_threshold=10), expected_size=400)
    vectors = unit_vectors(400)
    index.add(ids(400), vectors)
    assert index.kind == "hnsw"  # sized up front: never built flat
    index.remove(ids(350))  # nearly all dead: the nearest of every query is a tombstone
    found = [neighbour.entry_id for neighbour in index.search(vectors[0], 10)]
    assert len(found) == 10 and set(found) <= set(ids(50, start=350))


@pytest.mark.parametrize("size", [120, 300])  # flat -> HNSW; HNSW dropping tombstones
def test_changes_made_while_a_rebuild_runs_are_kept(size: int) -> None:
    config = IndexConfig(DIMENSION, hnsw_threshold=100, tombstone_ratio=0.1)
    index = ScopeIndex(config, expected_size=0 if size == 120 else size)
    vectors = unit_vectors(size + 20)
    index.add(ids(size), vectors[:size])
    removed = set()
    if size == 300:
        index.remove(ids(40))
        removed = set(ids(40))
    assert index.due
    job = index.begin_rebuild()
    assert not index.due  # one rebuild at a time

    index.add(ids(20, start=size), vectors[size:])  # arrive during the build
    index.remove(["e40", "e41", f"e{size}"])  # one from the snapshot, one that arrived during it
    built = index.build(job)
    assert index.search(vectors[42], 1)[0].entry_id == "e42"  # still served from the old index
    index.finish_rebuild(job, built)

    removed |= {"e40", "e41", f"e{size}"}
    assert index.kind == "hnsw" and len(index) == size + 20 - len(removed)
    for row, vector in enumerate(vectors):  # each live entry is its own nearest; no removed one is found
        nearest = index.search(vector, 1)[0].entry_id
        assert nearest not in removed and (nearest == f"e{row}" or f"e{row}" in removed)


def test_an_abandoned_rebuild_leaves_the_scope_serving_and_due_again() -> None:
    index = ScopeIndex(IndexConfig(DIMENSION, hnsw_threshold=50))
    vectors = unit_vectors(60)
    index.add(ids(60), vectors)
    index.begin_rebuild()
    index.abandon_rebuild()
    assert index.kind == "flat" and index.due
    assert index.search(vectors[7], 1)[0].entry_id == "e7"


def test_the_vector_index_hands_out_due_scopes_once() -> None:
    index = VectorIndex(IndexConfig(DIMENSION, hnsw_threshold=10))
    vectors = unit_vectors(12)
    index.add("small", ids(3), vectors[:3])
    index.add("large", ids(12), vectors)
    due = index.take_due()
    assert len(due) == 1 and due[0] == ("large", index.scope("large"))
    assert index.take_due() == []
    job = due[0][1].begin_rebuild()
    index.add("large", ["late"], vectors[:1])  # a change while it rebuilds does not hand it out again
    assert index.take_due() == []
    with pytest.raises(RuntimeError):
        due[0][1].begin_rebuild()
    due[0][1].finish_rebuild(job, due[0][1].build(job))
    assert index.scope_kind("large") == "hnsw" and index.contains("large", "late")


def test_scopes_never_see_each_other() -> None:
    index = VectorIndex(IndexConfig(DIMENSION))
    vectors = unit_vectors(4)
    index.add("scope-a", ["a0", "a1"], vectors[:2])
    index.add("scope-b", ["b0", "b1"], vectors[2:])
    assert {n.entry_id for n in index.search("scope-a", vectors[2], 5)} == {"a0", "a1"}
    assert index.search("scope-c", vectors[0], 5) == []
    assert index.remove("scope-a", ["a0", "a1"]) == 2
    assert index.scope_size("scope-a") == 0 and index.scope_kind("scope-a") is None
    assert len(index) == 2 and index.contains("scope-b", "b1")


def test_config_is_checked() -> None:
    with pytest.raises(ValueError):
        IndexConfig(0)
    with pytest.raises(ValueError):
        IndexConfig(DIMENSION, tombstone_ratio=1.5)
    with pytest.raises(ValueError):
        IndexConfig(DIMENSION, build_threads=0)


async def test_the_builder_runs_work_on_its_own_thread_with_its_own_openmp_threads() -> None:
    config = IndexConfig(DIMENSION, build_threads=2)
    VectorIndex(config)  # sets this (the event loop's) thread to one OpenMP thread
    builder = IndexBuilder(config)

    def where() -> tuple[int, int]:
        return threading.get_ident(), faiss.omp_get_max_threads()

    try:
        thread, omp_threads = await builder.run(where)
        assert thread != threading.get_ident() and omp_threads == 2
        assert faiss.omp_get_max_threads() == 1
    finally:
        builder.close()


def test_compacting_below_half_the_threshold_goes_flat_and_keeps_changes_made_meanwhile() -> None:
    index = ScopeIndex(IndexConfig(DIMENSION, hnsw_threshold=100, tombstone_ratio=0.2), expected_size=120)
    vectors = unit_vectors(130)
    index.add(ids(120), vectors[:120])
    index.remove(ids(40))  # 80 live: under the threshold, but not under half of it
    index.rebuild()
    assert index.kind == "hnsw" and index.tombstones == 0  # no copying back and forth near the threshold
    index.remove(ids(40, start=40))  # 40 live: exact search again
    job = index.begin_rebuild()
    index.add(ids(10, start=120), vectors[120:])
    index.remove(["e90", "e121"])
    index.finish_rebuild(job, index.build(job))
    assert index.kind == "flat" and index.tombstones == 0 and len(index) == 48
    found = {neighbour.entry_id for neighbour in index.search(vectors[0], 200)}  # exact: every live entry
    assert found == set(ids(50, start=80)) - {"e90", "e121"}


def test_an_entry_caught_up_off_the_loop_then_removed_is_a_tombstone() -> None:
    index = ScopeIndex(IndexConfig(DIMENSION, hnsw_threshold=100))
    vectors = unit_vectors(130)
    index.add(ids(110), vectors[:110])
    job = index.begin_rebuild()
    built = index.build(job)
    index.add(ids(20, start=110), vectors[110:])
    caught_up, arrived = index.arrivals(job.next_label)  # what the owner adds on the builder thread
    built.add_with_ids(arrived, caught_up)
    index.remove(["e115"])
    index.finish_rebuild(job, built, caught_up)
    assert index.kind == "hnsw" and index.tombstones == 1 and len(index) == 129
    assert "e115" not in {neighbour.entry_id for neighbour in index.search(vectors[115], 5)}
    assert len(index.search(vectors[115], 5)) == 5
