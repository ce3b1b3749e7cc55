"""kvgate's engine beside llama-server on the same GGUF, over loopback HTTP with one client script.

    make llama-server                                   # once: builds it from the llama-cpp-python sdist
    .venv/bin/python bench/engine/bench_engine_vs_llama_cpp.py [--threads 1 2] [--weights int4 fp32]

Servers, each started alone (nothing else runs while one is measured): kvgate in engine mode with
`KVGATE_ENGINE_WEIGHTS` set to each `--weights` (`Cache-Control: no-cache, no-store` on every request, so
the semantic cache neither answers nor stores and every request reaches the engine), and llama-server
with `-np 16` and `-np 1`, at each `--threads` (kvgate's `KVGATE_TORCH_THREADS`, llama-server's `-t`).

Per server:
1. TTFT for a ~2,450-token shared system prompt + a new question, cold (the system prompt never seen),
   then warm (same system prompt, another question), streamed; median of `--repeats`.
2. Output tokens/s of 16 concurrent requests (different questions, 64 tokens each, greedy): completion
   tokens over wall time; median of `--repeats` batches.
3. Output tokens/s of one request alone (128 tokens): completion tokens over its wall time; median of
   `--alone-repeats` requests, one after another (one request is at the mercy of a shared machine's moment).
4. RSS of the server process after the run.
5. Alone again, side by side: kvgate int4 and llama-server `-np 1` both up (each idle while the other
   answers), one 128-token request to each in turn for `--side-by-side-rounds` rounds, medians: on a shared
   machine a slow moment falls on both.
Then the RSS of the engine alone (a process that loads the model, builds the engine and generates one
answer, no gateway) per weights format, since the gateway process also holds the embedder and verifier.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from bench.gateway.bench_hit_path import rss_mb, running  # noqa: E402
from tests.reliability.redis_proc import free_port  # noqa: E402

DEFAULT_LLAMA_SERVER = ROOT / ".venv" / "llama.cpp" / "build" / "bin" / "llama-server"
NO_CACHE = {"cache-control": "no-cache, no-store"}
TOPICS = [
    "lighthouses", "volcanoes", "honeybees", "glaciers", "submarines", "coral reefs", "comets", "deserts",
    "rainforests", "windmills", "octopuses", "castles", "trains", "owls", "bridges", "tides",
]  # fmt: skip


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--weights", nargs="+", default=["int4", "fp32"])
    parser.add_argument("--llama-server", type=Path, default=DEFAULT_LLAMA_SERVER)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument(
        "--alone-repeats", type=int, default=5, help="single requests timed one after another"
    )
    parser.add_argument(
        "--side-by-side-rounds", type=int, default=8, help="alternating single requests, both servers up"
    )
    parser.add_argument("--system-words", type=int, default=1900, help="~2,450 tokens at the default")
    parser.add_argument("--hits-only", action="store_true", help="only kvgate's hit latency, idle and busy")
    parser.add_argument(
        "--baseline-rev", help="also the fp32 engine-alone RSS of kvgate at this git revision (e.g. c5ed2de)"
    )
    parser.add_argument("--rss-only", action="store_true", help="only the engine-alone RSS figures")
    args = parser.parse_args(argv)
    from engine.weights.model_files import DEFAULT_GENERATOR_NAME, resolve_generator
    from gateway.runtime.settings import Settings

    gguf = Path(resolve_generator(DEFAULT_GENERATOR_NAME, Settings().model_dir).location)
    if not (args.rss_only or args.hits_only) and not args.llama_server.is_file():
        raise SystemExit(f"no llama-server at {args.llama_server}: run `make llama-server` first")
    results: list[dict[str, Any]] = []
    side_by_side: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="kvgate-bench-") as scratch:
        for threads in [] if args.rss_only else args.threads:
            for weights in args.weights:
                results.append(
                    measure_kvgate(weights, threads, Path(scratch) / f"kvgate-{weights}-{threads}", args)
                )
            for slots in () if args.hits_only else (16, 1):
                results.append(
                    measure_llama_server(args.llama_server, gguf, slots, threads, Path(scratch), args)
                )
            if not args.hits_only and "int4" in args.weights:
                side_by_side.append(
                    alone_side_by_side(
                        args.llama_server, gguf, threads, Path(scratch), args.side_by_side_rounds
                    )
                )
    if args.hits_only:
        return
    engine_rss = {weights: run_engine_rss(weights) for weights in args.weights}
    if args.baseline_rev:
        engine_rss[f"fp32 at {args.baseline_rev}"] = baseline_rss(args.baseline_rev)
    report(results, engine_rss, side_by_side)


def measure_kvgate(weights: str, threads: int, folder: Path, args: argparse.Namespace) -> dict[str, Any]:
    with kvgate_server(weights, threads, folder) as (base, process):
        health = httpx.get(base + "/healthz", timeout=10).json()
        result = {} if args.hits_only else workload(base, "smollm2-135m-instruct", NO_CACHE, args)
        result.update(asyncio.run(hit_latency(base + "/v1/chat/completions", "smollm2-135m-instruct")))
        result["rss_mb"] = rss_mb(process.pid)
    result.update(server=f"kvgate {weights}", threads=threads, weights=health["generator"]["weights"])
    print(json.dumps(result), flush=True)
    return result


@contextlib.contextmanager
def kvgate_server(weights: str, threads: int, folder: Path) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """kvgate in engine mode with these weights and threads: (its base URL, its process)."""
    port = free_port()
    folder.mkdir(parents=True)
    env = os.environ | {
        "PYTHONPATH": str(ROOT),
        "KVGATE_PORT": str(port),
        "KVGATE_DATA_DIR": str(folder / "data"),
        "KVGATE_ENGINE_WEIGHTS": weights,
        "KVGATE_TORCH_THREADS": str(threads),
    }
    env.pop("KVGATE_UPSTREAM_URL", None)
    command = [sys.executable, "-c", "from gateway.cli import app; app()", "serve"]
    base = f"http://127.0.0.1:{port}"
    with running(command, env, ROOT, base + "/readyz", folder / "kvgate.log") as process:
        yield base, process


def measure_llama_server(
    binary: Path, gguf: Path, slots: int, threads: int, scratch: Path, args: argparse.Namespace
) -> dict[str, Any]:
    with llama_server(binary, gguf, slots, threads, scratch) as (base, process):
        result = workload(base, "default", {}, args)
        result["rss_mb"] = rss_mb(process.pid)
    result.update(server=f"llama-server -np {slots}", threads=threads)
    print(json.dumps(result), flush=True)
    return result


@contextlib.contextmanager
def llama_server(
    binary: Path, gguf: Path, slots: int, threads: int, scratch: Path
) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """llama-server on the GGUF with `slots` slots: (its base URL, its process)."""
    port = free_port()
    context = 4096 * slots  # every slot holds the long system prompt and an answer
    command = [
        str(binary), "-m", str(gguf), "--host", "127.0.0.1", "--port", str(port), "-np", str(slots),
        "-t", str(threads), "-tb", str(threads), "-c", str(context), "--no-webui",
    ]  # fmt: skip
    base = f"http://127.0.0.1:{port}"
    with running(
        command, dict(os.environ), scratch, base + "/health", scratch / f"llama-{slots}-{threads}.log"
    ) as process:
        yield base, process


def alone_side_by_side(binary: Path, gguf: Path, threads: int, scratch: Path, rounds: int) -> dict[str, Any]:
    """Single-stream tok/s of kvgate int4 and llama-server `-np 1`, both up at once (each idle while the other
    answers), one 128-token request to each in turn for `rounds` rounds: a slow moment of a shared machine
    falls on both, which measuring them one after the other cannot promise."""
    with (
        kvgate_server("int4", threads, scratch / f"side-by-side-{threads}") as (kvgate, _),
        llama_server(binary, gguf, 1, threads, scratch) as (llama, _),
    ):
        rates: dict[str, list[float]] = {"kvgate int4": [], "llama-server -np 1": []}
        targets = {
            "kvgate int4": (kvgate, "smollm2-135m-instruct", NO_CACHE),
            "llama-server -np 1": (llama, "default", {}),
        }
        asyncio.run(_alone_rounds(targets, rates, rounds))
    result: dict[str, Any] = {name: round(statistics.median(values), 1) for name, values in rates.items()}
    result.update(threads=threads, rounds=rates)
    print(json.dumps(result), flush=True)
    return result


async def _alone_rounds(
    targets: dict[str, tuple[str, str, dict[str, str]]], rates: dict[str, list[float]], rounds: int
) -> None:
    clients = {
        name: httpx.AsyncClient(timeout=600, headers=headers) for name, (_, _, headers) in targets.items()
    }
    try:
        for name, (base, model, _) in targets.items():
            await chat(clients[name], base + "/v1/chat/completions", model, [user("Say hello.")], 4)
        for round_ in range(rounds):
            order = list(targets) if round_ % 2 == 0 else list(reversed(targets))
            for name in order:
                base, model, _ = targets[name]
                topic = TOPICS[round_ % len(TOPICS)]
                started = time.perf_counter()
                tokens = await chat(
                    clients[name], base + "/v1/chat/completions", model,
                    [user(f"Write a long story about a {topic} keeper.")], 128,
                )  # fmt: skip
                rates[name].append(round(tokens / (time.perf_counter() - started), 1))
    finally:
        for client in clients.values():
            await client.aclose()


def workload(base: str, model: str, headers: dict[str, str], args: argparse.Namespace) -> dict[str, Any]:
    return asyncio.run(_workload(base, model, headers, args))


async def _workload(
    base: str, model: str, headers: dict[str, str], args: argparse.Namespace
) -> dict[str, Any]:
    url = base + "/v1/chat/completions"
    async with httpx.AsyncClient(timeout=600, headers=headers) as client:
        await chat(client, url, model, [user("Say hello.")], 4)  # warm up the connection and the server
        cold, warm = [], []
        for repeat in range(args.repeats):
            system = system_prompt(args.system_words, seed=repeat)
            cold.append(
                await first_token_time(
                    client, url, model, system, f"What does part {repeat} say about {TOPICS[repeat]}?"
                )
            )
            warm.append(
                await first_token_time(
                    client, url, model, system, f"Summarise part {repeat + 3} in one line."
                )
            )
        concurrent, concurrent_tokens = [], 0
        for repeat in range(args.repeats):
            started = time.perf_counter()
            answers = await asyncio.gather(
                *(
                    chat(client, url, model, [user(f"Write a long story about {topic} ({repeat}).")], 64)
                    for topic in TOPICS
                )
            )
            concurrent.append(sum(answers) / (time.perf_counter() - started))
            concurrent_tokens += sum(answers)
        alone, alone_tokens = [], 0
        for topic in TOPICS[: args.alone_repeats]:
            started = time.perf_counter()
            tokens = await chat(
                client, url, model, [user(f"Write a long story about a {topic} keeper.")], 128
            )
            alone.append(tokens / (time.perf_counter() - started))
            alone_tokens += tokens
    return {
        "ttft_cold_s": round(statistics.median(cold), 3),
        "ttft_warm_s": round(statistics.median(warm), 3),
        "concurrent16_tok_s": round(statistics.median(concurrent), 1),
        "concurrent16_tokens": concurrent_tokens,
        "alone_tok_s": round(statistics.median(alone), 1),
        "alone_tok_s_all": [round(rate, 1) for rate in alone],
        "alone_tokens": alone_tokens,
    }


COUNTRIES = [
    "France", "Germany", "Spain", "Italy", "Portugal", "Norway", "Sweden", "Finland", "Poland", "Austria",
    "Greece", "Turkey", "Egypt", "Kenya", "Nigeria", "Brazil", "Argentina", "Chile", "Peru", "Mexico",
    "Canada", "Japan", "China", "India", "Thailand", "Vietnam", "Australia", "Ireland", "Denmark", "Hungary",
    "Romania", "Ukraine", "Morocco", "Ghana", "Colombia", "Cuba", "Iceland", "Nepal", "Mongolia", "Belgium",
]  # fmt: skip
SYSTEM = {"role": "system", "content": "You are a concise assistant. Answer in one short sentence."}


async def hit_latency(url: str, model: str) -> dict[str, Any]:
    """p50 of semantic hits (embedder, index, rule) idle, then with 8 long generations in the engine.

    One answer stored per country ("What is the capital of X?", stored without a lookup so that they never
    answer one another); each paraphrase ("Tell me the capital of X.") asked once, since a hit is then
    stored under its own text and would come back as an exact hit. Only semantic hits are timed.
    """

    def body(question: str) -> dict[str, Any]:
        return {"model": model, "messages": [SYSTEM, user(question)], "max_tokens": 16, "temperature": 0}

    async with httpx.AsyncClient(timeout=600) as client:
        for country in COUNTRIES:
            response = await client.post(
                url, json=body(f"What is the capital of {country}?"), headers={"cache-control": "no-cache"}
            )
            response.raise_for_status()
        for _ in range(100):  # stored in the background: wait until the last one is an exact hit
            response = await client.post(url, json=body(f"What is the capital of {COUNTRIES[-1]}?"))
            if response.headers.get("x-kvgate-cache") == "exact-hit":
                break
            await asyncio.sleep(0.1)

        async def hits(countries: list[str]) -> list[float]:
            times = []
            for country in countries:
                started = time.perf_counter()
                response = await client.post(url, json=body(f"Tell me the capital of {country}."))
                if response.headers.get("x-kvgate-cache") == "semantic-hit":
                    times.append(time.perf_counter() - started)
            if len(times) < len(countries) // 3:
                raise RuntimeError(f"only {len(times)} of {len(countries)} paraphrases were semantic hits")
            return times

        half = len(COUNTRIES) // 2
        idle = await hits(COUNTRIES[:half])
        busy_client = httpx.AsyncClient(timeout=600, headers=NO_CACHE)
        generations = [
            asyncio.create_task(chat(busy_client, url, model, [user(f"Write a long story about {t}.")], 256))
            for t in TOPICS[:8]
        ]
        await asyncio.sleep(3)  # all eight admitted and decoding
        busy = await hits(COUNTRIES[half:])
        still_running = sum(not task.done() for task in generations)
        for task in generations:
            task.cancel()
        await asyncio.gather(*generations, return_exceptions=True)
        await busy_client.aclose()
    return {
        "hit_p50_idle_ms": round(statistics.median(idle) * 1000, 1),
        "hit_p50_busy_ms": round(statistics.median(busy) * 1000, 1),
        "hit_busy_over_idle": round(statistics.median(busy) / statistics.median(idle), 2),
        "semantic_hits_timed": [len(idle), len(busy)],
        "generations_still_running": still_running,
    }


def user(text: str) -> dict[str, str]:
    return {"role": "user", "content": text}


def system_prompt(words: int, seed: int) -> str:
    """A long, varied system prompt; a different seed changes it from its first word (no shared prefix)."""
    import random

    rng = random.Random(seed)
    vocabulary = [
        "policy",
        "record",
        "customer",
        "order",
        "refund",
        "shipping",
        "region",
        "account",
        "invoice",
        "service",
        "level",
    ]
    sentences = [f"Reference {seed}-{rng.randrange(10**6)}."]
    while sum(len(s.split()) for s in sentences) < words:
        sentences.append(" ".join(rng.choice(vocabulary) for _ in range(11)).capitalize() + ".")
    return " ".join(sentences)


async def chat(
    client: httpx.AsyncClient, url: str, model: str, messages: list[dict[str, str]], max_tokens: int
) -> int:
    body = {"model": model, "messages": messages, "max_tokens": max_tokens, "temperature": 0}
    response = await client.post(url, json=body)
    response.raise_for_status()
    return int(response.json()["usage"]["completion_tokens"])


async def first_token_time(
    client: httpx.AsyncClient, url: str, model: str, system: str, question: str
) -> float:
    body = {
        "model": model,
        "messages": [{"role": "system", "content": system}, user(question)],
        "max_tokens": 4,
        "temperature": 0,
        "stream": True,
    }
    started = time.perf_counter()
    async with client.stream("POST", url, json=body) as response:
        response.raise_for_status()
        async for line in response.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            delta = json.loads(line[6:])["choices"][0].get("delta", {})
            if delta.get("content"):
                return time.perf_counter() - started
    raise RuntimeError("the stream ended without a token")


def run_engine_rss(weights: str, tree: Path = ROOT) -> dict[str, Any]:
    """The engine-alone RSS in a fresh process that imports kvgate from `tree` (this one, or a baseline)."""
    output = subprocess.run(
        [sys.executable, "-c", ENGINE_ALONE, weights],
        capture_output=True,
        text=True,
        check=True,
        env=os.environ | {"PYTHONPATH": str(tree)},
        cwd=tree,
    ).stdout
    return dict(json.loads(output.strip().splitlines()[-1]))


# Load the default model in one format, build the engine, answer once, trim the heap as the gateway does
# every 10 s; print the RSS then. Only calls every revision has (fp32 through load_model's old signature).
ENGINE_ALONE = """
import ctypes, json, os, sys
import torch
from engine.engine import build_engine
from engine.weights.loader import load_model
from engine.weights.model_files import DEFAULT_GENERATOR_NAME, resolve_generator
from engine.sampler import SamplingParams
from gateway.runtime.settings import Settings

weights = sys.argv[1]
torch.set_num_threads(1)
settings = Settings()
source = resolve_generator(DEFAULT_GENERATOR_NAME, settings.model_dir)
extra = {} if weights == "fp32" else {"weights": weights}
loaded = load_model(source, settings.model_dir, **extra)
engine = build_engine(loaded, "bench")
chat = [{"role": "user", "content": "Tell me about tides."}]
prompt = loaded.tokenizer.apply_chat_template(chat, add_generation_prompt=True, tokenize=True, return_dict=False)
engine.generate([prompt], SamplingParams(temperature=0.0, max_tokens=32))
ctypes.CDLL("libc.so.6").malloc_trim(0)
tensors = [*loaded.model.parameters(), *loaded.model.buffers()]
weight_mb = sum(t.numel() * t.element_size() for t in tensors) / 2**20
rss = next(int(l.split()[1]) for l in open("/proc/self/status") if l.startswith("VmRSS:")) / 1024
print(json.dumps({"weights": weights, "rss_mb": round(rss, 1), "weight_mb": round(weight_mb, 1)}))
"""


def baseline_rss(revision: str) -> dict[str, Any]:
    """fp32 engine-alone RSS of kvgate at a git revision (checked out into a temporary worktree)."""
    with tempfile.TemporaryDirectory(prefix="kvgate-baseline-") as folder:
        tree = Path(folder) / "tree"
        subprocess.run(
            ["git", "-C", str(ROOT), "worktree", "add", "--detach", str(tree), revision], check=True
        )
        try:
            return run_engine_rss("fp32", tree)
        finally:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(tree)], check=True)


def report(
    results: list[dict[str, Any]], engine_rss: dict[str, dict[str, Any]], side_by_side: list[dict[str, Any]]
) -> None:
    print(
        "\n## engine vs llama-server, same GGUF, loopback HTTP (bench/engine/bench_engine_vs_llama_cpp.py)\n"
    )
    for threads in sorted({r["threads"] for r in results}):
        rows = [r for r in results if r["threads"] == threads]
        peers = {r["server"]: r for r in rows}
        np1, np16 = peers["llama-server -np 1"], peers["llama-server -np 16"]
        print(f"threads {threads}\n")
        print("| | TTFT cold s | TTFT warm s | warm/cold | 16 concurrent tok/s | alone tok/s | RSS MB |")
        print("|---|---|---|---|---|---|---|")
        for r in rows:
            print(
                f"| {r['server']} | {r['ttft_cold_s']} | {r['ttft_warm_s']} | {r['ttft_warm_s'] / r['ttft_cold_s']:.3f} "
                f"| {r['concurrent16_tok_s']} | {r['alone_tok_s']} | {r['rss_mb']:.0f} |"
            )
        for r in rows:
            if r["server"].startswith("kvgate"):
                print(
                    f"\n{r['server']} (threads {threads}): alone / llama -np 1 = {r['alone_tok_s'] / np1['alone_tok_s']:.2f}, "
                    f"16 concurrent / llama -np 16 = {r['concurrent16_tok_s'] / np16['concurrent16_tok_s']:.2f}, "
                    f"cold TTFT / llama -np 1 = {r['ttft_cold_s'] / np1['ttft_cold_s']:.2f}, "
                    f"warm/cold = {r['ttft_warm_s'] / r['ttft_cold_s']:.3f}; semantic hit p50 idle "
                    f"{r['hit_p50_idle_ms']} ms, with 8 generations in flight {r['hit_p50_busy_ms']} ms "
                    f"({r['hit_busy_over_idle']}x); weights {json.dumps(r['weights'])}"
                )
        print()
    for pair in side_by_side:
        kvgate, llama = pair["kvgate int4"], pair["llama-server -np 1"]
        print(
            f"alone, side by side (both servers up, requests alternating, {len(pair['rounds']['kvgate int4'])} "
            f"rounds, median tok/s), threads {pair['threads']}: kvgate int4 {kvgate}, llama-server -np 1 {llama}: "
            f"{kvgate / llama:.2f}x\n"
        )
    print("engine alone (load, build, one answer; no gateway):", json.dumps(engine_rss))
    for name, figures in engine_rss.items():
        if name.startswith("fp32") and "int4" in engine_rss:
            print(f"int4 RSS / {name} RSS = {engine_rss['int4']['rss_mb'] / figures['rss_mb']:.2f}")


if __name__ == "__main__":
    main()
