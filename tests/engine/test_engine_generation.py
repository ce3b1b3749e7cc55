"""Greedy generation over the paged cache gives transformers' tokens, however the work is cut up, and KV
blocks left by an earlier request serve a later one exactly as a cold run would."""

from __future__ import annotations

import pytest
import torch

from engine.model.paging import LogitsFor, SequenceChunk
from engine.runner import ModelRunner
from tests.engine.llama_testing import (
    BlockAllocator,
    ToySequence,
    hf_greedy,
    make_engine_model,
    make_hf_llama,
    run_greedy,
)

NEW_TOKENS = 12


def prompt(length: int, seed: int) -> list[int]:
    return torch.randint(0, 97, (length,), generator=torch.Generator().manual_seed(seed)).tolist()


@pytest.fixture(scope="module")
def models():  # type: ignore[no-untyped-def]
    hf = make_hf_llama(seed=3, num_hidden_layers=3)
    return hf, make_engine_model(hf)


@pytest.mark.parametrize("chunk_size", [None, 4], ids=["one-go", "chunked"])
@pytest.mark.parametrize("block_size", [3, 5])
def test_greedy_alone_matches_transformers(models, chunk_size: int | None, block_size: int) -> None:  # type: ignore[no-untyped-def]
    hf, model = models
    tokens = prompt(19, seed=1)
    runner = ModelRunner(model, num_blocks=32, block_size=block_size)
    [output] = run_greedy(runner, BlockAllocator(32), [ToySequence(tokens, NEW_TOKENS)], chunk_size)
    assert output == hf_greedy(hf, tokens, NEW_TOKENS)


@pytest.mark.parametrize("chunk_size", [None, 5], ids=["one-go", "chunked"])
def test_greedy_batched_with_different_lengths_and_arrivals_matches_transformers(models, chunk_size) -> None:  # type: ignore[no-untyped-def]
    hf, model = models
    prompts = [prompt(n, seed=n) for n in (2, 23, 9, 14, 31)]
    runner = ModelRunner(model, num_blocks=80, block_size=3)
    sequences = [ToySequence(p, NEW_TOKENS) for p in prompts]
    # Staggered arrivals: later sequences prefill while earlier ones decode, in the same steps.
    outputs = run_greedy(runner, BlockAllocator(80), sequences, chunk_size, start_steps=[0, 0, 3, 5, 6])
    assert outputs == [hf_greedy(hf, p, NEW_TOKENS) for p in prompts]


@pytest.mark.parametrize("chunk_size", [None, 4], ids=["one-go", "chunked"])
def test_greedy_with_prefix_blocks_from_an_earlier_request_matches_transformers(models, chunk_size) -> None:  # type: ignore[no-untyped-def]
    hf, model = models
    block_size = 4
    shared = prompt(12, seed=7)  # three full blocks
    runner = ModelRunner(model, num_blocks=64, block_size=block_size)
    allocator = BlockAllocator(64)
    earlier = ToySequence(shared + prompt(5, seed=8), NEW_TOKENS)
    run_greedy(runner, allocator, [earlier], chunk_size)
    prefix_blocks = earlier.block_table[:3]
    later_prompts = [shared + prompt(6, seed=9), shared + prompt(1, seed=10), shared + prompt(13, seed=11)]
    # Each later request starts with the shared blocks (read-only) and 12 tokens already computed.
    later = [ToySequence(p, NEW_TOKENS, list(prefix_blocks), num_computed=12) for p in later_prompts]
    outputs = run_greedy(runner, allocator, later, chunk_size, start_steps=[0, 1, 2])
    assert outputs == [hf_greedy(hf, p, NEW_TOKENS) for p in later_prompts]


def test_reused_kv_blocks_give_exactly_the_cold_logits(models) -> None:  # type: ignore[no-untyped-def]
    _, model = models
    shared, first_tail, second_tail = prompt(15, seed=1), prompt(9, seed=2), prompt(11, seed=3)

    # Cold: a fresh cache computes the shared prefix, then the second request's tail after it.
    cold = ModelRunner(model, num_blocks=16, block_size=5)
    cold_table = [4, 9, 2, 13, 7, 0]
    cold.execute([SequenceChunk(shared, 0, cold_table[:3], LogitsFor.NONE)])
    cold_logits = cold.execute([SequenceChunk(second_tail, 15, cold_table, LogitsFor.ALL)])

    # Warm: an earlier request computed the prefix (batched with a stranger) into blocks 10, 3, 6, then its
    # own tail and a decode step; the second request reads those blocks and computes only its tail.
    warm = ModelRunner(model, num_blocks=16, block_size=5)
    first_table = [10, 3, 6, 1, 5]
    warm.execute(
        [
            SequenceChunk(prompt(8, seed=4), 0, [14, 15], LogitsFor.LAST),
            SequenceChunk(shared, 0, first_table[:3], LogitsFor.NONE),
        ]
    )
    warm.execute([SequenceChunk(first_tail, 15, first_table, LogitsFor.LAST)])
    warm.execute([SequenceChunk(prompt(1, seed=5), 24, first_table, LogitsFor.LAST)])
    warm_logits = warm.execute([SequenceChunk(second_tail, 15, [10, 3, 6, 12, 8, 11], LogitsFor.ALL)])

    assert torch.equal(warm_logits, cold_logits)


def test_prefix_blocks_written_by_a_longer_prefill_agree_to_float_rounding(models) -> None:  # type: ignore[no-untyped-def]
    # Not bitwise: SDPA's flash kernel blocks its sums by sequence length, so a prefix computed as part of
    # 24 tokens differs from one computed alone in the last bits (measured ~2e-6 in K/V).
    _, model = models
    shared, first_tail, second_tail = prompt(15, seed=1), prompt(9, seed=2), prompt(11, seed=3)
    cold = ModelRunner(model, num_blocks=16, block_size=5)
    cold.execute([SequenceChunk(shared, 0, [0, 1, 2], LogitsFor.NONE)])
    cold_logits = cold.execute([SequenceChunk(second_tail, 15, [0, 1, 2, 3, 4, 5], LogitsFor.ALL)])
    warm = ModelRunner(model, num_blocks=16, block_size=5)
    warm.execute([SequenceChunk(shared + first_tail, 0, [0, 1, 2, 6, 7], LogitsFor.LAST)])
    warm_logits = warm.execute([SequenceChunk(second_tail, 15, [0, 1, 2, 3, 4, 5], LogitsFor.ALL)])
    torch.testing.assert_close(warm_logits, cold_logits, atol=1e-5, rtol=0)
