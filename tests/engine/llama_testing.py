"""Builders for engine tests: tiny random Llamas (ours and transformers' with the same weights), a toy
block allocator and a toy scheduler that drives `ModelRunner` the ways the real scheduler will
(prefix reuse, chunked prefill, mixed prefill/decode batches of different lengths)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from engine.model.config import ModelConfig
from engine.model.llama import LlamaModel
from engine.model.paging import LogitsFor, SequenceChunk
from engine.runner import ModelRunner

TINY_LLAMA: dict[str, Any] = dict(
    vocab_size=97,
    hidden_size=48,
    intermediate_size=80,
    num_hidden_layers=2,
    num_attention_heads=6,
    num_key_value_heads=2,
    max_position_embeddings=256,
    rms_norm_eps=1e-5,
    tie_word_embeddings=False,
    rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
)


QUANTISABLE_LLAMA: dict[str, int] = dict(
    hidden_size=64, intermediate_size=96, num_attention_heads=4, num_key_value_heads=2
)
"""A tiny Llama whose widths the int4 and native kernels take (multiples of their groups)."""


def make_hf_llama(seed: int = 0, **overrides: Any) -> LlamaForCausalLM:
    """A randomly initialised transformers Llama; weights scaled up so logits are far from uniform."""
    torch.manual_seed(seed)
    model = LlamaForCausalLM(LlamaConfig(**{**TINY_LLAMA, **overrides})).eval()
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if "norm" in name:
                parameter.uniform_(0.5, 1.5)  # not all ones: a mix-up of norm weights must show
            else:
                parameter.normal_(0.0, 0.2)
    return model


def make_engine_model(hf_model: Any) -> LlamaModel:
    return LlamaModel.from_hf_weights(ModelConfig.from_hf(hf_model.config), hf_model.state_dict())


@torch.no_grad()
def hf_logits(hf_model: Any, token_ids: list[int]) -> torch.Tensor:
    """(len, vocab) logits of every position, one uncached forward."""
    return hf_model(torch.tensor([token_ids])).logits[0].float()


@torch.no_grad()
def hf_greedy(hf_model: Any, prompt: list[int], max_new_tokens: int) -> list[int]:
    """Reference greedy decoding: a full uncached forward per token, no eos."""
    tokens = list(prompt)
    for _ in range(max_new_tokens):
        tokens.append(int(hf_model(torch.tensor([tokens])).logits[0, -1].argmax()))
    return tokens[len(prompt) :]


class BlockAllocator:
    """The smallest possible block manager: a free list, handed out back to front to scramble ids."""

    def __init__(self, num_blocks: int) -> None:
        self.free = list(range(num_blocks))

    def allocate(self, count: int) -> list[int]:
        if count > len(self.free):
            raise RuntimeError("out of blocks")
        taken, self.free = self.free[-count:][::-1], self.free[:-count]
        return taken


@dataclass
class ToySequence:
    prompt: list[int]
    max_new_tokens: int
    block_table: list[int] = field(default_factory=list)
    num_computed: int = 0  # tokens whose K/V are in the cache
    output: list[int] = field(default_factory=list)
    stop_token_ids: tuple[int, ...] = ()

    @property
    def tokens(self) -> list[int]:
        return self.prompt + self.output

    @property
    def done(self) -> bool:
        stopped = bool(self.output) and self.output[-1] in self.stop_token_ids
        return stopped or len(self.output) >= self.max_new_tokens


def run_greedy(
    runner: ModelRunner,
    allocator: BlockAllocator,
    sequences: list[ToySequence],
    chunk_size: int | None = None,
    start_steps: list[int] | None = None,
) -> list[list[int]]:
    """Greedy-generate all sequences, batched: each step every started, unfinished sequence computes its
    next prefill chunk (at most `chunk_size` tokens) or one decode token. A sequence may arrive with
    `num_computed` tokens (and their blocks) already cached. `start_steps[i]` delays sequence i."""
    block_size = runner.block_size
    start_steps = start_steps or [0] * len(sequences)
    step = 0
    while not all(sequence.done for sequence in sequences):
        batch = [s for s, start in zip(sequences, start_steps, strict=True) if start <= step and not s.done]
        chunks = []
        for sequence in batch:
            remaining = len(sequence.tokens) - sequence.num_computed
            count = remaining if chunk_size is None else min(chunk_size, remaining)
            new_tokens = sequence.tokens[sequence.num_computed : sequence.num_computed + count]
            needed_blocks = -(-(sequence.num_computed + count) // block_size) - len(sequence.block_table)
            if needed_blocks > 0:
                sequence.block_table += allocator.allocate(needed_blocks)
            ends_prompt = sequence.num_computed + count == len(sequence.tokens)
            logits = LogitsFor.LAST if ends_prompt else LogitsFor.NONE
            chunks.append(
                SequenceChunk(new_tokens, sequence.num_computed, list(sequence.block_table), logits)
            )
        if chunks:
            logits = runner.execute(chunks)
            row = 0
            for sequence, chunk in zip(batch, chunks, strict=True):
                sequence.num_computed += len(chunk.token_ids)
                if chunk.logits is LogitsFor.LAST:
                    sequence.output.append(int(logits[row].argmax()))
                    row += 1
            assert row == logits.shape[0]
        step += 1
    return [sequence.output for sequence in sequences]
