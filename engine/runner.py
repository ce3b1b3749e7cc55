"""The model runner: one forward step for a batch of sequence chunks over a paged KV cache.

It owns the model and the cache tensors, turns the chunks it is given into `PagingMetadata`, and returns
logits. It makes no decisions: which sequences run, how many tokens each computes and which blocks they
use are the scheduler's (it passes block tables as plain lists of block ids, as the prefix block manager
keeps them). Sampling is `engine.sampler`'s.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from engine.model.attention import KVCache
from engine.model.llama import LlamaModel
from engine.model.native_decode import DecodeKernel, NativeDecoder
from engine.model.paging import LogitsFor, SequenceChunk, build_paging_metadata


class ModelRunner:
    """Runs `LlamaModel` steps against one KV cache of `num_blocks` blocks of `block_size` tokens."""

    def __init__(
        self, model: LlamaModel, num_blocks: int, block_size: int, decode_kernel: DecodeKernel = "auto"
    ) -> None:
        if num_blocks <= 0 or block_size <= 0:
            raise ValueError("num_blocks and block_size must be positive")
        self.model = model.eval()
        self.config = model.config
        self.block_size = block_size
        parameter = next(model.parameters())
        self.device = parameter.device
        self.kv_cache = KVCache.allocate(model.config, num_blocks, block_size, parameter.dtype, self.device)
        # Pure-decode steps of an int4 model run as one native call where it builds (engine.model.native_decode).
        self.native = NativeDecoder.create(model, self.kv_cache, decode_kernel)

    @property
    def num_blocks(self) -> int:
        return self.kv_cache.num_blocks

    @torch.inference_mode()
    def execute(
        self, chunks: Sequence[SequenceChunk], block_copies: Sequence[tuple[int, int]] = ()
    ) -> torch.Tensor:
        """Compute the chunks' new tokens, writing their K/V into their blocks, after copying the
        (source, destination) `block_copies` (the scheduler's copy-on-write of forked sequences).

        Returns float32 logits (R, vocab): one row per chunk asking for `LogitsFor.LAST`, one per new token
        for `LogitsFor.ALL`, none for `LogitsFor.NONE`, in chunk order.
        """
        for chunk in chunks:
            self._check_blocks(chunk)
        self.kv_cache.copy_blocks(list(block_copies))
        if self.native is None:
            return self._torch_step(chunks)
        decoding = [len(chunk.token_ids) == 1 and chunk.logits is LogitsFor.LAST for chunk in chunks]
        if not any(decoding):
            return self._torch_step(chunks)
        # Every decode row runs natively, whatever else is in the step: a sequence's tokens never depend on
        # what it was batched with. Prefill chunks (and scoring) run on torch beside them.
        decode_chunks = [chunk for chunk, decodes in zip(chunks, decoding, strict=True) if decodes]
        decoded = self._native_step(decode_chunks)
        if all(decoding):
            return decoded
        rest = self._torch_step(
            [chunk for chunk, decodes in zip(chunks, decoding, strict=True) if not decodes]
        )
        pieces, next_decoded, next_rest = [], 0, 0
        for chunk, decodes in zip(chunks, decoding, strict=True):
            if decodes:
                pieces.append(decoded[next_decoded : next_decoded + 1])
                next_decoded += 1
            else:
                rows = {LogitsFor.NONE: 0, LogitsFor.LAST: 1, LogitsFor.ALL: len(chunk.token_ids)}[
                    chunk.logits
                ]
                pieces.append(rest[next_rest : next_rest + rows])
                next_rest += rows
        return torch.cat(pieces)

    @property
    def bursts(self) -> bool:
        """Can `burst` run here (the native step, over a model whose tied head is the embedding table)?"""
        return self.native is not None and self.native.bursts

    @torch.inference_mode()
    def burst(self, chunk: SequenceChunk, steps: int, stop_ids: Sequence[int]) -> list[int]:
        """Greedy tokens after a one-token decode chunk, up to `steps` of them in one native call (the last one
        sampled, not yet computed); stops after a token of `stop_ids`. The positions it computes, from the
        chunk's token on, must lie in the chunk's block table."""
        assert self.native is not None
        if len(chunk.token_ids) != 1 or chunk.logits is not LogitsFor.LAST or steps < 1:
            raise ValueError("a burst starts from one decode row")
        self._check_blocks(chunk)
        return self.native.decode_burst(chunk, self.block_size, steps, stop_ids)

    def _check_blocks(self, chunk: SequenceChunk) -> None:
        if chunk.block_table and not 0 <= min(chunk.block_table) <= max(chunk.block_table) < self.num_blocks:
            raise ValueError(f"block table {list(chunk.block_table)} is outside 0..{self.num_blocks - 1}")

    @property
    def decode_kernel(self) -> str:
        """Which code runs decode steps: `native (<instruction set>, <dot form>, <what each build measured>)` or
        `torch`."""
        if self.native is None:
            return "torch"
        return f"native ({self.native.form.describe()})"

    def _torch_step(self, chunks: Sequence[SequenceChunk]) -> torch.Tensor:
        metadata = build_paging_metadata(chunks, self.block_size, self.device)
        return self.model(self._input_ids(chunks), metadata, self.kv_cache)

    def _native_step(self, chunks: Sequence[SequenceChunk]) -> torch.Tensor:
        assert self.native is not None
        metadata = build_paging_metadata(chunks, self.block_size, self.device)
        return self.native.decode(self._input_ids(chunks), metadata)

    def _input_ids(self, chunks: Sequence[SequenceChunk]) -> torch.Tensor:
        return torch.tensor(
            [token for chunk in chunks for token in chunk.token_ids], dtype=torch.int64, device=self.device
        )
