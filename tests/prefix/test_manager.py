"""Scenarios for the scheduler-facing manager: exact block ids, ref counts and free-queue order.

Block size 4 throughout, so a prompt of n tokens needs ceil(n / 4) blocks and can reuse at most
(n - 1) // 4 of them.
"""

import pytest

from prefix.hashing import NO_EXTRA_KEYS, ExtraKeys, HashFn, blake2b_128, tenant_key
from prefix.manager import BlockManager, BlockManagerConfig

COMMON = [1, 2, 3, 4, 5, 6, 7, 8]  # two full blocks


def make_manager(num_blocks: int = 10, block_size: int = 4, hash_fn: HashFn = blake2b_128) -> BlockManager:
    return BlockManager(BlockManagerConfig(num_blocks=num_blocks, block_size=block_size), hash_fn=hash_fn)


def admit_and_compute(manager: BlockManager, seq_id: str, token_ids: list[int]) -> None:
    """Admit a prompt and run its prefill to the end (its KV exists, full blocks become reusable)."""
    assert manager.allocate(seq_id, token_ids)
    manager.cache_full_blocks(seq_id, len(token_ids))


def ref_counts(manager: BlockManager) -> list[int]:
    return [block.ref_count for block in manager.pool.blocks]


def free_order(manager: BlockManager) -> list[int]:
    return list(manager.pool.free_queue)


def cached_ids(manager: BlockManager) -> list[int]:
    return sorted(block.block_id for block in manager.pool.cached_blocks())


# Config ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("num_blocks", "block_size"), [(0, 16), (-1, 16), (8, 0), (8, -4), (True, 16), (8, 2.0)]
)
def test_config_refuses_nonsense(num_blocks: int, block_size: int) -> None:
    with pytest.raises(ValueError, match="positive int"):
        BlockManagerConfig(num_blocks=num_blocks, block_size=block_size)


def test_config_defaults_to_block_size_16() -> None:
    assert BlockManagerConfig(num_blocks=8).block_size == 16


# Admission and sharing -------------------------------------------------------------------------


def test_first_prompt_misses_and_takes_blocks_in_order() -> None:
    manager = make_manager()
    assert manager.allocate("a", [*COMMON, 9, 10])
    assert manager.block_table("a") == [0, 1, 2]
    assert manager.num_cached_tokens("a") == 0
    assert ref_counts(manager) == [1, 1, 1, 0, 0, 0, 0, 0, 0, 0]
    assert free_order(manager) == [3, 4, 5, 6, 7, 8, 9]
    assert cached_ids(manager) == []  # nothing is reusable before its KV is computed


def test_second_prompt_shares_the_cached_prefix_blocks() -> None:
    manager = make_manager()
    admit_and_compute(manager, "a", [*COMMON, 9, 10])
    assert cached_ids(manager) == [0, 1]  # block 2 holds only two tokens: never cached
    assert manager.allocate("b", [*COMMON, 11, 12, 13])
    assert manager.block_table("b") == [0, 1, 3]
    assert manager.num_cached_tokens("b") == 8
    assert ref_counts(manager)[:4] == [2, 2, 1, 1]
    assert free_order(manager) == [4, 5, 6, 7, 8, 9]


def test_partial_prefix_hit_stops_at_the_first_different_block() -> None:
    manager = make_manager()
    admit_and_compute(manager, "a", [*COMMON, 9, 10, 11, 12, 13])
    assert manager.allocate("b", [1, 2, 3, 4, 0, 0, 0, 0, 9, 10, 11, 12, 13])
    assert manager.block_table("b") == [0, 4, 5, 6]
    assert manager.num_cached_tokens("b") == 4


def test_freeing_returns_tail_first_and_keeps_the_prefix_for_last() -> None:
    manager = make_manager()
    admit_and_compute(manager, "a", [*COMMON, 9, 10])
    assert manager.allocate("b", [*COMMON, 11, 12, 13])
    manager.free("a")
    # a's own tail block 2 (empty of reusable KV) goes to the front; 0 and 1 are still held by b.
    assert free_order(manager) == [2, 4, 5, 6, 7, 8, 9]
    assert ref_counts(manager)[:4] == [1, 1, 0, 1]
    manager.free("b")
    assert free_order(manager) == [3, 2, 4, 5, 6, 7, 8, 9, 1, 0]
    assert ref_counts(manager) == [0] * 10
    assert "a" not in manager and "b" not in manager


def test_cached_free_blocks_are_revived_by_a_hit() -> None:
    manager = make_manager()
    admit_and_compute(manager, "a", [*COMMON, 9, 10])
    manager.free("a")
    assert free_order(manager) == [2, 3, 4, 5, 6, 7, 8, 9, 1, 0]
    assert manager.stats().num_cached_free_blocks == 2
    assert manager.allocate("c", [*COMMON, 20])
    assert manager.block_table("c") == [0, 1, 2]
    assert manager.num_cached_tokens("c") == 8
    assert free_order(manager) == [3, 4, 5, 6, 7, 8, 9]
    assert manager.stats().num_cached_free_blocks == 0


def test_the_last_token_is_always_computed() -> None:
    manager = make_manager()
    admit_and_compute(manager, "a", [*COMMON, 9])
    # The same 8 tokens again: both blocks are cached, but token 8 needs its logits, so only one
    # block is reused and the second is computed again into a fresh block.
    assert manager.find_cached_prefix(COMMON).num_cached_tokens == 4
    assert manager.allocate("b", COMMON)
    assert manager.block_table("b") == [0, 3]
    assert manager.num_cached_tokens("b") == 4
    # One token more and the whole prefix is reusable.
    assert manager.find_cached_prefix([*COMMON, 0]).block_ids == (0, 1)


def test_a_one_token_prompt_never_hits() -> None:
    manager = make_manager()
    admit_and_compute(manager, "a", [*COMMON, 9])
    assert manager.find_cached_prefix([1]).num_cached_tokens == 0


def test_find_cached_prefix_changes_nothing() -> None:
    manager = make_manager()
    admit_and_compute(manager, "a", [*COMMON, 9])
    manager.free("a")
    before = (free_order(manager), ref_counts(manager), manager.stats())
    match = manager.find_cached_prefix([*COMMON, 9])
    assert match.block_ids == (0, 1) and match.num_cached_tokens == 8
    assert manager.can_allocate([*COMMON, 9])
    assert (free_order(manager), ref_counts(manager), manager.stats()) == before


def test_identical_prompts_admitted_together_compute_duplicates() -> None:
    manager = make_manager()
    prompt = [*COMMON, 9]
    assert manager.allocate("a", prompt)
    assert manager.allocate("b", prompt)  # a's KV does not exist yet: no hit
    assert manager.block_table("b") == [3, 4, 5]
    manager.cache_full_blocks("a", len(prompt))
    manager.cache_full_blocks("b", len(prompt))
    assert cached_ids(manager) == [0, 1, 3, 4]
    # Block tables never change after the fact: each keeps its own copy.
    assert manager.block_table("a") == [0, 1, 2] and manager.block_table("b") == [3, 4, 5]
    assert manager.allocate("c", prompt)
    assert manager.block_table("c")[:2] == [0, 1]


def test_writable_tail_blocks_are_never_shared() -> None:
    manager = make_manager()
    admit_and_compute(manager, "a", [*COMMON, 9])
    assert manager.allocate("b", [*COMMON, 9])
    assert manager.allocate("c", [*COMMON, 9])
    tails = {manager.block_table(seq_id)[-1] for seq_id in "abc"}
    assert tails == {2, 3, 4}
    assert ref_counts(manager)[:5] == [3, 3, 1, 1, 1]


# Refusals --------------------------------------------------------------------------------------


def test_allocate_refuses_without_changing_anything() -> None:
    manager = make_manager(num_blocks=3)
    assert manager.allocate("a", [1, 2, 3, 4, 5])
    before = (free_order(manager), ref_counts(manager), manager.stats())
    assert not manager.can_allocate([9, 9, 9, 9, 9])
    assert manager.allocate("b", [9, 9, 9, 9, 9]) is False
    assert "b" not in manager
    assert (free_order(manager), ref_counts(manager), manager.stats()) == before


def test_hits_on_free_cached_blocks_count_against_the_free_blocks() -> None:
    manager = make_manager(num_blocks=4)
    admit_and_compute(manager, "a", [*COMMON, 9])
    manager.free("a")
    assert manager.allocate("x", [50])  # holds the empty block 2
    assert free_order(manager) == [3, 1, 0]
    # 14 tokens need 4 blocks: two hits that must leave the free queue plus two fresh ones.
    # Counting only the fresh ones would "fit" and then evict a hit while allocating.
    prompt = [*COMMON, 9, 10, 11, 12, 13, 14]
    assert manager.find_cached_prefix(prompt).block_ids == (0, 1)
    assert not manager.can_allocate(prompt)
    assert manager.allocate("b", prompt) is False
    assert free_order(manager) == [3, 1, 0]
    manager.free("x")
    assert manager.allocate("b", prompt)
    assert manager.block_table("b") == [0, 1, 2, 3]
    assert manager.stats().num_evictions == 0


def test_a_hit_is_never_evicted_by_its_own_allocation() -> None:
    manager = make_manager(num_blocks=3)
    admit_and_compute(manager, "a", [1, 2, 3, 4, 5])
    manager.free("a")
    assert free_order(manager) == [1, 2, 0]
    # Block 0 is the hit; the two fresh blocks must come from 1 and 2, not from 0.
    assert manager.allocate("b", [1, 2, 3, 4, 5, 6, 7, 8, 9])
    assert manager.block_table("b") == [0, 1, 2]
    assert manager.num_cached_tokens("b") == 4


def test_misuse_raises() -> None:
    manager = make_manager()
    assert manager.allocate("a", [1, 2])
    with pytest.raises(ValueError, match="already holds"):
        manager.allocate("a", [1, 2])
    with pytest.raises(ValueError, match="at least one token"):
        manager.allocate("b", [])
    with pytest.raises(ValueError, match="at least one token"):
        manager.can_allocate([])
    with pytest.raises(ValueError, match="num_new_tokens"):
        manager.can_append("a", -1)
    with pytest.raises(KeyError):
        manager.free("nobody")
    with pytest.raises(KeyError):
        manager.block_table("nobody")


# Growth: chunked prefill and decode -------------------------------------------------------------


def test_chunked_prefill_caches_only_blocks_whose_kv_exists() -> None:
    manager = make_manager()
    prompt = list(range(100, 112))  # three full blocks
    assert manager.allocate("a", prompt)
    probe = [*prompt, 0]
    manager.cache_full_blocks("a", 3)
    assert manager.find_cached_prefix(probe).num_cached_tokens == 0
    manager.cache_full_blocks("a", 6)
    assert manager.find_cached_prefix(probe).block_ids == (0,)
    manager.cache_full_blocks("a", 6)  # again: nothing new
    manager.cache_full_blocks("a", 12)
    assert manager.find_cached_prefix(probe).block_ids == (0, 1, 2)
    assert cached_ids(manager) == [0, 1, 2]


def test_cache_full_blocks_checks_its_range() -> None:
    manager = make_manager()
    assert manager.allocate("a", [1, 2, 3])
    for bad in (-1, 4):
        with pytest.raises(ValueError, match="num_computed_tokens"):
            manager.cache_full_blocks("a", bad)


def test_decode_takes_a_new_block_only_when_the_last_is_full() -> None:
    manager = make_manager()
    admit_and_compute(manager, "a", [1, 2, 3, 4, 5, 6])
    assert manager.block_table("a") == [0, 1]
    assert manager.can_append("a", 2)
    assert manager.append_slots("a", [7])
    assert manager.append_slots("a", [8])
    assert manager.block_table("a") == [0, 1]
    assert manager.append_slots("a", [9])
    assert manager.block_table("a") == [0, 1, 2]
    assert manager.append_slots("a", [10, 11, 12, 13, 14])  # several at once (e.g. speculative)
    assert manager.block_table("a") == [0, 1, 2, 3]
    assert manager.append_slots("a", [])
    assert manager.block_table("a") == [0, 1, 2, 3]


def test_blocks_filled_by_decoding_become_reusable() -> None:
    manager = make_manager()
    admit_and_compute(manager, "a", [1, 2, 3, 4, 5, 6])
    for token in [7, 8, 9, 10, 11, 12]:  # token t sits at position t, so t - 1 tokens precede it
        assert manager.append_slots("a", [token])
        # A sampled token's KV is written by the next forward pass: KV exists for those before it.
        manager.cache_full_blocks("a", token - 1)
    # Tokens 1..12 have slots, 1..11 have KV: block 2 (9..12) is full but not reusable yet.
    assert cached_ids(manager) == [0, 1]
    manager.cache_full_blocks("a", 12)  # the forward pass that consumes token 12
    assert cached_ids(manager) == [0, 1, 2]
    # A follow-up turn that starts with the whole conversation reuses the decoded blocks.
    assert manager.find_cached_prefix([*range(1, 13), 13]).block_ids == (0, 1, 2)


def test_append_refuses_without_changing_anything() -> None:
    manager = make_manager(num_blocks=2)
    assert manager.allocate("a", [1, 2, 3, 4, 5, 6, 7, 8])
    assert manager.can_append("a", 0)
    assert not manager.can_append("a", 1)
    assert manager.append_slots("a", [9]) is False
    assert manager.block_table("a") == [0, 1]
    # The refused token was not recorded: caching all 8 tokens works, a 9th does not exist.
    manager.cache_full_blocks("a", 8)
    with pytest.raises(ValueError):
        manager.cache_full_blocks("a", 9)


def test_a_preempted_sequence_recomputes_only_its_tail() -> None:
    manager = make_manager()
    prompt, generated = [1, 2, 3, 4, 5], [6, 7, 8, 9, 10]
    admit_and_compute(manager, "a", prompt)
    for token in generated:
        assert manager.append_slots("a", [token])
    manager.cache_full_blocks("a", len(prompt) + len(generated) - 1)
    manager.free("a")  # preempted: it gives everything back
    assert manager.allocate("a", prompt + generated)
    assert manager.block_table("a") == [0, 1, 2]
    assert manager.num_cached_tokens("a") == 8


# Eviction --------------------------------------------------------------------------------------


def test_eviction_takes_empty_blocks_first_then_the_lru_tail() -> None:
    manager = make_manager(num_blocks=6)
    admit_and_compute(manager, "a", [1, 2, 3, 4, 5, 6, 7, 8, 9])
    admit_and_compute(manager, "b", [11, 12, 13, 14, 15, 16, 17, 18, 19])
    manager.free("a")
    manager.free("b")
    assert free_order(manager) == [5, 2, 1, 0, 4, 3]
    assert manager.allocate("c", [30, 31, 32, 33, 34, 35, 36, 37, 38])
    assert manager.block_table("c") == [5, 2, 1]
    assert manager.stats().num_evictions == 1
    # a lost its second block only; b lost nothing.
    assert manager.find_cached_prefix([1, 2, 3, 4, 5, 6, 7, 8, 9]).block_ids == (0,)
    assert manager.find_cached_prefix([11, 12, 13, 14, 15, 16, 17, 18, 19]).block_ids == (3, 4)


def test_a_hit_makes_blocks_most_recently_used() -> None:
    manager = make_manager(num_blocks=6)
    admit_and_compute(manager, "a", [1, 2, 3, 4, 5, 6, 7, 8, 9])
    admit_and_compute(manager, "b", [11, 12, 13, 14, 15, 16, 17, 18, 19])
    manager.free("a")
    manager.free("b")
    assert manager.allocate("a2", [1, 2, 3, 4, 5, 6, 7, 8, 20])  # hits a's prefix again
    assert manager.block_table("a2") == [0, 1, 5]
    manager.free("a2")
    assert free_order(manager) == [5, 2, 4, 3, 1, 0]
    assert manager.allocate("c", [30, 31, 32, 33, 34, 35, 36, 37, 38])
    assert manager.block_table("c") == [5, 2, 4]  # b's tail is older now
    assert manager.find_cached_prefix([1, 2, 3, 4, 5, 6, 7, 8, 9]).block_ids == (0, 1)
    assert manager.find_cached_prefix([11, 12, 13, 14, 15, 16, 17, 18, 19]).block_ids == (3,)


def test_a_shared_parent_outlives_its_children() -> None:
    manager = make_manager(num_blocks=5)
    admit_and_compute(manager, "a", [1, 2, 3, 4, 5, 6, 7, 8, 9])
    admit_and_compute(manager, "b", [1, 2, 3, 4, 20, 21, 22, 23, 24])
    assert manager.block_table("b") == [0, 3, 4]
    manager.free("a")
    manager.free("b")
    assert free_order(manager) == [4, 2, 1, 3, 0]
    assert manager.allocate("x", [70, 71, 72, 73, 74, 75, 76, 77, 78])  # evicts a's child only
    assert manager.find_cached_prefix([1, 2, 3, 4, 5, 6, 7, 8, 9]).block_ids == (0,)
    assert manager.find_cached_prefix([1, 2, 3, 4, 20, 21, 22, 23, 24]).block_ids == (0, 3)
    assert manager.stats().num_evictions == 1


# Reset and stats -------------------------------------------------------------------------------


def test_reset_refuses_while_sequences_are_live() -> None:
    manager = make_manager()
    admit_and_compute(manager, "a", [*COMMON, 9])
    assert manager.reset() is False
    assert manager.find_cached_prefix([*COMMON, 9]).block_ids == (0, 1)


def test_reset_drops_every_cached_prefix() -> None:
    manager = make_manager()
    admit_and_compute(manager, "a", [*COMMON, 9])
    manager.free("a")
    assert manager.reset() is True
    assert manager.find_cached_prefix([*COMMON, 9]).block_ids == ()
    assert manager.stats().num_cached_free_blocks == 0
    assert free_order(manager) == [2, 3, 4, 5, 6, 7, 8, 9, 1, 0]
    assert manager.allocate("b", [*COMMON, 9])
    assert manager.block_table("b") == [2, 3, 4]  # no stale hit after the reset


def test_stats_count_tokens_like_vllm() -> None:
    manager = make_manager(num_blocks=6)
    admit_and_compute(manager, "a", [*COMMON, 9])  # 9 queried, 0 hit
    assert manager.allocate("b", [*COMMON, 10, 11])  # 10 queried, 8 hit
    assert not manager.allocate("c", list(range(100, 120)))  # refused: not counted
    stats = manager.stats()
    assert (stats.prefix_cache_queries, stats.prefix_cache_hits) == (19, 8)
    assert stats.hit_rate == pytest.approx(8 / 19)
    assert (stats.num_blocks, stats.num_blocks_in_use, stats.num_cached_free_blocks) == (6, 4, 0)
    assert stats.usage == pytest.approx(4 / 6)
    manager.free("a")
    manager.free("b")
    stats = manager.stats()
    assert (stats.num_blocks_in_use, stats.num_cached_free_blocks, stats.num_evictions) == (0, 2, 0)
    assert manager.allocate("d", list(range(100, 120)))  # 5 blocks: one of them evicted
    assert manager.stats().num_evictions == 1


def test_empty_stats_have_a_zero_hit_rate() -> None:
    assert make_manager().stats().hit_rate == 0.0


def test_block_table_is_a_copy() -> None:
    manager = make_manager()
    assert manager.allocate("a", [1, 2, 3, 4, 5])
    table = manager.block_table("a")
    table.append(99)
    assert manager.block_table("a") == [0, 1]


def test_extra_keys_default_is_the_empty_namespace() -> None:
    manager = make_manager()
    admit_and_compute(manager, "a", [*COMMON, 9])
    assert manager.find_cached_prefix([*COMMON, 9], NO_EXTRA_KEYS).block_ids == (0, 1)
    assert manager.find_cached_prefix([*COMMON, 9], ExtraKeys.of(tenant_key("t"))).block_ids == ()


# Fork (parallel sampling) --------------------------------------------------------------------------


def test_a_fork_shares_every_block_and_the_first_write_to_the_shared_tail_copies_it() -> None:
    manager = make_manager(num_blocks=6)
    admit_and_compute(manager, "parent", [*COMMON, 9, 10])  # blocks 0, 1 full and cached; 2 holds 2 tokens
    manager.fork("parent", "child-1")
    manager.fork("parent", "child-2")
    assert manager.block_table("child-1") == manager.block_table("child-2") == [0, 1, 2]
    assert ref_counts(manager)[:3] == [3, 3, 3] and manager.num_free_blocks == 3
    assert manager.append_slots("child-1", [11])  # into the shared block 2: copy it first
    assert manager.block_table("child-1") == [0, 1, 3]
    assert manager.take_block_copies() == [(2, 3)] and manager.take_block_copies() == []
    assert manager.append_slots("child-2", [12])
    assert manager.take_block_copies() == [(2, 4)]
    assert manager.append_slots("parent", [13])  # the last holder of block 2 writes in place
    assert manager.take_block_copies() == [] and manager.block_table("parent") == [0, 1, 2]
    assert ref_counts(manager)[:5] == [3, 3, 1, 1, 1]
    for seq_id in ("child-1", "child-2", "parent"):
        manager.free(seq_id)
    assert ref_counts(manager) == [0] * 6 and manager.num_free_blocks == 6


def test_a_copy_on_write_that_does_not_fit_changes_nothing() -> None:
    manager = make_manager(num_blocks=3)
    admit_and_compute(manager, "parent", [*COMMON, 9])  # all three blocks
    manager.fork("parent", "child")
    assert not manager.can_append("child") and not manager.append_slots("child", [10])
    assert manager.take_block_copies() == [] and ref_counts(manager) == [2, 2, 2]


def test_a_fork_on_a_block_boundary_copies_nothing() -> None:
    manager = make_manager(num_blocks=6)
    admit_and_compute(manager, "parent", COMMON)
    manager.fork("parent", "child")
    assert manager.append_slots("child", [9]) and manager.append_slots("parent", [10])
    assert manager.take_block_copies() == []
    assert manager.block_table("child")[:2] == manager.block_table("parent")[:2] == [0, 1]
