"""Per-step paging metadata: where each new token's K/V goes and which cached K/V each sequence reads.

A step computes a flat run of T new tokens drawn from B sequences (prefill chunks and decode tokens mixed).
The runner describes each sequence with a `SequenceChunk` (plain ints: the future scheduler builds them
from the prefix block manager's block tables) and `build_paging_metadata` turns the batch into tensors the
model reads. Nothing here is global: the metadata is an argument of every forward call.

Cache layout it assumes: a slot is `block_id * block_size + offset`, the flat index of one token's K/V in a
cache tensor shaped (num_blocks, block_size, num_kv_heads, head_dim).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum

import torch


class LogitsFor(Enum):
    """Which of a chunk's new tokens need logits: none (a prefill chunk that does not end the prompt),
    the last one (to sample the next token), or all of them (scoring, tests)."""

    NONE = "none"
    LAST = "last"
    ALL = "all"


@dataclass(frozen=True, slots=True)
class SequenceChunk:
    """One sequence's share of a step: the new tokens to compute, after `num_cached_tokens` already in KV."""

    token_ids: Sequence[int]
    num_cached_tokens: int
    block_table: Sequence[int]  # block ids covering positions [0, num_cached_tokens + len(token_ids))
    logits: LogitsFor = LogitsFor.LAST

    def __post_init__(self) -> None:
        if len(self.token_ids) == 0:
            raise ValueError("a chunk computes at least one token")
        if self.num_cached_tokens < 0:
            raise ValueError("num_cached_tokens must be >= 0")

    @property
    def context_len(self) -> int:
        """Tokens of this sequence in the cache once the step has written its new K/V."""
        return self.num_cached_tokens + len(self.token_ids)


@dataclass(frozen=True, slots=True)
class PagingMetadata:
    """Tensors (and their host copies) that tell attention where to write and read K/V for one step."""

    block_size: int
    positions: torch.Tensor  # (T,) int64: position of each new token within its sequence
    slot_mapping: torch.Tensor  # (T,) int64: cache slot each new token's K/V is written to
    block_tables: torch.Tensor  # (B, max_blocks) int64: padded with 0, never read past context_lens
    context_lens: torch.Tensor  # (B,) int64: cached + new tokens per sequence
    query_start_loc: torch.Tensor  # (B + 1,) int64: sequence b's new tokens are rows [start[b], start[b+1])
    logits_indices: torch.Tensor  # (R,) int64: rows of the flat token axis whose logits are returned
    # Host copies, so that planning attention never waits on a device-to-host copy.
    host_query_lens: tuple[int, ...]
    host_context_lens: tuple[int, ...]

    @property
    def num_tokens(self) -> int:
        return int(self.positions.shape[0])

    @property
    def num_sequences(self) -> int:
        return len(self.host_query_lens)


def build_paging_metadata(
    chunks: Sequence[SequenceChunk], block_size: int, device: torch.device | str = "cpu"
) -> PagingMetadata:
    """Flatten a batch of chunks into the tensors the model reads. Token order follows chunk order."""
    if not chunks:
        raise ValueError("a step needs at least one chunk")
    if block_size <= 0:
        raise ValueError("block_size must be positive")
    positions: list[int] = []
    slots: list[int] = []
    query_start = [0]
    logits_rows: list[int] = []
    for chunk in chunks:
        if len(chunk.block_table) * block_size < chunk.context_len:
            raise ValueError(
                f"block table of {len(chunk.block_table)} blocks cannot hold {chunk.context_len} tokens"
            )
        start = query_start[-1]
        new_positions = range(chunk.num_cached_tokens, chunk.context_len)
        positions.extend(new_positions)
        slots.extend(chunk.block_table[p // block_size] * block_size + p % block_size for p in new_positions)
        query_start.append(start + len(chunk.token_ids))
        if chunk.logits is LogitsFor.LAST:
            logits_rows.append(query_start[-1] - 1)
        elif chunk.logits is LogitsFor.ALL:
            logits_rows.extend(range(start, query_start[-1]))
    max_blocks = max(len(chunk.block_table) for chunk in chunks)
    block_tables = [list(chunk.block_table) + [0] * (max_blocks - len(chunk.block_table)) for chunk in chunks]

    def as_tensor(values: list[int] | list[list[int]]) -> torch.Tensor:
        return torch.tensor(values, dtype=torch.int64, device=device)

    context_lens = [chunk.context_len for chunk in chunks]
    return PagingMetadata(
        block_size=block_size,
        positions=as_tensor(positions),
        slot_mapping=as_tensor(slots),
        block_tables=as_tensor(block_tables),
        context_lens=as_tensor(context_lens),
        query_start_loc=as_tensor(query_start),
        logits_indices=as_tensor(logits_rows),
        host_query_lens=tuple(len(chunk.token_ids) for chunk in chunks),
        host_context_lens=tuple(context_lens),
    )
