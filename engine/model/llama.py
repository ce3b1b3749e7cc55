"""A Llama-family decoder (Llama, SmolLM2, Mistral, Qwen2) whose attention reads a paged KV cache.

Tokens of all sequences in a step are flattened into one axis of T rows; `PagingMetadata` says which
sequence and position each row is, and where its K/V lives. The math follows transformers' Llama exactly
(float32 RMSNorm, rotate-half RoPE, SwiGLU) so that logits agree with it; the layout differs in one way:
q/k/v and gate/up projections are fused into single matmuls (`load_hf_weights` concatenates them), which
reads the same weight bytes in fewer, larger calls.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
import torch.nn.functional as F
from torch import nn

from engine.model.attention import AttentionPlan, KVCache, paged_attention, write_kv
from engine.model.config import ModelConfig, RopeConfig
from engine.model.paging import PagingMetadata


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Root-mean-square norm over the last axis, normalised in float32 then scaled, as transformers does."""
    if x.dtype != torch.float32:
        return weight * rms_norm(x.float(), torch.ones_like(weight, dtype=torch.float32), eps).to(x.dtype)
    return weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))


def rope_inverse_frequencies(head_dim: int, rope: RopeConfig) -> torch.Tensor:
    """(D/2,) float32 rotation speeds, with linear or llama3 scaling applied."""
    exponents = torch.arange(0, head_dim, 2, dtype=torch.int64, device="cpu").float() / head_dim
    inv_freq = 1.0 / (rope.theta**exponents)
    if rope.rope_type == "linear":
        return inv_freq / rope.factor
    if rope.rope_type == "llama3":
        assert rope.original_max_position_embeddings is not None
        # Long wavelengths are slowed by `factor`, short ones kept, the band between interpolated smoothly.
        old_context = rope.original_max_position_embeddings
        wavelength = 2 * torch.pi / inv_freq
        scaled = torch.where(
            wavelength > old_context / rope.low_freq_factor, inv_freq / rope.factor, inv_freq
        )
        smooth = (old_context / wavelength - rope.low_freq_factor) / (
            rope.high_freq_factor - rope.low_freq_factor
        )
        smoothed = (1 - smooth) * scaled / rope.factor + smooth * scaled
        is_medium = (wavelength >= old_context / rope.high_freq_factor) & (
            wavelength <= old_context / rope.low_freq_factor
        )
        return torch.where(is_medium, smoothed, scaled)
    return inv_freq


def rope_cos_sin(positions: torch.Tensor, inv_freq: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(T,) positions -> cos and signed sin, each (T, 1, D), broadcasting over heads.

    The sin's first half is negated so that `apply_rope` can rotate with one roll instead of
    rotate_half's slice, negate and concatenate; (-x) * s and -(x * s) are the same float.
    """
    angles = positions[:, None].float() * inv_freq  # (T, D/2)
    cos, sin = angles.cos(), angles.sin()
    return torch.cat((cos, cos), dim=-1)[:, None, :], torch.cat((-sin, sin), dim=-1)[:, None, :]


def apply_rope(x: torch.Tensor, cos: torch.Tensor, signed_sin: torch.Tensor) -> torch.Tensor:
    """Rotate (T, heads, D) by position, pairing dimension i with i + D/2 (transformers' convention)."""
    swapped_halves = x.roll(x.shape[-1] // 2, dims=-1)  # (x2, x1): rotate_half(x) is (-x2, x1)
    return x * cos.to(x.dtype) + swapped_halves * signed_sin.to(x.dtype)


class Linear(nn.Module):
    """y = x @ weight + bias, with `weight` stored (in_features, out_features): the transpose of nn.Linear.

    Decode multiplies one row per sequence by every weight, so it is bound by streaming weight bytes; on
    this CPU, MKL streams this layout about 1.5-2x faster than nn.Linear's for one-row inputs (measured with
    1 and 2 threads, see bench/engine/bench_engine_model.py), and prefill-sized inputs run at about the same speed.
    """

    def __init__(self, in_features: int, out_features: int, bias: bool) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(in_features, out_features))
        self.bias = nn.Parameter(torch.empty(out_features)) if bias else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (T, in) -> (T, out)
        if self.bias is None:
            return torch.mm(x, self.weight)
        return torch.addmm(self.bias, x, self.weight)

    def embed(self, token_ids: torch.Tensor) -> torch.Tensor:
        """(T,) ids -> (T, in) float32 columns of the weight: a tied head read as the embedding table."""
        return F.embedding(token_ids, self.weight.t()).float()

    def dequantized(self) -> torch.Tensor:
        """(out, in) float32: the weight as nn.Linear stores it."""
        return self.weight.t().float()


class Bf16Linear(Linear):
    """`Linear` with bfloat16 weights: inputs rounded to bfloat16 for the matmul, output float32."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.mm(x.to(torch.bfloat16), self.weight).float()
        return y if self.bias is None else y + self.bias


Projection = nn.Module
"""What a layer multiplies by: `Linear`, `Bf16Linear`, or one of `engine.model.quantized`'s linears.
Each maps (T, in) float32 to (T, out) float32 and has `dequantized()`; the head also has `embed()`."""


class Attention(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.num_heads = config.num_heads
        self.num_kv_heads = config.num_kv_heads
        self.head_dim = config.head_dim
        self.scale = config.head_dim**-0.5
        qkv_width = (config.num_heads + 2 * config.num_kv_heads) * config.head_dim
        self.qkv_proj: Projection = Linear(config.hidden_size, qkv_width, bias=config.qkv_bias)
        self.o_proj: Projection = Linear(
            config.num_heads * config.head_dim, config.hidden_size, bias=config.output_bias
        )

    def forward(
        self,
        x: torch.Tensor,  # (T, hidden)
        cos: torch.Tensor,  # (T, 1, D)
        sin: torch.Tensor,
        key_cache: torch.Tensor,  # (num_blocks, block_size, Hkv, D)
        value_cache: torch.Tensor,
        metadata: PagingMetadata,
        plan: AttentionPlan,
    ) -> torch.Tensor:
        num_tokens, head_dim = x.shape[0], self.head_dim
        qkv = self.qkv_proj(x)  # (T, (H + 2 Hkv) * D): queries, then keys, then values
        # Queries and keys are adjacent in the fused output: one rotation covers both.
        query_key = apply_rope(
            qkv[:, : -self.num_kv_heads * head_dim].view(num_tokens, -1, head_dim), cos, sin
        )
        query, key = query_key.split([self.num_heads, self.num_kv_heads], dim=1)  # (T, H, D), (T, Hkv, D)
        value = qkv[:, -self.num_kv_heads * head_dim :].view(num_tokens, self.num_kv_heads, head_dim)
        write_kv(key_cache, value_cache, key, value, metadata.slot_mapping)
        attended = paged_attention(query, key_cache, value_cache, plan, self.scale)  # (T, H, D)
        return self.o_proj(attended.reshape(num_tokens, self.num_heads * head_dim))


class FeedForward(nn.Module):
    """SwiGLU: down(silu(gate(x)) * up(x)), with gate and up in one matmul."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.intermediate_size = config.intermediate_size
        self.gate_up_proj: Projection = Linear(
            config.hidden_size, 2 * config.intermediate_size, bias=config.mlp_bias
        )
        self.down_proj: Projection = Linear(
            config.intermediate_size, config.hidden_size, bias=config.mlp_bias
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up_proj(x).split(self.intermediate_size, dim=-1)  # (T, I) each
        return self.down_proj(F.silu(gate) * up)


class DecoderLayer(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.eps = config.rms_norm_eps
        self.attention_norm = nn.Parameter(torch.ones(config.hidden_size))
        self.attention = Attention(config)
        self.feed_forward_norm = nn.Parameter(torch.ones(config.hidden_size))
        self.feed_forward = FeedForward(config)

    def forward(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        key_cache: torch.Tensor,
        value_cache: torch.Tensor,
        metadata: PagingMetadata,
        plan: AttentionPlan,
    ) -> torch.Tensor:
        normed = rms_norm(x, self.attention_norm, self.eps)
        x = x + self.attention(normed, cos, sin, key_cache, value_cache, metadata, plan)
        return x + self.feed_forward(rms_norm(x, self.feed_forward_norm, self.eps))


class LlamaModel(nn.Module):
    """Embedding, decoder layers, final norm and LM head. Call it with token ids, metadata and a cache."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.config = config
        # Tied embeddings are read as rows of the head's transposed weight: one copy, not two.
        if not config.tie_word_embeddings:
            self.embed_tokens = nn.Parameter(torch.empty(config.vocab_size, config.hidden_size))
        self.layers = nn.ModuleList(DecoderLayer(config) for _ in range(config.num_layers))
        self.norm = nn.Parameter(torch.ones(config.hidden_size))
        self.lm_head: Projection = Linear(config.hidden_size, config.vocab_size, bias=False)
        self.weights_format = "fp32"
        """How the projections are stored: fp32, bf16, int8 or int4 (`engine.weights.formats`)."""
        # A plain attribute, not a buffer: `.to(dtype)` must not round rotation speeds to low precision.
        self.inv_freq = rope_inverse_frequencies(config.head_dim, config.rope)

    def forward(self, input_ids: torch.Tensor, metadata: PagingMetadata, kv_cache: KVCache) -> torch.Tensor:
        """(T,) new token ids -> (R, vocab) float32 logits for the rows in `metadata.logits_indices`."""
        plan = AttentionPlan.from_metadata(metadata)
        cos, sin = rope_cos_sin(metadata.positions, self.inv_freq)
        x = self.embed(input_ids)  # (T, hidden)
        for layer, key_cache, value_cache in zip(self.layers, kv_cache.keys, kv_cache.values, strict=True):
            x = layer(x, cos, sin, key_cache, value_cache, metadata, plan)
        x = x[metadata.logits_indices]  # (R, hidden): the norm and head only run where logits are wanted
        return self.lm_head(rms_norm(x, self.norm, self.config.rms_norm_eps)).float()

    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        """(T,) token ids -> (T, hidden) embeddings (rows of the head's weight when tied: one copy)."""
        if self.config.tie_word_embeddings:
            return self.lm_head.embed(input_ids).to(self.norm.dtype)  # type: ignore[operator]
        return F.embedding(input_ids, self.embed_tokens)

    @classmethod
    def from_hf_weights(
        cls,
        config: ModelConfig,
        state_dict: Mapping[str, torch.Tensor],
        dtype: torch.dtype = torch.float32,
        device: torch.device | str = "cpu",
    ) -> LlamaModel:
        """Build the model from weights named as in transformers' LlamaForCausalLM (q/k/v, gate/up fused)."""
        with torch.device("meta"):  # no memory, no random initialisation of weights about to be replaced
            model = cls(config)
        model.load_state_dict(_from_hf_names(state_dict, config), strict=True, assign=True)
        model = model.to(device=device, dtype=dtype)
        model.inv_freq = model.inv_freq.to(device)
        return model.eval()


def _from_hf_names(state_dict: Mapping[str, torch.Tensor], config: ModelConfig) -> dict[str, torch.Tensor]:
    """transformers parameter names and layouts -> ours: projections fused and stored (in, out)."""

    def projection(hf_names: list[str], suffix: str) -> torch.Tensor:
        fused = torch.cat([state_dict[name + "." + suffix] for name in hf_names])  # (out, in) stacked on out
        return fused.t().contiguous() if suffix == "weight" else fused

    # Copies, not views: the source may be a memory-mapped file, which a view would keep mapped (and resident).
    weights = {"norm": state_dict["model.norm.weight"].clone()}
    head = "model.embed_tokens" if config.tie_word_embeddings else "lm_head"
    weights["lm_head.weight"] = projection([head], "weight")
    if not config.tie_word_embeddings:
        weights["embed_tokens"] = state_dict["model.embed_tokens.weight"].clone()
    for i in range(config.num_layers):
        hf, ours = f"model.layers.{i}.", f"layers.{i}."
        weights[ours + "attention_norm"] = state_dict[hf + "input_layernorm.weight"].clone()
        weights[ours + "feed_forward_norm"] = state_dict[hf + "post_attention_layernorm.weight"].clone()
        fused_names = {
            "attention.qkv_proj": ([hf + f"self_attn.{name}_proj" for name in "qkv"], config.qkv_bias),
            "attention.o_proj": ([hf + "self_attn.o_proj"], config.output_bias),
            "feed_forward.gate_up_proj": ([hf + "mlp.gate_proj", hf + "mlp.up_proj"], config.mlp_bias),
            "feed_forward.down_proj": ([hf + "mlp.down_proj"], config.mlp_bias),
        }
        for name, (hf_names, has_bias) in fused_names.items():
            for suffix in ("weight", "bias") if has_bias else ("weight",):
                weights[f"{ours}{name}.{suffix}"] = projection(hf_names, suffix)
    return weights
