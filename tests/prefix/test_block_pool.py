"""The block pool: ref counts, free-queue order, lazy eviction and proven hits."""

import pytest

from prefix.block_pool import Block, BlockPool
from prefix.hashing import NO_EXTRA_KEYS, ExtraKeys, blake2b_128, hash_block_tokens, tenant_key


def cache(pool: BlockPool, block: Block, token_ids: tuple[int, ...], parent: Block | None = None) -> None:
    parent_hash = None if parent is None else parent.block_hash
    pool.cache_block(
        block, hash_block_tokens(blake2b_128, parent_hash, token_ids), token_ids, parent, NO_EXTRA_KEYS
    )


def find(pool: BlockPool, token_ids: tuple[int, ...], parent: Block | None = None) -> Block | None:
    parent_hash = None if parent is None else parent.block_hash
    block_hash = hash_block_tokens(blake2b_128, parent_hash, token_ids)
    return pool.find_cached_block(block_hash, parent, token_ids, NO_EXTRA_KEYS)


def test_new_pool_is_all_free_and_empty() -> None:
    pool = BlockPool(4)
    assert list(pool.free_queue) == [0, 1, 2, 3]
    assert (pool.num_free_blocks, pool.num_used_blocks, pool.num_cached_free_blocks) == (4, 0, 0)
    assert all(block.ref_count == 0 and block.content is None for block in pool.blocks)


def test_pool_needs_blocks() -> None:
    with pytest.raises(ValueError):
        BlockPool(0)


def test_take_hands_out_the_front_with_one_reference() -> None:
    pool = BlockPool(4)
    taken = pool.take_free_blocks(2)
    assert [block.block_id for block in taken] == [0, 1]
    assert [block.ref_count for block in taken] == [1, 1]
    assert list(pool.free_queue) == [2, 3]
    assert pool.num_used_blocks == 2


def test_taking_too_many_raises_and_changes_nothing() -> None:
    pool = BlockPool(2)
    with pytest.raises(ValueError, match="only 2 free"):
        pool.take_free_blocks(3)
    assert list(pool.free_queue) == [0, 1]


def test_cached_block_is_found_only_with_its_parent_and_tokens() -> None:
    pool = BlockPool(4)
    first, second = pool.take_free_blocks(2)
    cache(pool, first, (1, 2))
    cache(pool, second, (3, 4), parent=first)
    assert find(pool, (1, 2)) is first
    assert find(pool, (3, 4), parent=first) is second
    assert find(pool, (3, 4)) is None  # same tokens, but as a first block: different KV
    assert find(pool, (1, 3)) is None


def test_first_block_is_found_only_in_its_namespace() -> None:
    pool = BlockPool(2)
    (block,) = pool.take_free_blocks(1)
    keys_a, keys_b = ExtraKeys.of(tenant_key("a")), ExtraKeys.of(tenant_key("b"))
    block_hash = hash_block_tokens(blake2b_128, None, (1, 2), keys_a)
    pool.cache_block(block, block_hash, (1, 2), None, keys_a)
    assert pool.find_cached_block(block_hash, None, (1, 2), keys_a) is block
    # Even handed the right hash, the wrong namespace is refused.
    assert pool.find_cached_block(block_hash, None, (1, 2), keys_b) is None


def test_free_puts_cached_blocks_at_the_back_and_empty_ones_at_the_front() -> None:
    pool = BlockPool(5)
    first, second, third = pool.take_free_blocks(3)
    cache(pool, first, (1,))
    cache(pool, second, (2,), parent=first)
    assert list(pool.free_queue) == [3, 4]
    pool.free_blocks([third, second, first])  # eviction order: tail first
    assert list(pool.free_queue) == [2, 3, 4, 1, 0]
    assert pool.num_cached_free_blocks == 2
    assert [block.ref_count for block in pool.blocks] == [0] * 5


def test_shared_block_is_freed_only_by_its_last_holder() -> None:
    pool = BlockPool(3)
    (block,) = pool.take_free_blocks(1)
    cache(pool, block, (1,))
    pool.touch([block])
    assert block.ref_count == 2
    pool.free_blocks([block])
    assert block.ref_count == 1 and 0 not in pool.free_queue
    pool.free_blocks([block])
    assert block.ref_count == 0 and list(pool.free_queue) == [1, 2, 0]


def test_touch_revives_a_cached_free_block_from_the_middle() -> None:
    pool = BlockPool(4)
    blocks = pool.take_free_blocks(3)
    for index, block in enumerate(blocks):
        cache(pool, block, (index,))
    pool.free_blocks(blocks)
    assert list(pool.free_queue) == [3, 0, 1, 2]
    pool.touch([blocks[1]])
    assert list(pool.free_queue) == [3, 0, 2]
    assert blocks[1].ref_count == 1
    assert pool.num_cached_free_blocks == 2


def test_eviction_is_lazy_and_least_recently_used_first() -> None:
    pool = BlockPool(2)
    first, second = pool.take_free_blocks(2)
    cache(pool, first, (1,))
    cache(pool, second, (2,))
    pool.free_blocks([first])
    pool.free_blocks([second])
    # Both still findable while free.
    assert find(pool, (1,)) is first and find(pool, (2,)) is second
    assert pool.num_evictions == 0
    (taken,) = pool.take_free_blocks(1)
    assert taken is first
    assert taken.content is None
    assert find(pool, (1,)) is None
    assert find(pool, (2,)) is second
    assert pool.num_evictions == 1
    assert pool.num_cached_free_blocks == 1


def test_taking_an_empty_block_evicts_nothing() -> None:
    pool = BlockPool(2)
    first, second = pool.take_free_blocks(2)
    cache(pool, first, (1,))
    pool.free_blocks([second, first])
    assert list(pool.free_queue) == [1, 0]
    pool.take_free_blocks(1)
    assert pool.num_evictions == 0
    assert find(pool, (1,)) is first


def test_duplicate_contents_share_a_content_id_and_survive_each_other() -> None:
    pool = BlockPool(4)
    parent_a, parent_b = pool.take_free_blocks(2)
    cache(pool, parent_a, (1, 2))
    cache(pool, parent_b, (1, 2))  # computed twice by two sequences at once
    assert parent_a.content is not None and parent_b.content is not None
    assert parent_a.content.content_id == parent_b.content.content_id
    assert sorted(block.block_id for block in pool.cached_blocks()) == [0, 1]
    # A child of either duplicate is a hit after the other.
    (child,) = pool.take_free_blocks(1)
    cache(pool, child, (3, 4), parent=parent_b)
    assert find(pool, (3, 4), parent=parent_a) is child
    # Evicting one duplicate leaves the other findable.
    pool.free_blocks([parent_a])
    pool.take_free_blocks(1)  # block 3, empty
    pool.take_free_blocks(1)  # block 0, evicted
    assert pool.num_evictions == 1
    assert find(pool, (1, 2)) is parent_b


def test_caching_a_block_twice_is_a_bug() -> None:
    pool = BlockPool(2)
    (block,) = pool.take_free_blocks(1)
    cache(pool, block, (1,))
    with pytest.raises(AssertionError):
        cache(pool, block, (1,))


def test_reset_refuses_while_blocks_are_in_use() -> None:
    pool = BlockPool(2)
    (block,) = pool.take_free_blocks(1)
    cache(pool, block, (1,))
    assert pool.reset() is False
    assert find(pool, (1,)) is block


def test_reset_forgets_every_cached_block() -> None:
    pool = BlockPool(3)
    blocks = pool.take_free_blocks(2)
    cache(pool, blocks[0], (1,))
    cache(pool, blocks[1], (2,), parent=blocks[0])
    pool.free_blocks(reversed(blocks))
    order = list(pool.free_queue)
    assert pool.reset() is True
    assert find(pool, (1,)) is None
    assert list(pool.cached_blocks()) == []
    assert pool.num_cached_free_blocks == 0
    assert list(pool.free_queue) == order
    assert all(block.content is None for block in pool.blocks)
