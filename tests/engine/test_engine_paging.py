"""Paging metadata: positions, slots, padded block tables and logits rows for a mixed batch."""

from __future__ import annotations

import pytest

from engine.model.paging import LogitsFor, SequenceChunk, build_paging_metadata


def test_mixed_batch_metadata() -> None:
    chunks = [
        SequenceChunk(
            [11, 12, 13], num_cached_tokens=4, block_table=[7, 2, 9]
        ),  # prefill chunk after a prefix
        SequenceChunk([21], num_cached_tokens=2, block_table=[5], logits=LogitsFor.ALL),  # decode
        SequenceChunk([31, 32], num_cached_tokens=0, block_table=[1], logits=LogitsFor.NONE),
    ]
    metadata = build_paging_metadata(chunks, block_size=3)
    assert metadata.positions.tolist() == [4, 5, 6, 2, 0, 1]
    # position p of a sequence lives in slot table[p // 3] * 3 + p % 3
    assert metadata.slot_mapping.tolist() == [2 * 3 + 1, 2 * 3 + 2, 9 * 3 + 0, 5 * 3 + 2, 3, 4]
    assert metadata.block_tables.tolist() == [[7, 2, 9], [5, 0, 0], [1, 0, 0]]
    assert metadata.context_lens.tolist() == [7, 3, 2]
    assert metadata.query_start_loc.tolist() == [0, 3, 4, 6]
    assert metadata.logits_indices.tolist() == [2, 3]
    assert metadata.host_query_lens == (3, 1, 2)
    assert metadata.host_context_lens == (7, 3, 2)


def test_a_block_table_too_short_for_the_context_is_refused() -> None:
    with pytest.raises(ValueError, match="cannot hold"):
        build_paging_metadata([SequenceChunk([1, 2], num_cached_tokens=3, block_table=[0])], block_size=4)


def test_empty_chunks_are_refused() -> None:
    with pytest.raises(ValueError):
        SequenceChunk([], num_cached_tokens=0, block_table=[0])
    with pytest.raises(ValueError):
        build_paging_metadata([], block_size=4)
