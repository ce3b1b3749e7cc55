"""A snapshot of the prefix cache's counters and gauges, for /metrics and logs.

Counters (`prefix_cache_queries`, `prefix_cache_hits`, `num_evictions`) only grow; gauges describe
the pool at the moment of the snapshot. Queries and hits are in tokens, with vLLM's meaning: every
admitted prompt adds its length to queries and its reused prefix to hits.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class PrefixCacheStats:
    num_blocks: int
    num_blocks_in_use: int
    """Blocks held by at least one live sequence."""
    num_cached_free_blocks: int
    """Free blocks that still hold reusable KV (revivable by a hit until handed out again)."""
    prefix_cache_queries: int
    """Prompt tokens looked up in the cache."""
    prefix_cache_hits: int
    """Prompt tokens found cached, so not computed again."""
    num_evictions: int
    """Cached blocks whose KV was dropped to make room."""

    @property
    def hit_rate(self) -> float:
        return self.prefix_cache_hits / self.prefix_cache_queries if self.prefix_cache_queries else 0.0

    @property
    def usage(self) -> float:
        """Fraction of blocks in use (cached-but-free blocks count as free)."""
        return self.num_blocks_in_use / self.num_blocks
