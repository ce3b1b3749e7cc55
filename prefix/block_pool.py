"""The pool that owns every KV block: ref counts, the free queue and the hash → block map.

A block is in exactly one of three states:
  - in use: `ref_count > 0`, held by one or more sequences, never in the free queue;
  - cached but free: `ref_count == 0`, in the free queue, still in the hash map — a prefix hit
    revives it (lazy eviction);
  - empty: `ref_count == 0`, in the free queue, no content.
A cached block is evicted only when the free queue hands it out for new data.

A hit is proven, not trusted: besides the hash, a cached block records its token ids, its parent's
content id and (first block only) the namespace, and `find_cached_block` compares all three. Content
ids are process-local and interned — two blocks get the same id exactly when they hold the same
namespace and the same tokens from the start of the chain — so even a hash function that always
collides can only cost misses, never serve wrong KV.

The pool knows nothing about sequences or token lists; the manager decides what to allocate.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from prefix.free_queue import FreeBlockQueue
from prefix.hashing import BlockHash, ExtraKeys


@dataclass(frozen=True, slots=True)
class BlockContent:
    """What a cached (full, computed) block holds, and the evidence a hit is checked against."""

    block_hash: BlockHash
    token_ids: tuple[int, ...]
    content_id: int
    """Process-local id of (namespace, every token up to the end of this block)."""
    parent_content_id: int | None
    """None for the first block of a chain."""
    extra_keys: ExtraKeys | None
    """The namespace; set on the first block of a chain only (later blocks inherit it via the parent)."""

    def holds(self, parent_content_id: int | None, token_ids: tuple[int, ...], extra_keys: ExtraKeys) -> bool:
        """Whether this is exactly the KV for `token_ids` after that parent (or first in that namespace)."""
        if self.token_ids != token_ids or self.parent_content_id != parent_content_id:
            return False
        return parent_content_id is not None or self.extra_keys == extra_keys


@dataclass(slots=True, eq=False)
class Block:
    """One physical KV block. `content` is None until the block is full, computed and cached."""

    block_id: int
    ref_count: int = 0
    content: BlockContent | None = None

    @property
    def block_hash(self) -> BlockHash | None:
        """The chained hash, or None while the block is not cached."""
        return None if self.content is None else self.content.block_hash


class BlockPool:
    """Owns `num_blocks` blocks; hands them out least-recently-used first and caches full ones."""

    def __init__(self, num_blocks: int) -> None:
        if num_blocks <= 0:
            raise ValueError(f"num_blocks must be > 0, got {num_blocks}")
        self.blocks = [Block(block_id) for block_id in range(num_blocks)]
        self.free_queue = FreeBlockQueue(range(num_blocks))
        # Several blocks may share a hash: duplicates of one content (two sequences computed the
        # same prefix at once) or, with a bad hash function, different contents.
        self._cached: dict[BlockHash, dict[int, Block]] = {}
        self._next_content_id = 0
        self._num_cached_free = 0
        self.num_evictions = 0

    @property
    def num_blocks(self) -> int:
        """All blocks, whatever their state."""
        return len(self.blocks)

    @property
    def num_free_blocks(self) -> int:
        """Blocks that can be handed out now: empty ones plus cached-but-free ones."""
        return len(self.free_queue)

    @property
    def num_used_blocks(self) -> int:
        """Blocks held by at least one sequence."""
        return len(self.blocks) - len(self.free_queue)

    @property
    def num_cached_free_blocks(self) -> int:
        """Free blocks that still hold reusable KV."""
        return self._num_cached_free

    def find_cached_block(
        self,
        block_hash: BlockHash,
        parent: Block | None,
        token_ids: tuple[int, ...],
        extra_keys: ExtraKeys,
    ) -> Block | None:
        """The cached block holding `token_ids` after `parent` (or first in `extra_keys`' namespace)."""
        candidates = self._cached.get(block_hash)
        if candidates is None:
            return None
        parent_content_id = _content_id(parent)
        for block in candidates.values():
            assert block.content is not None
            if block.content.holds(parent_content_id, token_ids, extra_keys):
                return block
        return None

    def take_free_blocks(self, num_blocks: int) -> list[Block]:
        """Hand out `num_blocks` blocks with ref count 1, evicting cached content they still hold."""
        if num_blocks > len(self.free_queue):
            raise ValueError(f"asked for {num_blocks} blocks, only {len(self.free_queue)} free")
        taken = []
        for _ in range(num_blocks):
            block = self.blocks[self.free_queue.popleft()]
            assert block.ref_count == 0
            if block.content is not None:
                self._evict(block)
            block.ref_count = 1
            taken.append(block)
        return taken

    def touch(self, blocks: Iterable[Block]) -> None:
        """Add a reference to cached blocks hit by a new sequence, reviving free ones."""
        for block in blocks:
            assert block.content is not None, "only cached blocks are shared"
            if block.ref_count == 0:
                self.free_queue.remove(block.block_id)
                self._num_cached_free -= 1
            block.ref_count += 1

    def share(self, blocks: Iterable[Block]) -> None:
        """Add a reference to blocks in use, for a sequence forked from the one holding them."""
        for block in blocks:
            assert block.ref_count > 0, f"block {block.block_id} is not in use"
            block.ref_count += 1

    def cache_block(
        self,
        block: Block,
        block_hash: BlockHash,
        token_ids: tuple[int, ...],
        parent: Block | None,
        extra_keys: ExtraKeys,
    ) -> None:
        """Make a full block whose KV is written findable. `parent` must be cached already;
        `extra_keys` is recorded for the first block of a chain (`parent is None`) only.
        """
        assert block.content is None, f"block {block.block_id} is already cached"
        assert block.ref_count == 1, "only a block its writer holds alone can be cached"
        twin = self.find_cached_block(block_hash, parent, token_ids, extra_keys)
        if twin is not None:
            assert twin.content is not None
            content_id = twin.content.content_id
        else:
            content_id = self._next_content_id
            self._next_content_id += 1
        block.content = BlockContent(
            block_hash=block_hash,
            token_ids=token_ids,
            content_id=content_id,
            parent_content_id=_content_id(parent),
            extra_keys=extra_keys if parent is None else None,
        )
        self._cached.setdefault(block_hash, {})[block.block_id] = block

    def free_blocks(self, blocks: Iterable[Block]) -> None:
        """Drop one reference from each block, given in eviction order (first evicted first).

        A block nobody holds goes back to the free queue: at the back if it is cached (kept as long
        as possible), at the front if it is empty (handing it out loses nothing).
        """
        for block in blocks:
            assert block.ref_count > 0, f"block {block.block_id} freed more often than taken"
            block.ref_count -= 1
            if block.ref_count > 0:
                continue
            if block.content is None:
                self.free_queue.appendleft(block.block_id)
            else:
                self.free_queue.append(block.block_id)
                self._num_cached_free += 1

    def reset(self) -> bool:
        """Forget every cached content. Refuses (returns False, changes nothing) while any block is
        in use, because a live sequence's blocks must keep their identity.
        """
        if len(self.free_queue) != len(self.blocks):
            return False
        for block in self.blocks:
            block.content = None
        self._cached.clear()
        self._num_cached_free = 0
        return True

    def cached_blocks(self) -> Iterator[Block]:
        """Every cached block, in use or free (for metrics and tests)."""
        for candidates in self._cached.values():
            yield from candidates.values()

    def _evict(self, block: Block) -> None:
        assert block.content is not None
        candidates = self._cached[block.content.block_hash]
        del candidates[block.block_id]
        if not candidates:
            del self._cached[block.content.block_hash]
        block.content = None
        self._num_cached_free -= 1
        self.num_evictions += 1


def _content_id(block: Block | None) -> int | None:
    if block is None:
        return None
    assert block.content is not None, "a parent block must be cached before its children"
    return block.content.content_id
