"""Structured outputs' cost: output tokens/s of 16 concurrent chat requests, free text vs under a
`json_schema` grammar, side by side in one run (SmolLM2-135M as `make serve` runs it: weights chosen as
`KVGATE_ENGINE_WEIGHTS=auto` chooses them, int4 with the native decode step where it builds; 2 threads).
Goal: json_schema >= 0.8x plain.

    .venv/bin/python bench/engine/bench_structured.py              # ~1-2 minutes on 2 busy cores
    .venv/bin/python bench/engine/bench_structured.py --max-tokens 24 --repeats 1

Both sides generate exactly 16 x max_tokens tokens: the plain requests ignore the end of text, and the
schema (an array of at least 64 strings) cannot be complete before max_tokens, so neither batch shrinks
early. The grammar is compiled once before timing (the compile cache serves every request after the
first, as it does in service); what is timed is the per-step cost: filling 16 masks (on a worker thread,
during the forward pass), applying them, advancing 16 matchers. Rounds alternate plain / json_schema and the
best of each is kept (the machine is shared). Printed beside: the compile time of the schema and the time
to fill one row's mask, per step, along a JSON answer.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from engine.engine import LLMEngine, build_engine
from engine.engine_config import EngineConfig
from engine.grammar import GrammarCompiler, bitmask, json_schema_spec
from engine.sampler import SamplingParams
from engine.scheduler import SchedulerConfig
from engine.weights.choice import choose_weights
from engine.weights.loader import ensure_hf_folder, load_model, read_config, weights_storage
from engine.weights.model_files import DEFAULT_GENERATOR_NAME, resolve_generator

DEFAULT_MODEL_DIR = Path("/root/.cache/kvgate/models")
CONCURRENCY = 16
SCHEMA = {
    "type": "object",
    "properties": {"items": {"type": "array", "items": {"type": "string"}, "minItems": 64}},
    "required": ["items"],
    "additionalProperties": False,
}
QUESTIONS = [
    "List some fruits.",
    "Name cities in Europe.",
    "Give me words that rhyme with cat.",
    "List programming languages.",
]


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model-dir", type=Path, default=DEFAULT_MODEL_DIR)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--threads", type=int, default=2, help="torch intra-op threads (the default's)")
    parser.add_argument("--weights", default="auto", help="as KVGATE_ENGINE_WEIGHTS")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)

    source = resolve_generator(DEFAULT_GENERATOR_NAME, args.model_dir)
    config = read_config(ensure_hf_folder(source, args.model_dir))
    weights = choose_weights(args.weights, config, weights_storage(source))
    loaded = load_model(source, args.model_dir, weights=weights.weights)
    prompts = [
        loaded.tokenizer.apply_chat_template(
            [{"role": "user", "content": f"{QUESTIONS[index % len(QUESTIONS)]} (#{index})"}],
            add_generation_prompt=True,
            tokenize=True,
            return_dict=False,
        )
        for index in range(CONCURRENCY)
    ]
    scheduler = SchedulerConfig(max_num_batched_tokens=512, max_num_seqs=64)
    engine = build_engine(loaded, DEFAULT_GENERATOR_NAME, EngineConfig(1024, 16, scheduler))
    plain = SamplingParams(temperature=0, max_tokens=args.max_tokens, ignore_eos=True)
    constrained = SamplingParams(temperature=0, max_tokens=args.max_tokens, grammar=json_schema_spec(SCHEMA))
    run(engine, prompts[:2], constrained)  # warm up: kernels, llguidance's tokenizer and the one compile

    print(
        f"SmolLM2-135M {weights.weights}, decode {engine.runner.decode_kernel}, torch {torch.__version__}, "
        f"{torch.get_num_threads()} thread(s), "
        f"{CONCURRENCY} concurrent chat requests x {args.max_tokens} new tokens"
    )
    best = {"plain": 0.0, "json_schema": 0.0}
    for _ in range(args.repeats):
        for name, sampling in (("plain", plain), ("json_schema", constrained)):
            best[name] = max(best[name], run(engine, prompts, sampling))
    ratio = best["json_schema"] / best["plain"]
    print(f"{'plain':>12}: {best['plain']:7.1f} tok/s")
    print(f"{'json_schema':>12}: {best['json_schema']:7.1f} tok/s")
    print(f"{'ratio':>12}: {ratio:7.2f}x  (goal >= 0.80x)")
    compile_ms, fill_ms = mask_costs(engine.grammars, loaded.tokenizer)
    print(f"{'compile':>12}: {compile_ms:7.2f} ms per schema")
    print(f"{'mask fill':>12}: {fill_ms:7.3f} ms per row and step (median)")


def mask_costs(compiler: GrammarCompiler, tokenizer: Any) -> tuple[float, float]:
    """Milliseconds to compile a schema (the tokenizer read already) and, median, to fill one row's mask."""
    started = time.perf_counter()
    grammar = compiler.matcher(json_schema_spec({**SCHEMA, "title": "not cached yet"}))
    compile_ms = (time.perf_counter() - started) * 1e3
    answer = json.dumps({"items": ["apple", "banana", "cherry", "kiwi", "mango"] * 13})
    mask, fills = bitmask(1, compiler.vocab_size), []
    for token_id in tokenizer.encode(answer, add_special_tokens=False):
        started = time.perf_counter()
        grammar.fill(mask, 0)
        fills.append(time.perf_counter() - started)
        grammar.advance(token_id)
    return compile_ms, statistics.median(fills) * 1e3


def run(engine: LLMEngine, prompts: list[list[int]], sampling: SamplingParams) -> float:
    """Output tokens/s for `prompts` run together to completion (prefill included, as a client sees it)."""
    started = time.perf_counter()
    outputs = engine.generate(prompts, sampling)
    elapsed = time.perf_counter() - started
    assert all(len(tokens) == sampling.max_tokens for tokens in outputs), "a batch ended early"
    return sum(len(tokens) for tokens in outputs) / elapsed


if __name__ == "__main__":
    main()
