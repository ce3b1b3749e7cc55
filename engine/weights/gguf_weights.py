"""A Llama GGUF's tensors as stored, under transformers' names: Q4_0 / Q4_1 kept as 4-bit codes, Q8_0 as
8-bit codes with their group scales, the rest float32.

The `gguf` package reads the file (memory-mapped); this module only decodes 4- and 8-bit blocks and undoes the one
layout change llama.cpp's converter makes, the rotary permutation of q and k rows, exactly as transformers'
GGUF loader does, so that the result equals the dequantised folder `engine.weights.loader` writes. Other quantised
types are dequantised with `gguf.quants` (the engine then quantises them to its own formats).
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import torch
from gguf import GGMLQuantizationType, GGUFReader, quants

from engine.model.quantized import Int4Groups, Int8Groups

_Q4_BLOCK = 32
_Q4_1_BYTES = 20  # fp16 d, fp16 m, 16 bytes of nibbles: value = code * d + m
_Q4_0_BYTES = 18  # fp16 d, 16 bytes of nibbles: value = (code - 8) * d
_Q8_0_BYTES = 34  # fp16 d, 32 int8 codes: value = code * d
_FOUR_BIT = (GGMLQuantizationType.Q4_0, GGMLQuantizationType.Q4_1)
_PROJECTIONS = ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down")

_LAYER_NAMES = {
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
_GLOBAL_NAMES = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}
_LAYER_PATTERN = re.compile(r"blk\.(\d+)\.(\w+)\.(weight|bias)")

GgufTensor = torch.Tensor | Int4Groups | Int8Groups


class UnsupportedGguf(ValueError):
    """A GGUF this reader does not map (another architecture): load its converted float folder instead."""


def read_gguf_weights(path: Path) -> dict[str, GgufTensor]:
    """Every tensor of a `llama`-architecture GGUF, named as in transformers' LlamaForCausalLM."""
    reader = GGUFReader(path)
    architecture = _field(reader, "general.architecture")
    if architecture != "llama":
        raise UnsupportedGguf(f"quantised loading reads llama GGUFs; {path.name} is {architecture!r}")
    num_heads = int(_field(reader, "llama.attention.head_count"))
    num_kv_heads = int(_field(reader, "llama.attention.head_count_kv") or num_heads)
    weights: dict[str, GgufTensor] = {}
    for tensor in reader.tensors:
        name = hf_name(tensor.name)
        rows, cols = (int(tensor.shape[1]), int(tensor.shape[0])) if len(tensor.shape) == 2 else (0, 0)
        value: GgufTensor
        if tensor.tensor_type in _FOUR_BIT:
            value = decode_q4(np.asarray(tensor.data), rows, cols, tensor.tensor_type)
        elif tensor.tensor_type == GGMLQuantizationType.Q8_0:
            value = decode_q8_0(np.asarray(tensor.data), rows, cols)
        else:
            array = np.asarray(tensor.data)
            if tensor.tensor_type not in (GGMLQuantizationType.F32, GGMLQuantizationType.F16):
                array = quants.dequantize(array, tensor.tensor_type)
            value = torch.from_numpy(np.array(array, dtype=np.float32))
            if rows:
                value = value.reshape(rows, cols)
        if ".q_proj." in name:
            value = _unpermute_rotary(value, num_heads)
        elif ".k_proj." in name:
            value = _unpermute_rotary(value, num_kv_heads)
        weights[name] = value
    return weights


def hf_name(gguf_name: str) -> str:
    match = _LAYER_PATTERN.fullmatch(gguf_name)
    if match:
        layer, part, kind = match.groups()
        if part not in _LAYER_NAMES:
            raise ValueError(f"unknown GGUF tensor {gguf_name!r}")
        return f"model.layers.{layer}.{_LAYER_NAMES[part]}.{kind}"
    stem, _, kind = gguf_name.rpartition(".")
    if stem not in _GLOBAL_NAMES:
        raise ValueError(f"unknown GGUF tensor {gguf_name!r}")
    return f"{_GLOBAL_NAMES[stem]}.{kind}"


def projection_storage(path: Path) -> str:
    """How a GGUF stores its layers' projections: `4-bit` (all Q4_0 / Q4_1 in a llama GGUF, which int4
    holds exactly), `quantized` (other GGML types: 8-bit, K-quants, ...) or `float` (F32 / F16 / BF16)."""
    reader = GGUFReader(path)
    types = {
        tensor.tensor_type
        for tensor in reader.tensors
        if tensor.name.startswith("blk.") and tensor.name.split(".")[2] in _PROJECTIONS
    }
    if types and types <= set(_FOUR_BIT):
        # Only a llama GGUF is read as stored; another goes through its float conversion, where the
        # 4-bit codes are not kept as such.
        return "4-bit" if _field(reader, "general.architecture") == "llama" else "quantized"
    floats = {GGMLQuantizationType.F32, GGMLQuantizationType.F16, GGMLQuantizationType.BF16}
    return "float" if types <= floats else "quantized"


def decode_q4(blocks: np.ndarray, rows: int, cols: int, kind: GGMLQuantizationType) -> Int4Groups:
    """Raw Q4_0 / Q4_1 bytes of a (rows, cols) weight -> codes, scales and zeros in torch's int4 form,
    value = (code - 8) * scale + zero: Q4_1 (code * d + m) is scale d, zero m + 8d; Q4_0 is scale d, zero 0."""
    if cols % _Q4_BLOCK:
        raise ValueError(f"4-bit GGUF rows must be whole blocks of {_Q4_BLOCK}, not {cols}")
    has_min = kind == GGMLQuantizationType.Q4_1
    raw = blocks.reshape(rows, cols // _Q4_BLOCK, _Q4_1_BYTES if has_min else _Q4_0_BYTES)
    d = raw[..., 0:2].copy().view(np.float16)[..., 0].astype(np.float32)
    header = 4 if has_min else 2
    nibbles = raw[..., header:]
    codes = np.concatenate((nibbles & 0x0F, nibbles >> 4), axis=-1)  # weight j: low of byte j, j+16: high
    scales = torch.from_numpy(d)
    if has_min:
        zeros = (
            torch.from_numpy(raw[..., 2:4].copy().view(np.float16)[..., 0].astype(np.float32)) + 8 * scales
        )
    else:
        zeros = torch.zeros_like(scales)
    return Int4Groups(torch.from_numpy(np.ascontiguousarray(codes).reshape(rows, cols)), scales, zeros)


def decode_q8_0(blocks: np.ndarray, rows: int, cols: int) -> Int8Groups:
    """Raw Q8_0 bytes (fp16 d, 32 int8 codes per block) of a (rows, cols) weight -> codes and scales."""
    if cols % _Q4_BLOCK:
        raise ValueError(f"Q8_0 rows must be whole blocks of {_Q4_BLOCK}, not {cols}")
    raw = blocks.reshape(rows, cols // _Q4_BLOCK, _Q8_0_BYTES)
    d = raw[..., 0:2].copy().view(np.float16)[..., 0].astype(np.float32)
    codes = np.ascontiguousarray(raw[..., 2:]).view(np.int8).reshape(rows, cols)
    return Int8Groups(torch.from_numpy(codes), torch.from_numpy(d))


def _unpermute_rotary(value: GgufTensor, heads: int) -> GgufTensor:
    """Undo llama.cpp's interleaving of each head's rotary halves (a permutation of output rows)."""
    rows = value.shape[0]
    order = torch.arange(rows).view(heads, rows // heads // 2, 2).transpose(1, 2).reshape(rows)
    if isinstance(value, Int4Groups | Int8Groups):
        return value.rows(order)
    return value[order]


def _field(reader: GGUFReader, key: str) -> object:
    field = reader.fields.get(key)
    return None if field is None else field.contents()
