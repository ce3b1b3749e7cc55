"""Per-sequence block tables over the pool: the API the engine scheduler calls every step.

The scheduler counts tokens, not phases:
  - `allocate` admits a sequence: it reuses the longest cached prefix of full blocks (never the
    last token, whose logits must be computed) and reserves blocks for every other token;
  - `cache_full_blocks` is called after a forward pass with how many tokens now have KV; full blocks
    up to there become reusable. Chunked prefill and decode take the same path;
  - `append_slots` reserves room for tokens the sampler adds;
  - `fork` gives a new sequence the blocks of a live one (parallel sampling: one prefill, n choices); the
    shared blocks are reference-counted, and the first token a sequence appends to a shared, partly filled
    last block moves it to a copy of that block (copy-on-write; `take_block_copies` tells the engine which
    KV blocks to copy before the step that writes the token);
  - `free` returns a finished or preempted sequence's blocks, last block first.
A call that cannot be satisfied returns False and changes nothing, so the scheduler can preempt
someone and try again. One step of a scheduler, roughly:

    if manager.allocate(seq_id, prompt_ids, extra_keys):      # admission
        num_computed = manager.num_cached_tokens(seq_id)      # skip what the cache already has
    ...                                                       # forward pass over a chunk / one token
    manager.cache_full_blocks(seq_id, num_computed)           # its KV exists now
    while not manager.append_slots(seq_id, [sampled_token]):  # decode
        preempt_someone()                                     # which calls manager.free(victim_id)

Sequences are named by an id the engine chooses; this module never sees tensors or requests. It is
not thread-safe: the engine's step loop owns it.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass

from prefix.block_pool import Block, BlockPool
from prefix.hashing import NO_EXTRA_KEYS, BlockHash, ExtraKeys, HashFn, blake2b_128, hash_block_tokens
from prefix.stats import PrefixCacheStats

SeqId = Hashable


@dataclass(frozen=True, slots=True)
class BlockManagerConfig:
    num_blocks: int
    """Physical KV blocks the engine allocated."""
    block_size: int = 16
    """Tokens per block."""

    def __post_init__(self) -> None:
        for name in ("num_blocks", "block_size"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"{name} must be a positive int, got {value!r}")


@dataclass(frozen=True, slots=True)
class PrefixMatch:
    """The longest cached prefix of a token list, in full blocks."""

    block_ids: tuple[int, ...]
    num_cached_tokens: int


@dataclass(slots=True)
class _SeqBlocks:
    token_ids: list[int]
    extra_keys: ExtraKeys
    blocks: list[Block]
    num_cached_tokens: int
    """Tokens reused from the prefix cache at admission."""
    num_hashed_blocks: int
    """Leading blocks in the pool's hash map: the hits plus this sequence's own full, computed ones."""


class BlockManager:
    """Paged KV block accounting with hash-chained exact prefix reuse."""

    def __init__(self, config: BlockManagerConfig, hash_fn: HashFn = blake2b_128) -> None:
        self.config = config
        self.block_size = config.block_size
        self.pool = BlockPool(config.num_blocks)
        self._hash_fn = hash_fn
        self._seqs: dict[SeqId, _SeqBlocks] = {}
        self._block_copies: list[tuple[int, int]] = []
        self._num_queried_tokens = 0
        self._num_hit_tokens = 0

    # Admission ----------------------------------------------------------------------------------

    def find_cached_prefix(
        self, token_ids: Sequence[int], extra_keys: ExtraKeys = NO_EXTRA_KEYS
    ) -> PrefixMatch:
        """The longest cached prefix of full blocks, at most `len(token_ids) - 1` tokens. Read-only."""
        hits = self._match(token_ids, extra_keys)
        return PrefixMatch(tuple(block.block_id for block in hits), len(hits) * self.block_size)

    def can_allocate(self, token_ids: Sequence[int], extra_keys: ExtraKeys = NO_EXTRA_KEYS) -> bool:
        """Whether `allocate` would succeed now. Read-only."""
        _require_tokens(token_ids)
        hits = self._match(token_ids, extra_keys)
        return self._fits(len(token_ids), hits)

    def allocate(
        self, seq_id: SeqId, token_ids: Sequence[int], extra_keys: ExtraKeys = NO_EXTRA_KEYS
    ) -> bool:
        """Admit a sequence: share its cached prefix, take fresh blocks for the rest of `token_ids`.

        Returns False, changing nothing, when the free blocks do not suffice.
        """
        if seq_id in self._seqs:
            raise ValueError(f"sequence {seq_id!r} already holds blocks")
        _require_tokens(token_ids)
        hits = self._match(token_ids, extra_keys)
        if not self._fits(len(token_ids), hits):
            return False
        # Touch before taking: taking could otherwise evict a cached-but-free block we just hit.
        self.pool.touch(hits)
        fresh = self.pool.take_free_blocks(self._num_blocks_for(len(token_ids)) - len(hits))
        num_cached_tokens = len(hits) * self.block_size
        self._seqs[seq_id] = _SeqBlocks(
            token_ids=list(token_ids),
            extra_keys=extra_keys,
            blocks=hits + fresh,
            num_cached_tokens=num_cached_tokens,
            num_hashed_blocks=len(hits),
        )
        self._num_queried_tokens += len(token_ids)
        self._num_hit_tokens += num_cached_tokens
        return True

    # Growth -------------------------------------------------------------------------------------

    def can_append(self, seq_id: SeqId, num_new_tokens: int = 1) -> bool:
        """Whether `append_slots` with `num_new_tokens` tokens would succeed now. Read-only."""
        return self._num_blocks_to_append(self._seqs[seq_id], num_new_tokens) <= self.pool.num_free_blocks

    def append_slots(self, seq_id: SeqId, new_token_ids: Sequence[int]) -> bool:
        """Add tokens to a sequence, taking a new block whenever the last one is full.

        Returns False, changing nothing, when the free blocks do not suffice.
        """
        seq = self._seqs[seq_id]
        num_new_blocks = self._num_blocks_to_append(seq, len(new_token_ids))
        if num_new_blocks > self.pool.num_free_blocks:
            return False
        if new_token_ids and self._writes_shared_block(seq):
            # The new token's KV would land in a block other sequences read: write it into a copy.
            shared = seq.blocks[-1]
            [copy] = self.pool.take_free_blocks(1)
            self.pool.free_blocks([shared])  # drops this sequence's reference; the others keep it
            seq.blocks[-1] = copy
            self._block_copies.append((shared.block_id, copy.block_id))
            num_new_blocks -= 1
        seq.blocks.extend(self.pool.take_free_blocks(num_new_blocks))
        seq.token_ids.extend(new_token_ids)
        return True

    def fork(self, parent_id: SeqId, child_id: SeqId) -> None:
        """Give `child_id` the blocks and tokens of live `parent_id`, sharing every block (no copy now)."""
        if child_id in self._seqs:
            raise ValueError(f"sequence {child_id!r} already holds blocks")
        parent = self._seqs[parent_id]
        self.pool.share(parent.blocks)
        self._seqs[child_id] = _SeqBlocks(
            token_ids=list(parent.token_ids),
            extra_keys=parent.extra_keys,
            blocks=list(parent.blocks),
            num_cached_tokens=parent.num_cached_tokens,
            num_hashed_blocks=parent.num_hashed_blocks,
        )

    def take_block_copies(self) -> list[tuple[int, int]]:
        """(source, destination) block ids whose KV must be copied before the next forward pass, in order;
        cleared by the call."""
        copies, self._block_copies = self._block_copies, []
        return copies

    def cache_full_blocks(self, seq_id: SeqId, num_computed_tokens: int) -> None:
        """Make the sequence's full blocks among its first `num_computed_tokens` tokens reusable.

        Call it once their KV is written (after the forward pass), so no one can hit a block whose
        KV does not exist yet. Blocks already cached are skipped, so calling it every step is cheap.
        """
        seq = self._seqs[seq_id]
        if not 0 <= num_computed_tokens <= len(seq.token_ids):
            raise ValueError(f"num_computed_tokens={num_computed_tokens} outside [0, {len(seq.token_ids)}]")
        block_size = self.block_size
        for index in range(seq.num_hashed_blocks, num_computed_tokens // block_size):
            parent = seq.blocks[index - 1] if index else None
            block_tokens = tuple(seq.token_ids[index * block_size : (index + 1) * block_size])
            block_hash = self._hash_block(parent, block_tokens, seq.extra_keys)
            self.pool.cache_block(seq.blocks[index], block_hash, block_tokens, parent, seq.extra_keys)
            seq.num_hashed_blocks = index + 1

    # Release ------------------------------------------------------------------------------------

    def free(self, seq_id: SeqId) -> None:
        """Release a sequence's blocks, last block first, so its tail is evicted before its prefix."""
        seq = self._seqs.pop(seq_id)
        self.pool.free_blocks(reversed(seq.blocks))

    def reset(self) -> bool:
        """Drop every cached prefix. Refuses (returns False, changes nothing) while sequences are live."""
        if self._seqs:
            return False
        return self.pool.reset()

    # Reading ------------------------------------------------------------------------------------

    def holds_last_block_alone(self, seq_id: SeqId) -> bool:
        """Whether no other sequence holds the sequence's last block (its K/V may be written in place)."""
        return self._seqs[seq_id].blocks[-1].ref_count == 1

    def block_table(self, seq_id: SeqId) -> list[int]:
        """The sequence's physical block ids, in token order (a copy)."""
        return [block.block_id for block in self._seqs[seq_id].blocks]

    def num_cached_tokens(self, seq_id: SeqId) -> int:
        """Tokens the sequence reused from the cache at admission: its KV is there, skip computing it."""
        return self._seqs[seq_id].num_cached_tokens

    def __contains__(self, seq_id: object) -> bool:
        """Whether the sequence holds blocks."""
        return seq_id in self._seqs

    @property
    def num_free_blocks(self) -> int:
        """Blocks available to new tokens, counting cached-but-free ones (they are evictable)."""
        return self.pool.num_free_blocks

    def stats(self) -> PrefixCacheStats:
        """Counters and gauges for /metrics."""
        return PrefixCacheStats(
            num_blocks=self.pool.num_blocks,
            num_blocks_in_use=self.pool.num_used_blocks,
            num_cached_free_blocks=self.pool.num_cached_free_blocks,
            prefix_cache_queries=self._num_queried_tokens,
            prefix_cache_hits=self._num_hit_tokens,
            num_evictions=self.pool.num_evictions,
        )

    # Helpers ------------------------------------------------------------------------------------

    def _match(self, token_ids: Sequence[int], extra_keys: ExtraKeys) -> list[Block]:
        block_size = self.block_size
        hits: list[Block] = []
        parent: Block | None = None
        # Stop one token short: the last prompt token is always computed, to get its logits.
        for index in range((len(token_ids) - 1) // block_size):
            block_tokens = tuple(token_ids[index * block_size : (index + 1) * block_size])
            block_hash = self._hash_block(parent, block_tokens, extra_keys)
            block = self.pool.find_cached_block(block_hash, parent, block_tokens, extra_keys)
            if block is None:
                break
            hits.append(block)
            parent = block
        return hits

    def _hash_block(
        self, parent: Block | None, block_tokens: tuple[int, ...], extra_keys: ExtraKeys
    ) -> BlockHash:
        if parent is None:
            return hash_block_tokens(self._hash_fn, None, block_tokens, extra_keys)
        assert parent.content is not None
        return hash_block_tokens(self._hash_fn, parent.content.block_hash, block_tokens)

    def _fits(self, num_tokens: int, hits: list[Block]) -> bool:
        # A hit on a cached-but-free block takes it out of the free queue, just like a fresh block.
        num_revived = sum(1 for block in hits if block.ref_count == 0)
        num_fresh = self._num_blocks_for(num_tokens) - len(hits)
        return num_fresh + num_revived <= self.pool.num_free_blocks

    def _num_blocks_to_append(self, seq: _SeqBlocks, num_new_tokens: int) -> int:
        if num_new_tokens < 0:
            raise ValueError(f"num_new_tokens must be >= 0, got {num_new_tokens}")
        num_new_blocks = self._num_blocks_for(len(seq.token_ids) + num_new_tokens) - len(seq.blocks)
        copy_on_write = 1 if num_new_tokens and self._writes_shared_block(seq) else 0
        return num_new_blocks + copy_on_write

    def _writes_shared_block(self, seq: _SeqBlocks) -> bool:
        """Whether the next token goes into a partly filled last block that other sequences hold too."""
        return len(seq.token_ids) % self.block_size != 0 and seq.blocks[-1].ref_count > 1

    def _num_blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)


def _require_tokens(token_ids: Sequence[int]) -> None:
    if not token_ids:
        raise ValueError("a sequence needs at least one token")
