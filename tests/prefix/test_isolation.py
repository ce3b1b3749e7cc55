"""Isolation between namespaces, and collision safety with a deliberately terrible hash function."""

import hashlib

import pytest

from prefix.hashing import NO_EXTRA_KEYS, ExtraKeys, HashFn, adapter_key, blake2b_128, model_key, tenant_key
from prefix.manager import BlockManager, BlockManagerConfig

SMOL = model_key("HuggingFaceTB/SmolLM2-135M", "main", "bfloat16")
PROMPT = list(range(1, 14))  # three full blocks of 4 and one token


def constant_hash(data: bytes) -> bytes:
    """Every block collides with every other block."""
    return b"\x00"


def one_byte_hash(data: bytes) -> bytes:
    """256 buckets: collisions everywhere, but not always."""
    return hashlib.blake2b(data, digest_size=1).digest()


HASHES = pytest.mark.parametrize("hash_fn", [blake2b_128, constant_hash, one_byte_hash])


def make_manager(hash_fn: HashFn, num_blocks: int = 32) -> BlockManager:
    return BlockManager(BlockManagerConfig(num_blocks=num_blocks, block_size=4), hash_fn=hash_fn)


def admit_and_compute(manager: BlockManager, seq_id: str, token_ids: list[int], keys: ExtraKeys) -> None:
    assert manager.allocate(seq_id, token_ids, keys)
    manager.cache_full_blocks(seq_id, len(token_ids))


@HASHES
@pytest.mark.parametrize(
    ("keys_a", "keys_b"),
    [
        (ExtraKeys.of(SMOL, tenant_key("acme")), ExtraKeys.of(SMOL, tenant_key("globex"))),
        (ExtraKeys.of(SMOL, tenant_key("acme")), ExtraKeys.of(SMOL)),
        (ExtraKeys.of(model_key("m", "r1", "bfloat16")), ExtraKeys.of(model_key("m", "r2", "bfloat16"))),
        (ExtraKeys.of(model_key("m", "r1", "bfloat16")), ExtraKeys.of(model_key("m", "r1", "float32"))),
        (ExtraKeys.of(SMOL), NO_EXTRA_KEYS),
        (ExtraKeys.of(tenant_key("x")), ExtraKeys.of(adapter_key("x"))),
    ],
    ids=["two-tenants", "tenant-vs-none", "two-revisions", "two-dtypes", "model-vs-none", "tag-not-value"],
)
def test_namespaces_never_share_a_block(hash_fn: HashFn, keys_a: ExtraKeys, keys_b: ExtraKeys) -> None:
    manager = make_manager(hash_fn)
    admit_and_compute(manager, "a", PROMPT, keys_a)
    assert manager.find_cached_prefix(PROMPT, keys_b).num_cached_tokens == 0
    admit_and_compute(manager, "b", PROMPT, keys_b)
    assert set(manager.block_table("a")).isdisjoint(manager.block_table("b"))
    assert manager.num_cached_tokens("b") == 0
    # Each namespace still reuses its own blocks.
    assert manager.find_cached_prefix(PROMPT, keys_a).block_ids == tuple(manager.block_table("a")[:3])
    assert manager.find_cached_prefix(PROMPT, keys_b).block_ids == tuple(manager.block_table("b")[:3])


@HASHES
def test_a_block_is_never_reused_at_another_position(hash_fn: HashFn) -> None:
    manager = make_manager(hash_fn)
    admit_and_compute(manager, "a", [1, 1, 1, 1, 2, 2, 2, 2, 9], NO_EXTRA_KEYS)
    # Block (2, 2, 2, 2) exists, but after (1, 1, 1, 1): its KV is wrong as a first block.
    assert manager.find_cached_prefix([2, 2, 2, 2, 9], NO_EXTRA_KEYS).num_cached_tokens == 0


@HASHES
def test_a_block_is_never_reused_after_another_parent(hash_fn: HashFn) -> None:
    manager = make_manager(hash_fn)
    admit_and_compute(manager, "a", [1, 1, 1, 1, 3, 3, 3, 3, 9], NO_EXTRA_KEYS)
    admit_and_compute(manager, "b", [2, 2, 2, 2, 5, 5, 5, 5, 9], NO_EXTRA_KEYS)
    # (2,2,2,2) is cached and (3,3,3,3) is cached, but never (3,3,3,3) after (2,2,2,2).
    match = manager.find_cached_prefix([2, 2, 2, 2, 3, 3, 3, 3, 9], NO_EXTRA_KEYS)
    assert match.block_ids == (manager.block_table("b")[0],)


@HASHES
def test_correct_reuse_survives_collisions(hash_fn: HashFn) -> None:
    manager = make_manager(hash_fn)
    prompts = {f"p{first}": [first] * 4 + [first + 10] * 4 + [first + 20] * 4 + [0] for first in range(1, 6)}
    for seq_id, prompt in prompts.items():
        admit_and_compute(manager, seq_id, prompt, NO_EXTRA_KEYS)
    for seq_id, prompt in prompts.items():
        assert manager.find_cached_prefix(prompt, NO_EXTRA_KEYS).block_ids == tuple(
            manager.block_table(seq_id)[:3]
        )


@HASHES
def test_every_hit_holds_exactly_the_prompt_prefix(hash_fn: HashFn) -> None:
    # Many short prompts over a tiny alphabet share and collide a lot. `written` records, outside the
    # manager, which full prefix each block's KV was computed for; every hit must match it.
    manager = make_manager(hash_fn, num_blocks=64)
    written: dict[int, tuple[int, ...]] = {}
    prompts = [[(seed * 7 + index * index) % 3 for index in range(9)] for seed in range(12)]
    for number, prompt in enumerate(prompts):
        seq_id = f"s{number}"
        assert manager.allocate(seq_id, prompt)
        table = manager.block_table(seq_id)
        num_hit_blocks = manager.num_cached_tokens(seq_id) // 4
        for index in range(num_hit_blocks):
            assert written[table[index]] == tuple(prompt[: (index + 1) * 4])
        for index in range(num_hit_blocks, len(prompt) // 4):
            written[table[index]] = tuple(prompt[: (index + 1) * 4])
        manager.cache_full_blocks(seq_id, len(prompt))
    assert manager.stats().prefix_cache_hits > 0
