"""FAISS per scope: exact search, removal, HNSW past the threshold with tombstones, scope isolation."""

from __future__ import annotations

import numpy as np
import pytest

from semantic.index import IndexConfig, ScopeIndex, VectorIndex

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


def test_past_the_threshold_a_scope_becomes_hnsw_with_tombstones() -> None:
    config = IndexConfig(DIMENSION, hnsw_threshold=100, tombstone_ratio=0.25)
    index = ScopeIndex(config)
    vectors = unit_vectors(300)
    index.add(ids(99), vectors[:99])
    assert index.kind == "flat"
    index.add(ids(201, start=99), vectors[99:])
    assert index.kind == "hnsw" and len(index) == 300
    assert index.search(vectors[250], 1)[0].entry_id == "e250"

    index.remove(ids(50))  # 50 tombstones of 300: under the ratio, no rebuild yet
    assert len(index._dead) == 50
    found = [neighbour.entry_id for neighbour in index.search(vectors[10], 5)]
    assert len(found) == 5 and not set(found) & set(ids(50))

    index.remove(ids(30, start=50))  # 80 of 300 dead: over 25 %, rebuilt without them
    assert not index._dead and index._index.ntotal == 220 and index.kind == "hnsw"
    assert index.search(vectors[299], 1)[0].entry_id == "e299"


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
