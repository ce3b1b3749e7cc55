"""The free list: block ids in eviction order, front first.

Every operation the pool needs is O(1): take the front (least recently used), add at the back
(most recently used), add at the front (an empty block, nothing to lose), and remove from the middle
(a cached-but-free block revived by a prefix hit). `OrderedDict` is exactly a doubly-linked list
with a hash index over it, implemented in C, so it gives all four without a hand-written list.

This module knows block ids only: not hashes, not ref counts.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Iterator


class FreeBlockQueue:
    """Free block ids, least recently used first."""

    def __init__(self, block_ids: Iterable[int] = ()) -> None:
        self._ids: OrderedDict[int, None] = OrderedDict()
        for block_id in block_ids:
            self.append(block_id)

    def popleft(self) -> int:
        """Remove and return the block id to hand out next (the eviction candidate)."""
        if not self._ids:
            raise IndexError("pop from an empty free block queue")
        block_id, _ = self._ids.popitem(last=False)
        return block_id

    def append(self, block_id: int) -> None:
        """Add a block at the back: handed out last."""
        self._add(block_id)

    def appendleft(self, block_id: int) -> None:
        """Add a block at the front: handed out next."""
        self._add(block_id)
        self._ids.move_to_end(block_id, last=False)

    def remove(self, block_id: int) -> None:
        """Take a block out of the queue wherever it is."""
        try:
            del self._ids[block_id]
        except KeyError:
            raise KeyError(f"block {block_id} is not free") from None

    def __contains__(self, block_id: object) -> bool:
        return block_id in self._ids

    def __len__(self) -> int:
        return len(self._ids)

    def __iter__(self) -> Iterator[int]:
        """Block ids in the order they would be handed out."""
        return iter(self._ids)

    def _add(self, block_id: int) -> None:
        if block_id in self._ids:
            raise ValueError(f"block {block_id} is already free")
        self._ids[block_id] = None
