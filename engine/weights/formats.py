"""How the engine stores its projection weights (fp32, bf16, int8, int4), and the model built that way.

`build_model` takes weights named as in transformers' LlamaForCausalLM, each a float tensor or, where the
source stored it so (a GGUF's Q4_1 tensors), `Int4Groups`, and fuses q/k/v and gate/up as `LlamaModel`
does. Per format:

- fp32: today's `Linear` (the parity reference).
- bf16: `Bf16Linear`, half the bytes.
- int8: `Int8Linear` per output row, head included.
- int4: `Int4Linear` in groups of 32; a Q4_0 / Q4_1 tensor keeps its codes, another is quantised (min/max
  per group, which is how Q4_1 is made). The head (the tied embedding table) is 8-bit: it is read as
  embedding rows too, and it is the most sensitive matrix.

In int8 and int4, a Q8_0 head keeps its codes and group scales (`Int8GroupLinear`); any other head is int8
with one scale per row.

Norms, biases and an untied embedding table stay float32, as do activations outside the matmuls.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Literal, get_args

import torch
from torch import nn

from engine.model.config import ModelConfig
from engine.model.llama import Bf16Linear, Linear, LlamaModel, Projection
from engine.model.quantized import Int4Groups, Int4Linear, Int8GroupLinear, Int8Groups, Int8Linear

WeightsFormat = Literal["fp32", "bf16", "int8", "int4"]
WEIGHTS_FORMATS: tuple[WeightsFormat, ...] = get_args(WeightsFormat)

SourceWeight = torch.Tensor | Int4Groups | Int8Groups

_FUSED = {
    "attention.qkv_proj": (["self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"], "qkv_bias"),
    "attention.o_proj": (["self_attn.o_proj"], "output_bias"),
    "feed_forward.gate_up_proj": (["mlp.gate_proj", "mlp.up_proj"], "mlp_bias"),
    "feed_forward.down_proj": (["mlp.down_proj"], "mlp_bias"),
}


def build_model(
    config: ModelConfig,
    weights: Mapping[str, SourceWeight],
    weights_format: WeightsFormat,
    keep_reference: bool = False,
) -> LlamaModel:
    """A `LlamaModel` whose projections are stored in `weights_format` (see the module docstring).

    `keep_reference` keeps each int4 projection's unpacked codes (twice the packed bytes) so that
    `dequantized_hf_state` can read them back; serving drops them.
    """
    if weights_format not in WEIGHTS_FORMATS:
        raise ValueError(f"weights format {weights_format!r} is not one of {WEIGHTS_FORMATS}")
    with torch.device("meta"):
        model = LlamaModel(config)
    plain = {"norm": _dense(weights["model.norm.weight"])}
    if not config.tie_word_embeddings:
        plain["embed_tokens"] = _dense(weights["model.embed_tokens.weight"])
    for i, layer in enumerate(model.layers):
        hf = f"model.layers.{i}."
        plain[f"layers.{i}.attention_norm"] = _dense(weights[hf + "input_layernorm.weight"])
        plain[f"layers.{i}.feed_forward_norm"] = _dense(weights[hf + "post_attention_layernorm.weight"])
        for ours, (hf_names, bias_flag) in _FUSED.items():
            parts = [weights[hf + name + ".weight"] for name in hf_names]
            bias = None
            if getattr(config, bias_flag):
                bias = torch.cat([_dense(weights[hf + name + ".bias"]) for name in hf_names])
            owner_name, attribute = ours.split(".")
            projection = make_projection(parts, bias, weights_format)
            if isinstance(projection, Int4Linear) and not keep_reference:
                projection.drop_reference()
            setattr(getattr(layer, owner_name), attribute, projection)
    head = "model.embed_tokens.weight" if config.tie_word_embeddings else "lm_head.weight"
    head_weight = weights[head]
    if (
        isinstance(head_weight, Int8Groups)
        and weights_format in ("int8", "int4")
        and _packs_as_int4(head_weight)
    ):
        model.lm_head = Int8GroupLinear(head_weight, None)  # a Q8_0 head exactly as stored
    else:
        head_format: WeightsFormat = "int8" if weights_format == "int4" else weights_format
        model.lm_head = make_projection([head_weight], None, head_format)
    model.load_state_dict(plain, strict=False, assign=True)
    left_on_meta = [name for name, t in [*model.named_parameters(), *model.named_buffers()] if t.is_meta]
    if left_on_meta:
        raise ValueError(f"weights missing for {left_on_meta[:5]}")
    model.weights_format = weights_format
    return model.eval()


def dequantized_hf_state(model: LlamaModel) -> dict[str, torch.Tensor]:
    """The float32 weights `model` multiplies by, under transformers' names: the reference for parity."""
    config = model.config
    state = {"model.norm.weight": model.norm.detach().float()}
    head = _dequantized(model.lm_head)
    state["model.embed_tokens.weight"] = head if config.tie_word_embeddings else model.embed_tokens.detach()
    if not config.tie_word_embeddings:
        state["lm_head.weight"] = head
    for i, layer in enumerate(model.layers):
        hf = f"model.layers.{i}."
        state[hf + "input_layernorm.weight"] = layer.attention_norm.detach().float()
        state[hf + "post_attention_layernorm.weight"] = layer.feed_forward_norm.detach().float()
        for ours, (hf_names, _) in _FUSED.items():
            owner_name, attribute = ours.split(".")
            projection = getattr(getattr(layer, owner_name), attribute)
            widths = _output_widths(config, hf_names)
            for name, weight in zip(hf_names, _dequantized(projection).split(widths), strict=True):
                state[hf + name + ".weight"] = weight.contiguous()
            if projection.bias is not None:
                for name, bias in zip(hf_names, projection.bias.detach().float().split(widths), strict=True):
                    state[hf + name + ".bias"] = bias.contiguous()
    return state


def make_projection(
    parts: list[SourceWeight], bias: torch.Tensor | None, weights_format: WeightsFormat
) -> Projection:
    """One projection from its (out, in) parts stacked on the output axis, in `weights_format`."""
    if weights_format == "int4":
        groups = [
            part if isinstance(part, Int4Groups) else Int4Groups.quantize(_dense(part)) for part in parts
        ]
        fused = Int4Groups.concat(groups)
        if _packs_as_int4(fused):
            return Int4Linear(fused, bias)
        weights_format = "int8"  # torch's int4 layout needs a multiple of 16 outputs
    weight = torch.cat([_dense(part) for part in parts])  # (out, in)
    if weights_format == "int8":
        return Int8Linear(weight, bias)
    linear_type = Bf16Linear if weights_format == "bf16" else Linear
    dtype = torch.bfloat16 if weights_format == "bf16" else torch.float32
    with torch.device("meta"):
        linear = linear_type(weight.shape[1], weight.shape[0], bias=bias is not None)
    linear.weight = nn.Parameter(weight.t().contiguous().to(dtype), requires_grad=False)
    linear.bias = None if bias is None else nn.Parameter(bias.float(), requires_grad=False)
    return linear


def _packs_as_int4(weight: Int4Groups | Int8Groups) -> bool:
    """torch's int4 CPU layout takes a multiple of 16 output rows and of 32 inputs."""
    out_features, in_features = weight.shape
    return out_features % 16 == 0 and in_features % 32 == 0


def _dense(weight: SourceWeight) -> torch.Tensor:
    """Float32 values exactly as the source stores them (Q4_1: code * d + m with d and m as stored)."""
    if isinstance(weight, Int4Groups | Int8Groups):
        return weight.dense()
    return weight.float()


def _dequantized(projection: nn.Module) -> torch.Tensor:
    return projection.dequantized().detach().float()  # type: ignore[operator]


def _output_widths(config: ModelConfig, hf_names: list[str]) -> list[int]:
    widths = {
        "self_attn.q_proj": config.num_heads * config.head_dim,
        "self_attn.k_proj": config.num_kv_heads * config.head_dim,
        "self_attn.v_proj": config.num_kv_heads * config.head_dim,
        "self_attn.o_proj": config.hidden_size,
        "mlp.gate_proj": config.intermediate_size,
        "mlp.up_proj": config.intermediate_size,
        "mlp.down_proj": config.hidden_size,
    }
    return [widths[name] for name in hf_names]
