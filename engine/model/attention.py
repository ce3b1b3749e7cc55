"""Paged attention on CPU: write new K/V into cache slots, gather each sequence's K/V, run SDPA.

The KV cache holds, per layer, a key and a value tensor shaped (num_blocks, block_size, num_kv_heads,
head_dim); a token's slot is `block_id * block_size + offset`. Which blocks a sequence owns comes from the
step's `PagingMetadata`; this module never decides it.

The read path gathers K/V through block tables into contiguous tensors and calls
`scaled_dot_product_attention` with grouped-query heads. Gather indices and masks depend only on the
metadata, so `AttentionPlan` builds them once per step and every layer reuses them. Sequences that add one
token (decode) share one padded SDPA call; sequences that add several (prefill chunks) get one call each,
causal over their new tokens and fully visible over their cached prefix.
"""

from __future__ import annotations

import math
import mmap
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from engine.model.config import ModelConfig
from engine.model.paging import PagingMetadata


@dataclass(frozen=True, slots=True)
class KVCache:
    """One key and one value tensor per layer, each (num_blocks, block_size, num_kv_heads, head_dim)."""

    keys: list[torch.Tensor]
    values: list[torch.Tensor]

    @classmethod
    def allocate(
        cls,
        config: ModelConfig,
        num_blocks: int,
        block_size: int,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str = "cpu",
    ) -> KVCache:
        shape = (num_blocks, block_size, config.num_kv_heads, config.head_dim)
        # Zeros, not empty: a padded read past a sequence's end is masked, but must never see NaN garbage.
        if torch.device(device).type == "cpu":
            pool = _lazily_resident_zeros((2, config.num_layers, *shape), dtype)
        else:
            pool = torch.zeros((2, config.num_layers, *shape), dtype=dtype, device=device)
        return cls(keys=list(pool[0].unbind()), values=list(pool[1].unbind()))

    @property
    def num_blocks(self) -> int:
        return int(self.keys[0].shape[0])

    @property
    def block_size(self) -> int:
        return int(self.keys[0].shape[1])

    def copy_blocks(self, copies: list[tuple[int, int]]) -> None:
        """Copy whole blocks' K/V, source to destination, in every layer (copy-on-write of forked sequences)."""
        if not copies:
            return
        sources = torch.tensor(
            [source for source, _ in copies], dtype=torch.int64, device=self.keys[0].device
        )
        targets = torch.tensor(
            [target for _, target in copies], dtype=torch.int64, device=self.keys[0].device
        )
        for cache in (*self.keys, *self.values):  # in place: the native decoder holds these tensors too
            cache.index_copy_(0, targets, cache.index_select(0, sources))

    def bytes_per_block(self) -> int:
        one = self.keys[0][0]
        return 2 * len(self.keys) * one.numel() * one.element_size()


def _lazily_resident_zeros(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """Zeros in anonymous memory that the OS maps only when first written: a KV pool sized for the
    worst case costs RSS only for the blocks in use (torch.zeros writes, and so maps, every page)."""
    nbytes = math.prod(shape) * torch.empty((), dtype=dtype).element_size()
    return torch.frombuffer(mmap.mmap(-1, nbytes), dtype=dtype).view(shape)  # the tensor keeps the map


@dataclass(frozen=True, slots=True)
class DecodeGroup:
    """Sequences adding one token each, attended in one padded batch."""

    rows: torch.Tensor  # (Bd,) their rows in the step's flat token axis
    key_slots: torch.Tensor  # (Bd, L) cache slots of their keys, L = longest context, padded with slot 0
    mask: torch.Tensor | None  # (Bd, 1, 1, L) True where a key is real; None when no row is padded
    covers_all_rows: bool  # the step is pure decode: rows are 0..T-1 in order, no scatter needed


@dataclass(frozen=True, slots=True)
class PrefillSequence:
    """One sequence adding several tokens: rows [start, end), reading `key_slots` (its whole context)."""

    start: int
    end: int
    key_slots: torch.Tensor  # (C,) cache slots of positions 0..C-1
    # (Q, C) causal mask shifted past the cached prefix; None means plain causal (Q == C, nothing cached).
    mask: torch.Tensor | None


@dataclass(frozen=True, slots=True)
class AttentionPlan:
    """Gather indices and masks for one step, computed once from the metadata and shared by all layers."""

    decode: DecodeGroup | None
    prefills: tuple[PrefillSequence, ...]

    @classmethod
    def from_metadata(cls, metadata: PagingMetadata) -> AttentionPlan:
        block_size = metadata.block_size
        starts = metadata.query_start_loc.tolist()  # host tensor on CPU: no sync cost worth avoiding
        decode_seqs = [b for b, n in enumerate(metadata.host_query_lens) if n == 1]
        prefills = []
        for b, query_len in enumerate(metadata.host_query_lens):
            if query_len == 1:
                continue
            context_len = metadata.host_context_lens[b]
            slots = _context_slots(metadata.block_tables[b : b + 1], context_len, block_size)[0]
            mask = None
            if query_len != context_len:
                positions = torch.arange(context_len - query_len, context_len)
                mask = torch.arange(context_len)[None, :] <= positions[:, None]  # (Q, C)
            prefills.append(PrefillSequence(starts[b], starts[b + 1], slots, mask))
        return cls(
            decode=_decode_group(metadata, decode_seqs, starts) if decode_seqs else None,
            prefills=tuple(prefills),
        )


def write_kv(
    key_cache: torch.Tensor,  # (num_blocks, block_size, Hkv, D)
    value_cache: torch.Tensor,
    key: torch.Tensor,  # (T, Hkv, D)
    value: torch.Tensor,
    slot_mapping: torch.Tensor,  # (T,)
) -> None:
    """Store the step's new K/V at their slots (in place)."""
    key_cache.view(-1, *key.shape[1:]).index_copy_(0, slot_mapping, key)
    value_cache.view(-1, *value.shape[1:]).index_copy_(0, slot_mapping, value)


def paged_attention(
    query: torch.Tensor,  # (T, H, D), already rotated
    key_cache: torch.Tensor,  # (num_blocks, block_size, Hkv, D), already holding this step's K/V
    value_cache: torch.Tensor,
    plan: AttentionPlan,
    scale: float,
) -> torch.Tensor:
    """Attention of every new token over its sequence's cached context. Returns (T, H, D)."""
    num_kv_heads, head_dim = key_cache.shape[2:]
    keys = key_cache.view(-1, num_kv_heads, head_dim)  # (slots, Hkv, D)
    values = value_cache.view(-1, num_kv_heads, head_dim)
    decode = plan.decode
    if decode is not None and decode.covers_all_rows:
        return _attend_decode(query, keys, values, decode, scale)
    output = torch.empty_like(query)
    if decode is not None:
        output[decode.rows] = _attend_decode(query[decode.rows], keys, values, decode, scale)
    for sequence in plan.prefills:
        q = query[sequence.start : sequence.end].transpose(0, 1).unsqueeze(0)  # (1, H, Q, D)
        k = keys.index_select(0, sequence.key_slots).transpose(0, 1).unsqueeze(0)  # (1, Hkv, C, D)
        v = values.index_select(0, sequence.key_slots).transpose(0, 1).unsqueeze(0)
        attended = F.scaled_dot_product_attention(
            q, k, v, attn_mask=sequence.mask, is_causal=sequence.mask is None, scale=scale, enable_gqa=True
        )  # (1, H, Q, D)
        output[sequence.start : sequence.end] = attended[0].transpose(0, 1)
    return output


def _attend_decode(
    query: torch.Tensor,  # (Bd, H, D)
    keys: torch.Tensor,  # (slots, Hkv, D)
    values: torch.Tensor,
    decode: DecodeGroup,
    scale: float,
) -> torch.Tensor:
    num_seqs, length = decode.key_slots.shape
    # index_select copies whole rows; advanced indexing is several times slower on CPU here.
    k = keys.index_select(0, decode.key_slots.view(-1)).view(num_seqs, length, *keys.shape[1:])
    v = values.index_select(0, decode.key_slots.view(-1)).view(num_seqs, length, *values.shape[1:])
    attended = F.scaled_dot_product_attention(
        query.unsqueeze(2),  # (Bd, H, 1, D)
        k.transpose(1, 2),  # (Bd, Hkv, L, D)
        v.transpose(1, 2),
        attn_mask=decode.mask,
        scale=scale,
        enable_gqa=True,
    )
    return attended.squeeze(2)  # (Bd, H, D)


def _decode_group(metadata: PagingMetadata, seqs: list[int], starts: list[int]) -> DecodeGroup:
    context_lens = [metadata.host_context_lens[b] for b in seqs]
    longest = max(context_lens)
    index = torch.tensor(seqs)
    key_slots = _context_slots(metadata.block_tables[index], longest, metadata.block_size)
    mask = None
    if min(context_lens) != longest:
        mask = torch.arange(longest)[None, :] < metadata.context_lens[index][:, None]  # (Bd, L)
        mask = mask[:, None, None, :]
    return DecodeGroup(
        rows=torch.tensor([starts[b] for b in seqs]),
        key_slots=key_slots,
        mask=mask,
        covers_all_rows=len(seqs) == metadata.num_tokens,
    )


def _context_slots(block_tables: torch.Tensor, length: int, block_size: int) -> torch.Tensor:
    """(B, max_blocks) block ids -> (B, length) slots of positions 0..length-1 (pad blocks give slot 0..)."""
    num_blocks = -(-length // block_size)
    offsets = torch.arange(block_size)
    slots = block_tables[:, :num_blocks, None] * block_size + offsets  # (B, num_blocks, block_size)
    return slots.flatten(1)[:, :length].contiguous()
