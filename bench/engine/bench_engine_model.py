"""Batch-1 decode and prefill speed of kvgate's engine on SmolLM2, beside transformers and the memory bound.

Run: `.venv/bin/python bench/engine/bench_engine_model.py [--threads 1 2] [--decode-tokens 32] [--prefill-tokens 512]`

One intra-op thread by default: on this shared 2-core machine, with other jobs running, two threads made
both engine and transformers 4-6x slower (every op waits for the thread that was preempted); pass
`--threads 1 2` to compare on a quiet machine.

Everything is measured in one process, side by side, alternating engine and transformers in each round, so
that other load on the machine hits both alike; each figure is the best of `--rounds` rounds.

- Memory bandwidth: the best rate at which `torch.sum` reads a 1 GiB float32 tensor (far larger than any
  cache), with the same thread count. Decode must read every weight once per token, so the bound on decode
  speed is bandwidth / weight bytes read per token (all parameters except the embedding table, of which a
  decode step reads one row; with tied embeddings the head's copy is read in full).
- Engine decode: time of greedy one-token steps after a short chat prompt (prefill excluded).
- transformers decode: `generate` with n + 1 new tokens minus `generate` with 1, over n.
- Prefill: one forward over a `--prefill-tokens` prompt (engine: one chunk; transformers: `generate` of one
  token, which is that forward plus a negligible sampling step).
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from engine.model.paging import LogitsFor, SequenceChunk
from engine.runner import ModelRunner
from engine.weights.loader import ensure_hf_folder, load_model
from engine.weights.model_files import resolve_generator
from gateway.runtime.settings import Settings

BLOCK_SIZE = 16


@dataclass
class Figures:
    threads: int
    bandwidth_gbs: float
    engine_decode: float
    hf_decode: float
    engine_prefill: float
    hf_prefill: float


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, nargs="+", default=[1])
    parser.add_argument("--decode-tokens", type=int, default=32)
    parser.add_argument("--prefill-tokens", type=int, default=512)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()

    settings = Settings()
    source = resolve_generator(settings.generator, settings.model_dir)
    loaded = load_model(source, settings.model_dir)
    from transformers import AutoModelForCausalLM

    reference = AutoModelForCausalLM.from_pretrained(ensure_hf_folder(source, settings.model_dir)).eval()
    weight_bytes = decode_weight_bytes(loaded.model)
    chat = [{"role": "user", "content": "Explain in a few sentences why caching makes web services faster."}]
    prompt = list(loaded.tokenizer.apply_chat_template(chat, add_generation_prompt=True, return_dict=False))
    long_prompt = (prompt * (args.prefill_tokens // len(prompt) + 1))[: args.prefill_tokens]
    num_blocks = (args.prefill_tokens + len(prompt) + args.decode_tokens) // BLOCK_SIZE + 4
    runner = ModelRunner(loaded.model, num_blocks=num_blocks, block_size=BLOCK_SIZE)

    print(f"model: {loaded.folder.name}, {weight_bytes / 1e6:.0f} MB of float32 weights read per decode step")
    print(
        f"decode: {len(prompt)}-token chat prompt then {args.decode_tokens} greedy tokens; prefill: {len(long_prompt)} tokens"
    )
    results = []
    for threads in args.threads:
        torch.set_num_threads(threads)
        rounds = [
            Figures(
                threads=threads,
                bandwidth_gbs=measure_bandwidth() / 1e9,
                engine_decode=engine_decode_rate(runner, prompt, args.decode_tokens),
                hf_decode=hf_decode_rate(reference, prompt, args.decode_tokens),
                engine_prefill=engine_prefill_rate(runner, long_prompt),
                hf_prefill=hf_prefill_rate(reference, long_prompt),
            )
            for _ in range(args.rounds)
        ]
        results.append(Figures(threads, *(max(getattr(r, f) for r in rounds) for f in _FIELDS)))
    report(results, weight_bytes)


_FIELDS = ["bandwidth_gbs", "engine_decode", "hf_decode", "engine_prefill", "hf_prefill"]


def report(results: list[Figures], weight_bytes: int) -> None:
    header = (
        f"{'threads':>7} {'read GB/s':>9} {'bound tok/s':>11} | {'engine':>7} {'transformers':>12} "
        f"{'engine/hf':>9} {'engine/bound':>12} | {'prefill engine':>14} {'transformers':>12} {'engine/hf':>9}"
    )
    print(header)
    for figures in results:
        bound = figures.bandwidth_gbs * 1e9 / weight_bytes
        print(
            f"{figures.threads:>7} {figures.bandwidth_gbs:>9.1f} {bound:>11.1f} | "
            f"{figures.engine_decode:>7.1f} {figures.hf_decode:>12.1f} {figures.engine_decode / figures.hf_decode:>9.2f} "
            f"{figures.engine_decode / bound:>12.0%} | {figures.engine_prefill:>14.0f} {figures.hf_prefill:>12.0f} "
            f"{figures.engine_prefill / figures.hf_prefill:>9.2f}"
        )
    print("decode and prefill in tokens/s, best of rounds; bound = read bandwidth / weight bytes per token")


def decode_weight_bytes(model: torch.nn.Module) -> int:
    """Bytes of parameters one decode step reads: all of them but a separate embedding table."""
    embedding = getattr(model, "embed_tokens", None)
    skipped = embedding.numel() * embedding.element_size() if embedding is not None else 0
    return sum(p.numel() * p.element_size() for p in model.parameters()) - skipped


def measure_bandwidth(gib: float = 1.0, repeats: int = 5) -> float:
    """Bytes per second `torch.sum` reads from a float32 tensor far larger than the caches (best of repeats)."""
    data = torch.ones(int(gib * (1 << 30)) // 4)
    seconds = best_time(lambda: data.sum(), repeats)
    return data.numel() * 4 / seconds


def engine_decode_rate(runner: ModelRunner, prompt: list[int], new_tokens: int) -> float:
    table = list(range(runner.num_blocks))
    logits = runner.execute([SequenceChunk(prompt, 0, table)])
    token = int(logits[0].argmax())
    step_times = []
    for position in range(len(prompt), len(prompt) + new_tokens):
        started = time.perf_counter()
        logits = runner.execute([SequenceChunk([token], position, table)])
        token = int(logits[0].argmax())
        step_times.append(time.perf_counter() - started)
    return 1 / statistics.median(step_times)


def engine_prefill_rate(runner: ModelRunner, prompt: list[int]) -> float:
    chunk = SequenceChunk(prompt, 0, list(range(runner.num_blocks)), LogitsFor.LAST)
    return len(prompt) / best_time(lambda: runner.execute([chunk]), 1)


@torch.inference_mode()
def hf_decode_rate(model: torch.nn.Module, prompt: list[int], new_tokens: int) -> float:
    ids = torch.tensor([prompt])

    def generate(count: int) -> None:
        model.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=count,
            min_new_tokens=count,
            do_sample=False,
            pad_token_id=0,
        )

    with_decode = best_time(lambda: generate(new_tokens + 1), 1)
    prefill_only = best_time(lambda: generate(1), 1)
    return new_tokens / max(with_decode - prefill_only, 1e-9)


@torch.inference_mode()
def hf_prefill_rate(model: torch.nn.Module, prompt: list[int]) -> float:
    ids = torch.tensor([prompt])
    seconds = best_time(
        lambda: model.generate(
            ids, attention_mask=torch.ones_like(ids), max_new_tokens=1, do_sample=False, pad_token_id=0
        ),
        1,
    )
    return len(prompt) / seconds


def best_time(function: Callable[[], object], repeats: int) -> float:
    function()  # warm-up: allocator, thread pool, first-call dispatch
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        function()
        times.append(time.perf_counter() - started)
    return min(times)


if __name__ == "__main__":
    main()
