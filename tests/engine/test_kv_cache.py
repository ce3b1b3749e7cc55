"""The KV pool reads as zeros and costs resident memory only for the blocks that have been written."""

from __future__ import annotations

from pathlib import Path

import torch

from engine.model.attention import KVCache
from engine.model.config import ModelConfig
from tests.engine.llama_testing import TINY_LLAMA

CONFIG = ModelConfig.from_hf({**TINY_LLAMA, "num_hidden_layers": 4})  # 2 kv heads of 8 dims


def rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


def test_a_large_pool_is_zeros_and_resident_only_where_written() -> None:
    before = rss_mb()
    # 4 layers x 2 x 32,768 blocks x 16 tokens x 2 heads x 8 dims x 4 bytes = 256 MiB.
    cache = KVCache.allocate(CONFIG, num_blocks=32768, block_size=16)
    assert rss_mb() - before < 32
    assert cache.bytes_per_block() * cache.num_blocks == 256 * 2**20
    assert all(t.shape == (32768, 16, 2, 8) and t.dtype == torch.float32 for t in cache.keys + cache.values)
    assert float(cache.keys[3][-1].abs().sum()) == 0.0 and float(cache.values[0][7].abs().sum()) == 0.0
    cache.keys[1][5] = 1.0
    cache.values[1][5] = 2.0
    assert float(cache.keys[1][5].mean()) == 1.0 and float(cache.keys[0][5].abs().sum()) == 0.0
    assert float(cache.values[1][5].mean()) == 2.0 and float(cache.values[1][4].abs().sum()) == 0.0
    assert rss_mb() - before < 32


def test_layers_do_not_share_memory() -> None:
    cache = KVCache.allocate(CONFIG, num_blocks=4, block_size=2)
    for tensor in cache.keys + cache.values:
        tensor.fill_(0)
    cache.keys[2].fill_(3.0)
    assert [float(t.sum()) for t in cache.keys + cache.values].count(0.0) == 2 * CONFIG.num_layers - 1
