"""The shape of a Llama-family model, read from a Hugging Face config.

This module knows which config fields matter to our forward pass and how transformers names them
(including `rope_parameters` in transformers 5 and `rope_theta` / `rope_scaling` before it). It does not
know where the config came from (GGUF, folder, hub): that is the loader's business.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

# Model types whose forward pass is ours: same blocks, different bias and naming conventions.
SUPPORTED_MODEL_TYPES = ("llama", "mistral", "qwen2")

# The rope variants `engine.model.llama.rope_frequencies` implements. Others (dynamic NTK, YaRN, LongRoPE)
# change with the sequence length or rescale attention, and are refused rather than silently approximated.
SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3")


@dataclass(frozen=True, slots=True)
class RopeConfig:
    """Rotary embedding parameters: the base `theta` and an optional frequency scaling rule."""

    theta: float
    rope_type: str = "default"
    factor: float = 1.0
    # llama3 only: the band of wavelengths that is smoothly interpolated between scaled and unscaled.
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position_embeddings: int | None = None

    def __post_init__(self) -> None:
        if self.rope_type not in SUPPORTED_ROPE_TYPES:
            raise ValueError(f"rope type {self.rope_type!r} is not supported (have {SUPPORTED_ROPE_TYPES})")
        if self.theta <= 0 or self.factor <= 0:
            raise ValueError("rope theta and factor must be positive")
        if self.rope_type == "llama3" and self.original_max_position_embeddings is None:
            raise ValueError("llama3 rope scaling needs original_max_position_embeddings")


@dataclass(frozen=True, slots=True)
class ModelConfig:
    """Everything the forward pass needs to know about a model's architecture."""

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope: RopeConfig
    max_position_embeddings: int
    tie_word_embeddings: bool
    qkv_bias: bool = False
    output_bias: bool = False  # attention o_proj bias (Llama's `attention_bias` covers q, k, v and o)
    mlp_bias: bool = False
    eos_token_ids: tuple[int, ...] = field(default=())
    bos_token_id: int | None = None

    def __post_init__(self) -> None:
        if min(self.vocab_size, self.hidden_size, self.num_layers, self.num_heads, self.num_kv_heads) <= 0:
            raise ValueError("model dimensions must be positive")
        if self.num_heads % self.num_kv_heads != 0:
            raise ValueError(
                f"{self.num_heads} query heads do not group evenly over {self.num_kv_heads} kv heads"
            )

    @property
    def num_queries_per_kv(self) -> int:
        return self.num_heads // self.num_kv_heads

    @classmethod
    def from_hf(cls, hf_config: Any, generation_eos: int | list[int] | None = None) -> ModelConfig:
        """Read a transformers config object (LlamaConfig, Qwen2Config, ...) or its `to_dict()`."""
        values: Mapping[str, Any] = hf_config if isinstance(hf_config, Mapping) else hf_config.to_dict()
        model_type = values.get("model_type", "llama")
        if model_type not in SUPPORTED_MODEL_TYPES:
            raise ValueError(f"model type {model_type!r} is not supported (have {SUPPORTED_MODEL_TYPES})")
        if values.get("hidden_act", "silu") != "silu":
            raise ValueError(f"activation {values['hidden_act']!r} is not supported (SwiGLU needs silu)")
        num_heads = values["num_attention_heads"]
        head_dim = values.get("head_dim") or values["hidden_size"] // num_heads
        attention_bias = bool(values.get("attention_bias", False))
        qkv_bias = model_type == "qwen2" or attention_bias  # Qwen2 always biases q, k, v and never o
        return cls(
            vocab_size=values["vocab_size"],
            hidden_size=values["hidden_size"],
            intermediate_size=values["intermediate_size"],
            num_layers=values["num_hidden_layers"],
            num_heads=num_heads,
            num_kv_heads=values.get("num_key_value_heads") or num_heads,
            head_dim=head_dim,
            rms_norm_eps=values["rms_norm_eps"],
            rope=_read_rope(values),
            max_position_embeddings=values["max_position_embeddings"],
            tie_word_embeddings=bool(values.get("tie_word_embeddings", False)),
            qkv_bias=qkv_bias,
            output_bias=attention_bias and model_type != "qwen2",
            mlp_bias=bool(values.get("mlp_bias", False)),
            eos_token_ids=_token_ids(values.get("eos_token_id"), generation_eos),
            bos_token_id=values.get("bos_token_id"),
        )


def _read_rope(values: Mapping[str, Any]) -> RopeConfig:
    # transformers 5 keeps theta and scaling together in `rope_parameters`; older configs split them.
    parameters = dict(values.get("rope_parameters") or values.get("rope_scaling") or {})
    theta = parameters.get("rope_theta", values.get("rope_theta", 10000.0))
    rope_type = parameters.get("rope_type", parameters.get("type", "default"))
    return RopeConfig(
        theta=float(theta),
        rope_type=rope_type,
        factor=float(parameters.get("factor", 1.0)),
        low_freq_factor=float(parameters.get("low_freq_factor", 1.0)),
        high_freq_factor=float(parameters.get("high_freq_factor", 4.0)),
        original_max_position_embeddings=parameters.get("original_max_position_embeddings"),
    )


def _token_ids(*sources: int | list[int] | None) -> tuple[int, ...]:
    ids: list[int] = []
    for source in sources:
        for token_id in [source] if isinstance(source, int) else source or []:
            if token_id not in ids:
                ids.append(token_id)
    return tuple(ids)
