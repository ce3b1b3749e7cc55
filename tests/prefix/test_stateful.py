"""Random allocate / compute / append / free / reset against a model of what each block holds.

The model (`written`) records, outside the manager, the namespace and full token prefix whose KV was
written into each block. Every prefix hit must match it, so a wrong reuse — wrong tokens, wrong
position, wrong parent, wrong namespace — fails here whatever the hash function does. The machine
runs with a good hash, a constant one (everything collides) and a one-byte one.
"""

import hashlib
import math
from collections import Counter

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from prefix.hashing import NO_EXTRA_KEYS, ExtraKeys, HashFn, adapter_key, blake2b_128, tenant_key
from prefix.manager import BlockManager, BlockManagerConfig
from prefix.stats import PrefixCacheStats

NUM_BLOCKS = 10
BLOCK_SIZE = 2
NAMESPACES = [NO_EXTRA_KEYS, ExtraKeys.of(tenant_key("a")), ExtraKeys.of(adapter_key("a"))]
# Prompts are a piece of one of two shared bases plus a random tail over a tiny alphabet, so shared
# prefixes, hits, collisions across namespaces and evictions are all common.
BASES = [[0, 1, 2] * 3, [1] * 9]
TOKENS = st.builds(
    lambda base, length, tail: base[:length] + tail,
    st.sampled_from(BASES),
    st.integers(0, 9),
    st.lists(st.integers(0, 2), max_size=3),
).filter(bool)
SETTINGS = settings(max_examples=60, stateful_step_count=40, deadline=None)

Snapshot = tuple[list[int], list[int], PrefixCacheStats, dict[str, list[int]]]


class BlockManagerMachine(RuleBasedStateMachine):
    hash_fn: HashFn = staticmethod(blake2b_128)

    def __init__(self) -> None:
        super().__init__()
        config = BlockManagerConfig(num_blocks=NUM_BLOCKS, block_size=BLOCK_SIZE)
        self.manager = BlockManager(config, hash_fn=type(self).hash_fn)
        self.token_ids: dict[str, list[int]] = {}
        self.namespace: dict[str, ExtraKeys] = {}
        self.num_computed: dict[str, int] = {}
        self.written: dict[int, tuple[ExtraKeys, tuple[int, ...]]] = {}
        self.next_seq = 0

    # Rules ---------------------------------------------------------------------------------------

    @rule(token_ids=TOKENS, namespace=st.sampled_from(NAMESPACES))
    def allocate(self, token_ids: list[int], namespace: ExtraKeys) -> None:
        self.admit(token_ids, namespace)

    @rule(token_ids=TOKENS, namespace=st.sampled_from(NAMESPACES))
    def allocate_and_prefill(self, token_ids: list[int], namespace: ExtraKeys) -> None:
        seq_id = self.admit(token_ids, namespace)
        if seq_id is not None:
            self.write_kv(seq_id, len(token_ids))

    @precondition(lambda self: self.token_ids)
    @rule(data=st.data(), chunk=st.integers(1, 16))
    def compute(self, data: st.DataObject, chunk: int) -> None:
        """A forward pass writes KV for the next `chunk` tokens (a prefill chunk or a decode step)."""
        seq_id = data.draw(st.sampled_from(sorted(self.token_ids)))
        self.write_kv(seq_id, min(len(self.token_ids[seq_id]), self.num_computed[seq_id] + chunk))

    @precondition(lambda self: self.token_ids)
    @rule(data=st.data(), new_token_ids=st.lists(st.integers(0, 2), max_size=5))
    def append(self, data: st.DataObject, new_token_ids: list[int]) -> None:
        seq_id = data.draw(st.sampled_from(sorted(self.token_ids)))
        fits = self.manager.can_append(seq_id, len(new_token_ids))
        before = self.snapshot()
        if not self.manager.append_slots(seq_id, new_token_ids):
            assert not fits
            assert self.snapshot() == before
            return
        assert fits
        self.token_ids[seq_id].extend(new_token_ids)
        table = self.manager.block_table(seq_id)
        assert len(table) == math.ceil(len(self.token_ids[seq_id]) / BLOCK_SIZE)
        for source, target in self.manager.take_block_copies():
            # Copy-on-write: the appending sequence now writes into a block of its own, the others keep
            # the source.
            assert target in table and source not in table
            assert self.manager.pool.blocks[target].ref_count == 1
            assert self.manager.pool.blocks[source].ref_count >= 1

    @precondition(lambda self: any(self.num_computed[s] == len(t) for s, t in self.token_ids.items()))
    @rule(data=st.data())
    def fork(self, data: st.DataObject) -> None:
        """Parallel sampling: a sequence whose tokens are all computed forks; the child shares every block."""
        computed = [s for s, tokens in self.token_ids.items() if self.num_computed[s] == len(tokens)]
        parent = data.draw(st.sampled_from(sorted(computed)))
        child = f"s{self.next_seq}"
        self.next_seq += 1
        free_before = self.manager.num_free_blocks
        self.manager.fork(parent, child)
        assert self.manager.block_table(child) == self.manager.block_table(parent)
        assert self.manager.num_free_blocks == free_before  # nothing is copied until someone writes
        self.token_ids[child] = list(self.token_ids[parent])
        self.namespace[child] = self.namespace[parent]
        self.num_computed[child] = self.num_computed[parent]

    @precondition(lambda self: self.token_ids)
    @rule(data=st.data())
    def free(self, data: st.DataObject) -> None:
        seq_id = data.draw(st.sampled_from(sorted(self.token_ids)))
        self.manager.free(seq_id)
        self.forget(seq_id)

    @rule(drain=st.sampled_from([False, False, False, True]))
    def reset(self, drain: bool) -> None:
        """Reset refuses while sequences are live; sometimes free them all first so it succeeds."""
        if drain:
            self.release_everything()
        reset = self.manager.reset()
        assert reset == (not self.token_ids)
        if reset:
            assert list(self.manager.pool.cached_blocks()) == []
            assert self.manager.pool.num_cached_free_blocks == 0

    def teardown(self) -> None:
        self.release_everything()

    # Invariants ----------------------------------------------------------------------------------

    @invariant()
    def ref_counts_match_the_block_tables(self) -> None:
        holders = Counter(
            block_id for seq_id in self.token_ids for block_id in self.manager.block_table(seq_id)
        )
        for block in self.manager.pool.blocks:
            assert block.ref_count >= 0
            assert block.ref_count == holders[block.block_id]

    @invariant()
    def a_block_is_either_free_or_in_use(self) -> None:
        pool = self.manager.pool
        free_ids = list(pool.free_queue)
        assert len(free_ids) == len(set(free_ids))
        for block in pool.blocks:
            assert (block.block_id in pool.free_queue) == (block.ref_count == 0)

    @invariant()
    def hash_map_agrees_with_the_blocks(self) -> None:
        pool = self.manager.pool
        mapped = []
        # The map itself is private; this invariant is exactly about it, so it looks inside.
        for block_hash, candidates in pool._cached.items():
            assert candidates
            for block_id, block in candidates.items():
                assert block.block_id == block_id and block.block_hash == block_hash
                mapped.append(block_id)
        assert len(mapped) == len(set(mapped))
        assert set(mapped) == {block.block_id for block in pool.blocks if block.content is not None}
        cached_free = [block for block in pool.blocks if block.ref_count == 0 and block.content is not None]
        assert pool.num_cached_free_blocks == len(cached_free)

    @invariant()
    def writable_blocks_are_owned_by_one_sequence(self) -> None:
        """An uncached block is shared only by forked sequences, as their last, partly filled block (the
        first of them to append a token copies it)."""
        for seq_id, token_ids in self.token_ids.items():
            table = self.manager.block_table(seq_id)
            for position, block_id in enumerate(table):
                block = self.manager.pool.blocks[block_id]
                if block.content is None and block.ref_count > 1:
                    assert position == len(table) - 1 and len(token_ids) % BLOCK_SIZE != 0
                elif block.content is None:
                    assert block.ref_count == 1

    @invariant()
    def stats_agree_with_the_pool(self) -> None:
        stats = self.manager.stats()
        assert stats.num_blocks_in_use == NUM_BLOCKS - self.manager.num_free_blocks
        assert 0 <= stats.prefix_cache_hits <= stats.prefix_cache_queries

    # Helpers -------------------------------------------------------------------------------------

    def admit(self, token_ids: list[int], namespace: ExtraKeys) -> str | None:
        seq_id = f"s{self.next_seq}"
        self.next_seq += 1
        match = self.manager.find_cached_prefix(token_ids, namespace)
        fits = self.manager.can_allocate(token_ids, namespace)
        before = self.snapshot()
        if not self.manager.allocate(seq_id, token_ids, namespace):
            assert not fits
            assert self.snapshot() == before
            return None
        assert fits
        table = self.manager.block_table(seq_id)
        num_cached_tokens = self.manager.num_cached_tokens(seq_id)
        assert len(table) == math.ceil(len(token_ids) / BLOCK_SIZE)
        assert num_cached_tokens % BLOCK_SIZE == 0
        assert num_cached_tokens <= len(token_ids) - 1
        assert tuple(table[: num_cached_tokens // BLOCK_SIZE]) == match.block_ids
        for index in range(num_cached_tokens // BLOCK_SIZE):
            # The reused KV is exactly what this prompt would have computed.
            assert self.written[table[index]] == (namespace, tuple(token_ids[: (index + 1) * BLOCK_SIZE]))
        self.token_ids[seq_id] = list(token_ids)
        self.namespace[seq_id] = namespace
        self.num_computed[seq_id] = num_cached_tokens
        return seq_id

    def write_kv(self, seq_id: str, num_computed: int) -> None:
        """Play the model runner: write KV up to `num_computed` tokens, then tell the manager."""
        token_ids, table = self.token_ids[seq_id], self.manager.block_table(seq_id)
        start = self.num_computed[seq_id]
        for position in range(start, num_computed):
            block = self.manager.pool.blocks[table[position // BLOCK_SIZE]]
            # No two live sequences write the same block, and cached KV is never overwritten.
            assert block.ref_count == 1 and block.content is None
        for index in range(start // BLOCK_SIZE, num_computed // BLOCK_SIZE):
            self.written[table[index]] = (
                self.namespace[seq_id],
                tuple(token_ids[: (index + 1) * BLOCK_SIZE]),
            )
        self.manager.cache_full_blocks(seq_id, num_computed)
        self.num_computed[seq_id] = num_computed

    def snapshot(self) -> Snapshot:
        pool = self.manager.pool
        tables = {seq_id: self.manager.block_table(seq_id) for seq_id in self.token_ids}
        return list(pool.free_queue), [block.ref_count for block in pool.blocks], self.manager.stats(), tables

    def release_everything(self) -> None:
        for seq_id in list(self.token_ids):
            self.manager.free(seq_id)
            self.forget(seq_id)
        pool = self.manager.pool
        assert pool.num_free_blocks == NUM_BLOCKS
        assert all(block.ref_count == 0 for block in pool.blocks)

    def forget(self, seq_id: str) -> None:
        del self.token_ids[seq_id], self.namespace[seq_id], self.num_computed[seq_id]


def _constant_hash(data: bytes) -> bytes:
    return b"\x00"


def _one_byte_hash(data: bytes) -> bytes:
    return hashlib.blake2b(data, digest_size=1).digest()


class ConstantHashMachine(BlockManagerMachine):
    hash_fn = staticmethod(_constant_hash)


class OneByteHashMachine(BlockManagerMachine):
    hash_fn = staticmethod(_one_byte_hash)


TestBlockManager = BlockManagerMachine.TestCase
TestBlockManager.settings = SETTINGS
TestBlockManagerWithConstantHash = ConstantHashMachine.TestCase
TestBlockManagerWithConstantHash.settings = SETTINGS
TestBlockManagerWithOneByteHash = OneByteHashMachine.TestCase
TestBlockManagerWithOneByteHash.settings = SETTINGS
