"""ModelConfig reads what it needs from transformers configs, and refuses what it cannot run."""

from __future__ import annotations

import pytest
from transformers import LlamaConfig, Qwen2Config

from engine.model.config import ModelConfig

SMOLLM2_135M = {  # as found in the converted SmolLM2-135M-Instruct config.json (transformers 5)
    "model_type": "llama",
    "vocab_size": 49152,
    "hidden_size": 576,
    "intermediate_size": 1536,
    "num_hidden_layers": 30,
    "num_attention_heads": 9,
    "num_key_value_heads": 3,
    "head_dim": 64,
    "rms_norm_eps": 1e-05,
    "max_position_embeddings": 8192,
    "tie_word_embeddings": True,
    "rope_parameters": {"rope_theta": 100000.0, "rope_type": "default"},
    "bos_token_id": 1,
    "eos_token_id": 2,
    "hidden_act": "silu",
}


def test_reads_a_transformers_5_config_dict() -> None:
    config = ModelConfig.from_hf(SMOLLM2_135M, generation_eos=[2, 7])
    assert (config.num_layers, config.num_heads, config.num_kv_heads, config.head_dim) == (30, 9, 3, 64)
    assert config.num_queries_per_kv == 3
    assert config.rope.theta == 100000.0 and config.rope.rope_type == "default"
    assert config.tie_word_embeddings
    assert config.eos_token_ids == (2, 7)
    assert config.bos_token_id == 1


def test_reads_legacy_rope_fields_and_derives_head_dim() -> None:
    legacy = {k: v for k, v in SMOLLM2_135M.items() if k not in ("rope_parameters", "head_dim")}
    legacy |= {"rope_theta": 500000.0, "rope_scaling": {"type": "linear", "factor": 2.0}}
    config = ModelConfig.from_hf(legacy)
    assert config.head_dim == 576 // 9
    assert (config.rope.theta, config.rope.rope_type, config.rope.factor) == (500000.0, "linear", 2.0)


def test_reads_config_objects_and_their_bias_conventions() -> None:
    llama = ModelConfig.from_hf(LlamaConfig(hidden_size=64, num_attention_heads=4, attention_bias=True))
    assert llama.qkv_bias and llama.output_bias
    qwen = ModelConfig.from_hf(Qwen2Config(hidden_size=64, num_attention_heads=4, num_key_value_heads=2))
    assert qwen.qkv_bias and not qwen.output_bias
    assert qwen.num_kv_heads == 2


@pytest.mark.parametrize(
    "change",
    [
        {"model_type": "gpt2"},
        {"hidden_act": "gelu"},
        {"rope_parameters": {"rope_type": "yarn", "rope_theta": 1e4, "factor": 4.0}},
        {"num_key_value_heads": 4},  # 9 query heads do not group over 4
    ],
)
def test_refuses_what_the_forward_pass_does_not_implement(change: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        ModelConfig.from_hf(SMOLLM2_135M | change)
