"""Our paged forward computes the same function as transformers' LlamaForCausalLM (float32, 1e-4)."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from engine.model.paging import LogitsFor, SequenceChunk
from engine.runner import ModelRunner
from tests.engine.llama_testing import TINY_LLAMA, hf_logits, make_engine_model, make_hf_llama

TOLERANCE = 1e-4

CONFIGS: dict[str, dict[str, Any]] = {
    "gqa": {},
    "mha-tied": dict(num_key_value_heads=6, tie_word_embeddings=True),
    "mqa-bias": dict(num_key_value_heads=1, attention_bias=True, mlp_bias=True),
    "head-dim-16": dict(head_dim=16, num_hidden_layers=3),
    "rope-linear": dict(rope_parameters={"rope_type": "linear", "rope_theta": 500.0, "factor": 4.0}),
    "rope-llama3": dict(
        rope_parameters={
            "rope_type": "llama3",
            "rope_theta": 10000.0,
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 32,
        }
    ),
}


def prompt(length: int, seed: int = 1) -> list[int]:
    return torch.randint(0, 97, (length,), generator=torch.Generator().manual_seed(seed)).tolist()


@pytest.mark.parametrize("overrides", CONFIGS.values(), ids=CONFIGS.keys())
@pytest.mark.parametrize("block_size", [1, 3, 5, 16])
def test_every_position_matches_transformers_in_one_prefill(
    overrides: dict[str, Any], block_size: int
) -> None:
    hf = make_hf_llama(**overrides)
    runner = ModelRunner(make_engine_model(hf), num_blocks=64, block_size=block_size)
    tokens = prompt(41)
    blocks = list(range(63, 63 - -(-41 // block_size), -1))  # reversed ids: table order must matter
    logits = runner.execute([SequenceChunk(tokens, 0, blocks, LogitsFor.ALL)])
    torch.testing.assert_close(logits, hf_logits(hf, tokens), atol=TOLERANCE, rtol=0)


@pytest.mark.parametrize(
    "chunk_sizes", [[7, 20, 14], [1] * 41, [12, 1, 1, 27]], ids=["chunks", "decode", "mixed"]
)
@pytest.mark.parametrize("block_size", [3, 5])
def test_every_position_matches_when_prefilled_in_chunks(chunk_sizes: list[int], block_size: int) -> None:
    hf = make_hf_llama()
    runner = ModelRunner(make_engine_model(hf), num_blocks=64, block_size=block_size)
    tokens = prompt(41)
    blocks = [11, 2, 40, 7, 30, 19, 3, 25, 50, 8, 1, 60, 33, 4]
    pieces, done = [], 0
    for size in chunk_sizes:
        chunk = SequenceChunk(tokens[done : done + size], done, blocks, LogitsFor.ALL)
        pieces.append(runner.execute([chunk]))
        done += size
    torch.testing.assert_close(torch.cat(pieces), hf_logits(hf, tokens), atol=TOLERANCE, rtol=0)


def test_a_mixed_batch_of_prefill_chunks_and_decodes_matches_each_alone() -> None:
    hf = make_hf_llama(num_key_value_heads=3)
    runner = ModelRunner(make_engine_model(hf), num_blocks=64, block_size=4)
    first, second, third, fourth = prompt(13, 1), prompt(30, 2), prompt(6, 3), prompt(9, 4)
    # Warm-up step puts some of each sequence in the cache; then one step mixes every kind of row.
    tables = {
        "first": [0, 1, 2, 3],
        "second": [10, 11, 12, 13, 14, 15, 16, 17],
        "third": [20, 21],
        "fourth": [30, 31, 32],
    }
    runner.execute(
        [
            SequenceChunk(first[:12], 0, tables["first"], LogitsFor.NONE),
            SequenceChunk(second[:17], 0, tables["second"], LogitsFor.NONE),
            SequenceChunk(third[:5], 0, tables["third"], LogitsFor.NONE),
        ]
    )
    logits = runner.execute(
        [
            SequenceChunk(first[12:], 12, tables["first"], LogitsFor.ALL),  # decode
            SequenceChunk(second[17:], 17, tables["second"], LogitsFor.ALL),  # prefill chunk after a prefix
            SequenceChunk(third[5:], 5, tables["third"], LogitsFor.ALL),  # decode, shorter context
            SequenceChunk(fourth, 0, tables["fourth"], LogitsFor.ALL),  # fresh prefill
        ]
    )
    expected = torch.cat(
        [
            hf_logits(hf, first)[12:],
            hf_logits(hf, second)[17:],
            hf_logits(hf, third)[5:],
            hf_logits(hf, fourth),
        ]
    )
    torch.testing.assert_close(logits, expected, atol=TOLERANCE, rtol=0)


def test_decode_batch_of_different_lengths_matches_transformers() -> None:
    hf = make_hf_llama()
    runner = ModelRunner(make_engine_model(hf), num_blocks=64, block_size=5)
    prompts = [prompt(n, seed=n) for n in (3, 17, 9, 26)]
    tables = [[0], [1, 2, 3, 4], [5, 6], [7, 8, 9, 10, 11, 12]]
    runner.execute(
        [SequenceChunk(p[:-1], 0, t, LogitsFor.NONE) for p, t in zip(prompts, tables, strict=True)]
    )
    logits = runner.execute(
        [SequenceChunk(p[-1:], len(p) - 1, t) for p, t in zip(prompts, tables, strict=True)]
    )
    expected = torch.stack([hf_logits(hf, p)[-1] for p in prompts])
    torch.testing.assert_close(logits, expected, atol=TOLERANCE, rtol=0)


def test_logits_only_where_asked() -> None:
    hf = make_hf_llama()
    runner = ModelRunner(make_engine_model(hf), num_blocks=16, block_size=4)
    a, b, c = prompt(5, 1), prompt(6, 2), prompt(7, 3)
    logits = runner.execute(
        [
            SequenceChunk(a, 0, [0, 1], LogitsFor.LAST),
            SequenceChunk(b, 0, [2, 3], LogitsFor.NONE),
            SequenceChunk(c, 0, [4, 5], LogitsFor.LAST),
        ]
    )
    assert logits.shape == (2, 97)
    torch.testing.assert_close(
        logits, torch.stack([hf_logits(hf, a)[-1], hf_logits(hf, c)[-1]]), atol=TOLERANCE, rtol=0
    )


def test_qwen2_style_qkv_bias_matches_transformers() -> None:
    torch.manual_seed(0)
    config = Qwen2Config(**(TINY_LLAMA | {"max_position_embeddings": 128, "tie_word_embeddings": True}))
    hf = Qwen2ForCausalLM(config).eval()
    with torch.no_grad():
        for parameter in hf.parameters():
            parameter.normal_(0.0, 0.2)
    runner = ModelRunner(make_engine_model(hf), num_blocks=32, block_size=3)
    tokens = prompt(20)
    logits = runner.execute([SequenceChunk(tokens, 0, list(range(7)), LogitsFor.ALL)])
    torch.testing.assert_close(logits, hf_logits(hf, tokens), atol=TOLERANCE, rtol=0)
