"""The model runner: one forward step for a batch of sequence chunks over a paged KV cache.

It owns the model and the cache tensors, turns the chunks it is given into `PagingMetadata`, and returns
logits. It makes no decisions: which sequences run, how many tokens each computes and which blocks they
use are the scheduler's (it passes block tables as plain lists of block ids, as the prefix block manager
keeps them). Sampling is `engine.sampler`'s.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from engine.attention import KVCache
from engine.model import LlamaModel
from engine.paging import SequenceChunk, build_paging_metadata


class ModelRunner:
    """Runs `LlamaModel` steps against one KV cache of `num_blocks` blocks of `block_size` tokens."""

    def __init__(self, model: LlamaModel, num_blocks: int, block_size: int) -> None:
        if num_blocks <= 0 or block_size <= 0:
            raise ValueError("num_blocks and block_size must be positive")
        self.model = model.eval()
        self.config = model.config
        self.block_size = block_size
        parameter = next(model.parameters())
        self.device = parameter.device
        self.kv_cache = KVCache.allocate(model.config, num_blocks, block_size, parameter.dtype, self.device)

    @property
    def num_blocks(self) -> int:
        return self.kv_cache.num_blocks

    @torch.inference_mode()
    def execute(self, chunks: Sequence[SequenceChunk]) -> torch.Tensor:
        """Compute the chunks' new tokens, writing their K/V into their blocks.

        Returns float32 logits (R, vocab): one row per chunk asking for `LogitsFor.LAST`, one per new token
        for `LogitsFor.ALL`, none for `LogitsFor.NONE`, in chunk order.
        """
        for chunk in chunks:
            if (
                chunk.block_table
                and not 0 <= min(chunk.block_table) <= max(chunk.block_table) < self.num_blocks
            ):
                raise ValueError(f"block table {list(chunk.block_table)} is outside 0..{self.num_blocks - 1}")
        metadata = build_paging_metadata(chunks, self.block_size, self.device)
        input_ids = torch.tensor(
            [token for chunk in chunks for token in chunk.token_ids], dtype=torch.int64, device=self.device
        )
        return self.model(input_ids, metadata, self.kv_cache)
