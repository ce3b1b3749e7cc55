"""Serving figures of the engine on SmolLM2-135M (float32, CPU), each measured side by side in one run.

    .venv/bin/python bench/engine/bench_engine_serving.py            # ~6-10 minutes on 2 busy cores
    .venv/bin/python bench/engine/bench_engine_serving.py --quick    # fewer tokens and repeats, ~2-3 minutes

1. Time to first token for a 1,024-token shared prefix + 32-token new suffix, warm (prefix cached by an
   earlier request) vs cold (never seen). Goal: warm / cold <= 0.1.
2. Aggregate output tokens/s with 1, 4 and 16 concurrent requests (128-token prompts, 128 new tokens, greedy,
   no early stop) next to transformers' `generate` run one by one and batched (equal-length prompts, so the
   batch needs no pad tokens). Goal: kvgate at 16 >= 4x transformers one by one.
3. KV held by 32 requests sharing a 1,024-token system prompt: distinct blocks holding that prompt across
   all of them, over the blocks the prompt needs once. Goal: <= 1.1x (not 32x).
4. llama.cpp (llama-cpp-python) on the same GGUF, the 16 requests one by one: only when it is installed.
Prompts are random token ids (no special tokens); kvgate and transformers run with the same torch thread
count (`--threads`, default 1); the machine is shared, so expect noise.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from engine.engine import LLMEngine, build_engine
from engine.engine_config import EngineConfig
from engine.sampler import SamplingParams
from engine.scheduler import SchedulerConfig
from engine.weights.loader import ensure_hf_folder, load_model
from engine.weights.model_files import DEFAULT_GENERATOR_NAME, resolve_generator

DEFAULT_MODEL_DIR = Path("/root/.cache/kvgate/models")
BLOCK_SIZE = 16


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model-dir", type=Path, default=DEFAULT_MODEL_DIR)
    parser.add_argument(
        "--quick", action="store_true", help="64 new tokens, one repeat, concurrency 1 and 16"
    )
    parser.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch intra-op threads for both engines (on this shared 2-core box, 2 threads spun against "
        "other jobs and ran ~5x slower than 1)",
    )
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    new_tokens = 64 if args.quick else 128
    repeats = 1 if args.quick else 3
    concurrencies = (1, 16) if args.quick else (1, 4, 16)

    source = resolve_generator(DEFAULT_GENERATOR_NAME, args.model_dir)
    loaded = load_model(source, args.model_dir)
    vocab = loaded.config.vocab_size
    rng = random.Random(0)

    def tokens(count: int) -> list[int]:
        return [rng.randrange(200, vocab - 200) for _ in range(count)]

    def engine() -> LLMEngine:
        scheduler = SchedulerConfig(max_num_batched_tokens=512, max_num_seqs=64)
        return build_engine(loaded, DEFAULT_GENERATOR_NAME, EngineConfig(2048, BLOCK_SIZE, scheduler))

    print(
        f"SmolLM2-135M float32, torch {torch.__version__}, {torch.get_num_threads()} threads, block {BLOCK_SIZE}"
    )
    engine().generate([tokens(16)], SamplingParams(temperature=0, max_tokens=4))  # warm up kernels

    print("\n1. time to first token, 1,024-token shared prefix + 32-token suffix")
    served = engine()
    cold, warm = [], []
    for _ in range(repeats):
        prefix = tokens(1024)
        cold.append(time_to_first_token(served, prefix + tokens(32)))
        warm.append(time_to_first_token(served, prefix + tokens(32)))
    cold_s, warm_s = statistics.median(cold), statistics.median(warm)
    print(
        f"   cold {cold_s * 1000:8.1f} ms   warm {warm_s * 1000:8.1f} ms   warm/cold {warm_s / cold_s:.3f}  (goal <= 0.1)"
    )

    print(f"\n2. aggregate output tokens/s, 128-token prompts, {new_tokens} new tokens")
    hf = hf_model(ensure_hf_folder(source, args.model_dir))
    one_by_one = hf_generate_rate(hf, [tokens(128) for _ in range(2)], new_tokens, batched=False)
    print(f"   transformers generate, one by one:       {one_by_one:8.1f} tok/s")
    engine_rates = {}
    for concurrency in concurrencies:
        prompts = [tokens(128) for _ in range(concurrency)]
        engine_rates[concurrency] = engine_rate(engine(), prompts, new_tokens)
        line = (
            f"   kvgate engine, {concurrency:2d} concurrent:           {engine_rates[concurrency]:8.1f} tok/s"
        )
        if concurrency > 1:
            batched = hf_generate_rate(hf, prompts, new_tokens, batched=True)
            line += f"   transformers batched x{concurrency}: {batched:8.1f} tok/s"
            line += f"   kvgate / batched {engine_rates[concurrency] / batched:.2f}x"
        print(line + f"   kvgate / one-by-one {engine_rates[concurrency] / one_by_one:.2f}x")
    print(f"   goal: kvgate at 16 >= 4x one by one -> {engine_rates[16] / one_by_one:.2f}x")

    print("\n3. KV blocks held by 32 requests sharing a 1,024-token system prompt")
    ratio, in_use, prompt_blocks = shared_prompt_blocks(
        engine(), tokens(1024), [tokens(16) for _ in range(32)]
    )
    print(
        f"   distinct blocks holding the prompt: {ratio * prompt_blocks:.0f} of {prompt_blocks} needed once -> "
        f"{ratio:.2f}x (goal <= 1.1x, 32.00x without sharing); all blocks in use {in_use}"
    )

    print("\n4. llama.cpp, same GGUF, 16 requests one by one")
    try:
        from llama_cpp import Llama  # type: ignore[import-not-found]
    except ImportError:
        print("   skipped: llama-cpp-python is not installed")
    else:
        rate = llama_cpp_rate(Llama, Path(source.location), [tokens(128) for _ in range(16)], new_tokens)
        print(
            f"   llama.cpp one by one {rate:8.1f} tok/s   kvgate at 16 / llama.cpp {engine_rates[16] / rate:.2f}x"
        )


def time_to_first_token(engine: LLMEngine, prompt: list[int]) -> float:
    request_id = f"ttft-{time.monotonic_ns()}"
    start = time.perf_counter()
    engine.add_request(request_id, prompt, SamplingParams(temperature=0, max_tokens=1))
    while not any(output.request_id == request_id for output in engine.step()):
        pass
    return time.perf_counter() - start


def engine_rate(engine: LLMEngine, prompts: list[list[int]], new_tokens: int) -> float:
    start = time.perf_counter()
    outputs = engine.generate(prompts, SamplingParams(temperature=0, max_tokens=new_tokens, ignore_eos=True))
    elapsed = time.perf_counter() - start
    assert all(len(output) == new_tokens for output in outputs)
    return sum(map(len, outputs)) / elapsed


def shared_prompt_blocks(
    engine: LLMEngine, system_prompt: list[int], suffixes: list[list[int]]
) -> tuple[float, int, int]:
    """Once every request is running: distinct blocks covering the system prompt / blocks it needs."""
    for index, suffix in enumerate(suffixes):
        engine.add_request(
            f"shared-{index}", system_prompt + suffix, SamplingParams(temperature=0, max_tokens=4)
        )
    manager = engine.scheduler.block_manager
    prompt_blocks = len(system_prompt) // BLOCK_SIZE
    peak_ratio, peak_in_use = 0.0, 0
    while engine.has_unfinished():
        engine.step()
        running = [sequence.request_id for sequence in engine.scheduler.running]
        holding = {
            block for request_id in running for block in manager.block_table(request_id)[:prompt_blocks]
        }
        peak_ratio = max(peak_ratio, len(holding) / prompt_blocks)
        peak_in_use = max(peak_in_use, manager.stats().num_blocks_in_use)
    return peak_ratio, peak_in_use, prompt_blocks


def hf_model(folder: Path) -> Any:
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()


@torch.inference_mode()
def hf_generate_rate(model: Any, prompts: list[list[int]], new_tokens: int, batched: bool) -> float:
    batches = [prompts] if batched else [[prompt] for prompt in prompts]
    start = time.perf_counter()
    produced = 0
    for batch in batches:
        input_ids = torch.tensor(batch)  # equal lengths: no padding needed
        output = model.generate(
            input_ids,
            attention_mask=torch.ones_like(input_ids),
            max_new_tokens=new_tokens,
            min_new_tokens=new_tokens,
            do_sample=False,
            pad_token_id=0,
        )
        produced += (output.shape[1] - input_ids.shape[1]) * output.shape[0]
    return produced / (time.perf_counter() - start)


def llama_cpp_rate(llama_class: Any, gguf: Path, prompts: list[list[int]], new_tokens: int) -> float:
    llm = llama_class(model_path=str(gguf), n_ctx=512, verbose=False)
    start = time.perf_counter()
    produced = 0
    for prompt in prompts:
        llm.reset()
        for count, _ in enumerate(llm.generate(prompt, temp=0.0), start=1):
            if count == new_tokens:
                break
        produced += new_tokens
    return produced / (time.perf_counter() - start)


if __name__ == "__main__":
    main()
