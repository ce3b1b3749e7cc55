"""Weight-only quantised linears on torch's CPU kernels: int4 group-wise and int8 per-channel.

Both keep `Linear`'s interface, (T, in) float32 -> (T, out) float32, and compute in bfloat16 activations:
torch 2.13's `_weight_int4pack_mm_for_cpu` and `_weight_int8pack_mm` are fast with bfloat16 inputs and
30-40x slower with float32 or float16 ones (measured, see docs/benchmarks.md). The residual stream, norms,
attention and the KV cache stay float32; only the matmul inputs are rounded to bfloat16.

- `Int4Linear`: 4-bit codes in groups of 32 along the input axis, value = (code - 8) * scale + zero, which
  is GGUF's Q4_1 (value = code * d + m) with scale = d and zero = m + 8d, so a Q4_1 tensor loads without
  requantising (its scales are rounded to bfloat16, which the kernel requires).
- `Int8Linear`: one symmetric scale per output row. It also serves rows as an embedding table, so a tied
  head is one int8 copy for both uses.

`dequantized()` returns the (out, in) float32 weight a module actually multiplies by: the reference that
parity tests load into transformers.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

GROUP_SIZE = 32
_INNER_K_TILES = 2  # ignored by the CPU kernel's layout; the op still takes it
_INT4_OFFSET = 8


@dataclass(frozen=True, slots=True)
class Int4Groups:
    """A (out, in) weight as 4-bit codes with one scale and zero per group of 32 inputs of a row."""

    codes: torch.Tensor  # (N, K) uint8 in 0..15
    scales: torch.Tensor  # (N, K / 32) float32
    zeros: torch.Tensor  # (N, K / 32) float32: value = (code - 8) * scale + zero

    @property
    def shape(self) -> tuple[int, int]:
        return int(self.codes.shape[0]), int(self.codes.shape[1])

    def rows(self, index: torch.Tensor) -> Int4Groups:
        return Int4Groups(self.codes[index], self.scales[index], self.zeros[index])

    def dense(self) -> torch.Tensor:
        """(N, K) float32 exactly as stored."""
        return self._values(self.scales, self.zeros)

    def dequantize(self) -> torch.Tensor:
        """(N, K) float32, with the scales and zeros rounded to bfloat16 as the kernel reads them."""
        return self._values(self.scales.bfloat16().float(), self.zeros.bfloat16().float())

    def _values(self, scales: torch.Tensor, zeros: torch.Tensor) -> torch.Tensor:
        n, k = self.shape
        grouped = self.codes.view(n, k // GROUP_SIZE, GROUP_SIZE).float() - _INT4_OFFSET
        return (grouped * scales[..., None] + zeros[..., None]).view(n, k)

    @classmethod
    def concat(cls, parts: list[Int4Groups]) -> Int4Groups:
        """Stack weights along the output axis (fused q/k/v or gate/up)."""
        return cls(
            torch.cat([p.codes for p in parts]),
            torch.cat([p.scales for p in parts]),
            torch.cat([p.zeros for p in parts]),
        )

    @classmethod
    def quantize(cls, weight: torch.Tensor) -> Int4Groups:
        """Round-to-nearest asymmetric 4-bit quantisation of a (N, K) weight, min/max per group of 32.

        A weight that was Q4_1 and dequantised comes back with its original codes.
        """
        n, k = weight.shape
        if k % GROUP_SIZE:
            raise ValueError(f"int4 needs an input width divisible by {GROUP_SIZE}, not {k}")
        groups = weight.float().view(n, k // GROUP_SIZE, GROUP_SIZE)
        low, high = groups.amin(-1), groups.amax(-1)
        scales = (high - low) / 15
        safe = torch.where(scales == 0, torch.ones_like(scales), scales)
        codes = ((groups - low[..., None]) / safe[..., None]).round().clamp(0, 15).to(torch.uint8)
        return cls(codes.view(n, k), scales, low + _INT4_OFFSET * scales)


@dataclass(frozen=True, slots=True)
class Int8Groups:
    """A (out, in) weight as int8 codes with one scale per group of 32 inputs of a row: GGUF's Q8_0."""

    codes: torch.Tensor  # (N, K) int8
    scales: torch.Tensor  # (N, K / 32) float32: value = code * scale

    @property
    def shape(self) -> tuple[int, int]:
        return int(self.codes.shape[0]), int(self.codes.shape[1])

    def rows(self, index: torch.Tensor) -> Int8Groups:
        return Int8Groups(self.codes[index], self.scales[index])

    def dense(self) -> torch.Tensor:
        """(N, K) float32 exactly as stored."""
        n, k = self.shape
        return (self.codes.view(n, k // GROUP_SIZE, GROUP_SIZE).float() * self.scales[..., None]).view(n, k)


class Int4Linear(nn.Module):
    """y = x @ W^T + bias with W as `Int4Groups`, packed for `_weight_int4pack_mm_for_cpu`."""

    def __init__(self, weight: Int4Groups, bias: torch.Tensor | None, decode_blocks: bool = True) -> None:
        super().__init__()
        out_features, in_features = weight.shape
        self.in_features, self.out_features = in_features, out_features
        packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(
            weight.codes.to(torch.int32), _INNER_K_TILES
        )
        self.register_buffer("packed", packed)
        # (K / 32, N, 2): scale and zero of each group, in the layout the kernel reads.
        scales_and_zeros = torch.stack((weight.scales.t(), weight.zeros.t()), dim=-1).bfloat16().contiguous()
        self.register_buffer("scales_and_zeros", scales_and_zeros)
        self.bias = None if bias is None else nn.Parameter(bias.float(), requires_grad=False)
        # The same codes, scales and zeros in the block layout of the fused decode step (engine/model/native/).
        self.blocks = q4_blocks(weight, scales_and_zeros) if decode_blocks else None
        self._reference = weight  # for dequantized(); dropped by `drop_reference` once loaded

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (T, in) -> (T, out)
        y = torch.ops.aten._weight_int4pack_mm_for_cpu(
            x.to(torch.bfloat16), self.packed, GROUP_SIZE, self.scales_and_zeros
        ).float()
        return y if self.bias is None else y + self.bias

    def dequantized(self) -> torch.Tensor:
        """(out, in) float32: what this module multiplies by."""
        if self._reference is None:
            raise RuntimeError("the codes were dropped after loading; keep_reference=True keeps them")
        return self._reference.dequantize()

    def drop_reference(self) -> None:
        self._reference = None  # type: ignore[assignment]


Q4_INTERLEAVE = 4
"""Output features whose groups `q4_blocks` stores side by side (the native kernel's read order)."""


def q4_blocks(weight: Int4Groups, scales_and_zeros: torch.Tensor) -> torch.Tensor:
    """(N / 4, K / 32 * 4 * 20) uint8: per group of 32, 16 bytes of codes (byte j: code j in the low nibble,
    code j + 16 in the high one, as GGUF packs Q4_1), then the bfloat16 scale and zero the int4 kernel
    reads; the groups of four consecutive output features side by side, group by group."""
    n, k = weight.shape
    groups = k // GROUP_SIZE
    codes = weight.codes.view(n, groups, GROUP_SIZE)
    packed = codes[..., : GROUP_SIZE // 2] | (codes[..., GROUP_SIZE // 2 :] << 4)  # (N, G, 16)
    scale_zero = scales_and_zeros.transpose(0, 1).contiguous().view(torch.uint8)  # (N, G, 4)
    blocks = torch.cat((packed, scale_zero), dim=-1)  # (N, G, 20)
    return (
        blocks.view(n // Q4_INTERLEAVE, Q4_INTERLEAVE, groups, -1)
        .transpose(1, 2)
        .reshape(n // Q4_INTERLEAVE, -1)
    )


class Int8Linear(nn.Module):
    """y = x @ W^T + bias with W int8, one scale per output row; also an embedding table of W's rows."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None) -> None:  # weight (out, in)
        super().__init__()
        weight = weight.float()
        self.out_features, self.in_features = weight.shape
        scales = weight.abs().amax(dim=1).clamp(min=1e-12) / 127
        self.register_buffer("codes", (weight / scales[:, None]).round().clamp(-127, 127).to(torch.int8))
        self.register_buffer("scales", scales.bfloat16())  # the kernel wants bfloat16 scales with bf16 inputs
        self.bias = None if bias is None else nn.Parameter(bias.float(), requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.ops.aten._weight_int8pack_mm(x.to(torch.bfloat16), self.codes, self.scales).float()
        return y if self.bias is None else y + self.bias

    def embed(self, token_ids: torch.Tensor) -> torch.Tensor:
        """(T,) row ids -> (T, in) float32 rows of W."""
        return self.codes[token_ids].float() * self.scales[token_ids].float()[:, None]

    def dequantized(self) -> torch.Tensor:
        return self.codes.float() * self.scales.float()[:, None]


class Int8GroupLinear(nn.Module):
    """A Q8_0 weight kept as stored (group-32 scales), multiplied as two 4-bit halves.

    With u = code + 128 = 16h + l (h, l in 0..15), code * d = (h - 8) * 16d + (l - 8) * d + 8d: two
    `Int4Linear`s over the same groups (scale 16d, zero 0; scale d, zero 8d). Scaling by a
    power of two is exact in bfloat16, so the weight multiplied by is bf16(d) * code. torch has no group-wise
    int8 kernel; for the 576 x 49,152 head this was also faster than its per-row int8 one (1.6 ms per half
    against 3.9 ms at batch 1 here). The int8 codes stay for `embed`: a tied head is the embedding table.
    """

    def __init__(self, weight: Int8Groups, bias: torch.Tensor | None) -> None:
        super().__init__()
        self.out_features, self.in_features = weight.shape
        shifted = (weight.codes.to(torch.int16) + 128).to(torch.uint8)
        scales = weight.scales
        self.high = Int4Linear(Int4Groups(shifted >> 4, 16 * scales, torch.zeros_like(scales)), None, False)
        self.low = Int4Linear(Int4Groups(shifted & 15, scales, 8 * scales), bias, False)
        for half in (self.high, self.low):
            half.drop_reference()  # `codes` below is the reference
        self.register_buffer("codes", weight.codes)
        self.register_buffer("scales", weight.scales.bfloat16())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.high(x) + self.low(x)

    def embed(self, token_ids: torch.Tensor) -> torch.Tensor:
        """(T,) row ids -> (T, in) float32 rows of the weight multiplied by."""
        return self.codes[token_ids].float() * self.scales[token_ids].float().repeat_interleave(
            GROUP_SIZE, dim=1
        )

    def dequantized(self) -> torch.Tensor:
        return self.codes.float() * self.scales.float().repeat_interleave(GROUP_SIZE, dim=1)
