"""The real default model: our engine's greedy output is token-identical to transformers' on the same
weights (the cached float32 conversion of the packaged SmolLM2 GGUF, which both sides read)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from engine.loader import ensure_hf_folder, load_model
from engine.model_files import resolve_generator
from engine.runner import ModelRunner
from gateway.settings import Settings
from tests.engine.llama_testing import BlockAllocator, ToySequence, run_greedy

pytestmark = pytest.mark.slow

MAX_NEW_TOKENS = 24
CHATS = [
    [{"role": "user", "content": "What is the capital of France?"}],
    [{"role": "user", "content": "Write a haiku about caching."}],
    [
        {"role": "system", "content": "You answer in one short sentence."},
        {"role": "user", "content": "Why is the sky blue?"},
    ],
    [{"role": "user", "content": "List three prime numbers."}],
]


@pytest.fixture(scope="module")
def model_dir() -> Path:
    model_dir = Settings().model_dir
    source = resolve_generator("smollm2-135m-instruct", model_dir)
    if not source.present:
        pytest.skip(f"default GGUF not fetched into {model_dir} (run `kvgate models`)")
    return model_dir


@pytest.fixture
def one_thread() -> Iterator[None]:
    # On this shared 2-core machine one intra-op thread is several times faster than two (other jobs
    # preempt one of the two, and every op waits for it); the result does not depend on it.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.mark.usefixtures("one_thread")
def test_greedy_chat_outputs_match_transformers(model_dir: Path) -> None:
    from transformers import AutoModelForCausalLM

    source = resolve_generator("smollm2-135m-instruct", model_dir)
    loaded = load_model(source, model_dir)
    prompts = [
        loaded.tokenizer.apply_chat_template(
            chat, add_generation_prompt=True, tokenize=True, return_dict=False
        )
        for chat in CHATS
    ]
    eos = loaded.config.eos_token_ids

    # Ours: all chats in one batch, arriving a step apart, prefilled in chunks of 16 beside others' decodes.
    runner = ModelRunner(loaded.model, num_blocks=64, block_size=16)
    sequences = [ToySequence(list(p), MAX_NEW_TOKENS, stop_token_ids=eos) for p in prompts]
    ours = run_greedy(runner, BlockAllocator(64), sequences, chunk_size=16, start_steps=[0, 1, 2, 3])

    reference = AutoModelForCausalLM.from_pretrained(ensure_hf_folder(source, model_dir), dtype=torch.float32)
    for prompt, output in zip(prompts, ours, strict=True):
        with torch.inference_mode():
            generated = reference.generate(
                torch.tensor([prompt]),
                attention_mask=torch.ones(1, len(prompt), dtype=torch.int64),
                max_new_tokens=MAX_NEW_TOKENS,
                do_sample=False,
                eos_token_id=list(eos),
                pad_token_id=eos[0],
            )
        assert output == generated[0, len(prompt) :].tolist(), loaded.tokenizer.decode(output)
