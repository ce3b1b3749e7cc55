"""Paged KV block accounting with hash-chained exact prefix reuse. Pure Python: no torch, no engine."""

from prefix.block_pool import Block, BlockPool
from prefix.hashing import (
    NO_EXTRA_KEYS,
    BlockHash,
    ExtraKey,
    ExtraKeys,
    HashFn,
    adapter_key,
    blake2b_128,
    hash_block_tokens,
    model_key,
    tenant_key,
)
from prefix.manager import BlockManager, BlockManagerConfig, PrefixMatch, SeqId
from prefix.stats import PrefixCacheStats

__all__ = [
    "NO_EXTRA_KEYS",
    "Block",
    "BlockHash",
    "BlockManager",
    "BlockManagerConfig",
    "BlockPool",
    "ExtraKey",
    "ExtraKeys",
    "HashFn",
    "PrefixCacheStats",
    "PrefixMatch",
    "SeqId",
    "adapter_key",
    "blake2b_128",
    "hash_block_tokens",
    "model_key",
    "tenant_key",
]
