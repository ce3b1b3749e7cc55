"""Semantic cache lookups, kvgate vs GPTCache, side by side in one run on the same entries.

    .venv/bin/python bench/semantic/bench_semantic.py                      # 10k entries, ~3-4 min on 2 cores
    .venv/bin/python bench/semantic/bench_semantic.py --filler 1000000 --no-gptcache   # 1M entries in the scope

Both caches get the same MiniLM embedder object (one torch thread: see --torch-threads), FAISS, the
same stored prompts and vectors, and an equivalent cosine threshold (GPTCache's similarity_threshold
t on squared L2 over unit vectors is cosine >= 2t - 1). kvgate runs on a real Redis; GPTCache on
sqlite + its FAISS store, in-process. Prints p50/p99 lookup latency per class (exact hit, semantic
hit, miss) at concurrency 1, then hit throughput at concurrency 1 and 32 (GPTCache is synchronous:
its concurrent callers are threads, as in a threaded server), and the ratios.

`--filler N` adds N random unit vectors (not real embeddings: fast to build, far from every query)
to the same scope, so the index is N + entries large; past 100k kvgate's scope switches to HNSW.
Writing 1M entries takes ~20 min: `--prefix P --keep` leaves them in Redis, and a later run with the
same `--prefix` (and sizes) reuses them and measures only the start-up rebuild and the lookups.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import random
import secrets
import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from semantic.cache import CacheConfig, LookupKind, SemanticCache
from semantic.embedding.embedder import SentenceEmbedder
from semantic.embedding.embedder_source import DEFAULT_EMBEDDER_NAME, resolve_embedder
from semantic.rule.threshold import CosineThresholdRule
from semantic.store.entries import RedisEntryStore
from semantic.store.scope import RequestScope, build_scope

ACTIONS = ["reset", "change", "recover", "update", "delete", "export", "back up", "verify", "share", "lock"]
ACTIONS += ["unlock", "sync", "rename", "restore", "encrypt", "transfer", "archive", "print", "scan", "link"]
THINGS = ["password", "email address", "phone number", "profile photo", "billing address", "username"]
THINGS += ["credit card", "calendar", "contacts", "photos", "documents", "notes", "playlists", "bookmarks"]
THINGS += ["messages", "wallet", "two-factor codes", "subscription", "invoices", "shipping address"]
THINGS += ["voicemail", "browser history", "saved passwords", "home screen", "family plan"]
PLACES = ["Android", "an iPhone", "Windows 11", "a Mac", "Linux", "a Chromebook", "the web app", "an iPad"]
PLACES += ["a smart TV", "the desktop app", "a work laptop", "a Pixel", "a Galaxy phone", "Ubuntu"]
PLACES += ["the beta app", "a Kindle", "an Apple Watch", "a shared computer", "the admin console", "Firefox"]
MISSES = ["Write a haiku about {}.", "What is the melting point of {}?", "Translate '{}' into Italian."]
MISS_WORDS = ["autumn rain", "copper", "tungsten", "a red fox", "the open sea", "good morning", "volcanoes"]
MISS_WORDS += ["glaciers", "old lighthouses", "sourdough bread", "the night sky", "tin", "river stones"]
COSINE = 0.8
TTL_S = 24 * 3600.0  # long enough for a `--keep` fill to be reused the next day


@dataclass(frozen=True, slots=True)
class Workload:
    stored: list[str]  # prompts in the cache
    exact: list[str]  # stored prompts asked again
    paraphrases: list[str]  # a rewording of a stored prompt
    misses: list[str]  # unrelated prompts


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--entries", type=int, default=10_000, help="stored prompts (real embeddings)")
    parser.add_argument("--filler", type=int, default=0, help="extra random unit vectors in the same scope")
    parser.add_argument("--queries", type=int, default=200, help="lookups per latency class")
    parser.add_argument("--throughput-queries", type=int, default=256, help="lookups per throughput run")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 32])
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/15")
    parser.add_argument("--torch-threads", type=int, default=1, help="intra-op threads (1 on a shared box)")
    parser.add_argument("--no-gptcache", action="store_true")
    parser.add_argument("--prefix", help="Redis key prefix (default: a fresh random one); reused if filled")
    parser.add_argument("--keep", action="store_true", help="leave the entries in Redis for a later run")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)

    import torch

    torch.set_num_threads(args.torch_threads)
    started = time.perf_counter()
    embedder = SentenceEmbedder(resolve_embedder(DEFAULT_EMBEDDER_NAME))
    workload = make_workload(args.entries, args.queries, random.Random(args.seed))
    vectors = stored_vectors(
        embedder, workload, Path(tempfile.gettempdir()) / f"kvgate-bench-{args.seed}.npz"
    )
    filler = random_unit_vectors(args.filler, embedder.dimension, args.seed)
    print(f"setup {time.perf_counter() - started:.0f} s", flush=True)

    results: dict[str, dict[str, Any]] = {}
    results["kvgate"] = asyncio.run(run_kvgate(args, embedder, workload, vectors, filler))
    if not args.no_gptcache:
        results["gptcache"] = run_gptcache(args, embedder, workload, vectors, filler)
    report(args, results)
    print(f"total {time.perf_counter() - started:.0f} s")
    return 0


def make_workload(entries: int, queries: int, rng: random.Random) -> Workload:
    combos = list(itertools.product(ACTIONS, THINGS, PLACES))
    if entries > len(combos):
        raise SystemExit(f"--entries at most {len(combos)}")
    rng.shuffle(combos)
    stored = [f"How do I {action} my {thing} on {place}?" for action, thing, place in combos[:entries]]
    asked = rng.sample(range(entries), min(queries, entries))
    paraphrases = [
        "How can I {} my {} on {}?".format(*combos[row])
        if row % 2
        else "Steps to {} my {} on {}".format(*combos[row])
        for row in asked
    ]
    misses = [template.format(word) for template, word in itertools.product(MISSES, MISS_WORDS)]
    return Workload(stored, [stored[row] for row in asked], paraphrases, (misses * queries)[:queries])


def stored_vectors(embedder: SentenceEmbedder, workload: Workload, saved: Path) -> np.ndarray:
    """MiniLM vectors of the stored prompts, (entries, 384); kept on disk so a rerun skips this step."""
    if saved.exists():
        with np.load(saved) as archive:
            if list(archive["prompts"]) == workload.stored:
                return np.asarray(archive["vectors"], dtype=np.float32)
    print(f"embedding {len(workload.stored)} stored prompts ...", flush=True)
    vectors = embedder.embed(workload.stored)
    np.savez(saved, prompts=np.asarray(workload.stored), vectors=vectors)
    return vectors


def random_unit_vectors(count: int, dimension: int, seed: int) -> np.ndarray:
    vectors = np.random.default_rng(seed).standard_normal((count, dimension), dtype=np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    return vectors


# --- kvgate -------------------------------------------------------------------------------------


def kvgate_scope(prompt: str, embedder: SentenceEmbedder) -> RequestScope:
    body = {"model": "bench", "messages": [{"role": "user", "content": prompt}], "temperature": 0}
    return build_scope(body, tenant="bench", embedder=embedder.name)


async def run_kvgate(
    args: argparse.Namespace,
    embedder: SentenceEmbedder,
    workload: Workload,
    vectors: np.ndarray,
    filler: np.ndarray,
) -> dict[str, Any]:
    import redis.asyncio as aioredis

    client = aioredis.Redis.from_url(args.redis_url)
    prefix = args.prefix or f"kvgate:bench:{secrets.token_hex(4)}"
    store = RedisEntryStore(client, prefix=prefix)
    cache = SemanticCache(store, embedder, CosineThresholdRule(COSINE), CacheConfig(default_ttl_s=TTL_S))
    scope_id = kvgate_scope(workload.stored[0], embedder).scope_id
    try:
        started = time.perf_counter()
        stored = list(zip(workload.stored, vectors, strict=True))
        stored += [(f"filler {row}", vector) for row, vector in enumerate(filler)]
        if await store.scope_size(scope_id) >= len(stored):
            print(f"kvgate: reusing the {len(stored)} entries under {prefix}", flush=True)
        else:
            print(f"kvgate: storing {len(stored)} entries in Redis under {prefix} ...", flush=True)
            limit = asyncio.Semaphore(64)

            async def put(prompt: str, vector: np.ndarray) -> None:
                async with limit:
                    await store.put(kvgate_scope(prompt, embedder), "{}", vector, TTL_S, ())

            for start in range(0, len(stored), 5000):
                await asyncio.gather(
                    *(put(prompt, vector) for prompt, vector in stored[start : start + 5000])
                )
        write_s = time.perf_counter() - started
        started = time.perf_counter()
        indexed = await cache.start()
        rebuild_s = time.perf_counter() - started
        print(
            f"kvgate: wrote in {write_s:.1f} s, rebuilt {indexed} vectors in {rebuild_s:.1f} s "
            f"({cache.sync.index.scope_kind(scope_id)})",
            flush=True,
        )

        async def lookup(prompt: str) -> str:
            return str((await cache.lookup(kvgate_scope(prompt, embedder))).kind)

        result = await measure_async(lookup, workload, args)
        result["setup"] = f"write {write_s:.1f} s, rebuild {rebuild_s:.1f} s"
        return result
    finally:
        await cache.stop()
        if not args.keep:
            keys = [key async for key in client.scan_iter(match=f"{prefix}:*", count=5000)]
            for start in range(0, len(keys), 1000):
                await client.delete(*keys[start : start + 1000])
        await client.aclose()


async def measure_async(
    lookup: Callable[[str], Awaitable[str]], workload: Workload, args: Any
) -> dict[str, Any]:
    for prompt in workload.paraphrases[:5] + workload.misses[:5]:  # warm up
        await lookup(prompt)
    result: dict[str, Any] = {}
    for name, prompts, expected in classes(workload):
        latencies, kinds = [], []
        for prompt in prompts:
            started = time.perf_counter()
            kinds.append(await lookup(prompt))
            latencies.append((time.perf_counter() - started) * 1000)
        result[name] = (latencies, share(kinds, expected))
    for name, prompts in (("exact hits", workload.exact), ("semantic hits", workload.paraphrases)):
        for concurrency in args.concurrency:
            batch = (prompts * (args.throughput_queries // len(prompts) + 1))[: args.throughput_queries]
            queue = list(batch)

            async def worker(queue: list[str] = queue) -> None:
                while queue:
                    await lookup(queue.pop())

            started = time.perf_counter()
            await asyncio.gather(*(worker() for _ in range(concurrency)))
            result[f"{name} x{concurrency}"] = len(batch) / (time.perf_counter() - started)
    return result


# --- GPTCache -----------------------------------------------------------------------------------


def run_gptcache(
    args: argparse.Namespace,
    embedder: SentenceEmbedder,
    workload: Workload,
    vectors: np.ndarray,
    filler: np.ndarray,
) -> dict[str, Any]:
    from gptcache import Cache, Config
    from gptcache.adapter.api import get
    from gptcache.manager import CacheBase, VectorBase, get_data_manager
    from gptcache.processor.pre import get_prompt
    from gptcache.similarity_evaluation.distance import SearchDistanceEvaluation

    folder = tempfile.mkdtemp(prefix="gptcache-bench-")
    precomputed = dict(zip(workload.stored, vectors, strict=True))
    precomputed.update((f"filler {row}", vector) for row, vector in enumerate(filler))
    loading = True

    def embedding_func(text: str, **_: Any) -> np.ndarray:
        # Import uses the vectors computed once for both caches; every lookup runs MiniLM.
        return precomputed[text] if loading else embedder.embed([text])[0]

    cache = Cache()
    data_manager = get_data_manager(
        # GPTCache writes last_access on every hit; at 32 threads sqlite's default 5 s lock wait runs out.
        CacheBase("sqlite", sql_url=f"sqlite:///{folder}/cache.db?timeout=120"),
        VectorBase("faiss", dimension=embedder.dimension, index_path=f"{folder}/faiss.index", top_k=1),
        max_size=len(precomputed) + 1000,  # its default, 1000, would evict most of the entries on import
    )
    cache.init(
        pre_embedding_func=get_prompt,
        embedding_func=embedding_func,
        data_manager=data_manager,
        similarity_evaluation=SearchDistanceEvaluation(),
        config=Config(similarity_threshold=(COSINE + 1) / 2),  # cosine >= 2t - 1 on unit vectors
    )
    print(f"gptcache: importing {len(precomputed)} entries ...", flush=True)
    started = time.perf_counter()
    prompts = list(precomputed)
    for start in range(0, len(prompts), 10_000):
        chunk = prompts[start : start + 10_000]
        cache.import_data(chunk, ["{}"] * len(chunk))
    import_s = time.perf_counter() - started
    loading = False

    def lookup(prompt: str) -> str:
        return "hit" if get(prompt, cache_obj=cache) is not None else "miss"

    result = asyncio.run(measure_sync(lookup, workload, args))
    result["setup"] = f"import {import_s:.1f} s"
    return result


async def measure_sync(lookup: Callable[[str], str], workload: Workload, args: Any) -> dict[str, Any]:
    for prompt in workload.paraphrases[:5] + workload.misses[:5]:
        lookup(prompt)
    result: dict[str, Any] = {}
    for name, prompts, expected in classes(workload):
        latencies, kinds = [], []
        for prompt in prompts:
            started = time.perf_counter()
            kinds.append(lookup(prompt))
            latencies.append((time.perf_counter() - started) * 1000)
        result[name] = (latencies, share(kinds, expected))
    for name, prompts in (("exact hits", workload.exact), ("semantic hits", workload.paraphrases)):
        for concurrency in args.concurrency:
            batch = (prompts * (args.throughput_queries // len(prompts) + 1))[: args.throughput_queries]
            started = time.perf_counter()
            with ThreadPoolExecutor(max_workers=concurrency) as pool:
                list(pool.map(lookup, batch))
            result[f"{name} x{concurrency}"] = len(batch) / (time.perf_counter() - started)
    return result


# --- report -------------------------------------------------------------------------------------


def classes(workload: Workload) -> list[tuple[str, list[str], str]]:
    return [
        ("exact hit", workload.exact, "hit"),
        ("semantic hit", workload.paraphrases, "hit"),
        ("miss", workload.misses, "miss"),
    ]


def share(kinds: list[str], expected: str) -> float:
    """Share of lookups whose outcome was the class's (kvgate kinds fold to hit / miss)."""
    folded = [
        "hit" if kind in ("hit", LookupKind.EXACT_HIT, LookupKind.SEMANTIC_HIT) else "miss" for kind in kinds
    ]
    return folded.count(expected) / len(folded)


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(fraction * (len(ordered) - 1)))]


def report(args: argparse.Namespace, results: dict[str, dict[str, Any]]) -> None:
    systems = list(results)
    print(
        f"\nentries: {args.entries} real + {args.filler} filler in one scope; {args.queries} lookups per class"
    )
    for system in systems:
        print(f"{system} setup: {results[system]['setup']}")
    print(
        f"\n{'latency (ms), concurrency 1':<30}"
        + "".join(f"{s + ' p50':>14}{s + ' p99':>14}" for s in systems)
    )
    for name in ("exact hit", "semantic hit", "miss"):
        row = f"{name:<30}"
        for system in systems:
            latencies, _ = results[system][name]
            row += f"{percentile(latencies, 0.5):>14.2f}{percentile(latencies, 0.99):>14.2f}"
        print(row)
    print(
        f"{'outcome as expected (share)':<30}"
        + "".join(
            f"{'/'.join(f'{results[s][n][1]:.2f}' for n in ('exact hit', 'semantic hit', 'miss')):>28}"
            for s in systems
        )
    )
    print(f"\n{'hit throughput (lookups/s)':<30}" + "".join(f"{s:>14}" for s in systems) + f"{'ratio':>10}")
    for name in ("exact hits", "semantic hits"):
        for concurrency in args.concurrency:
            key = f"{name} x{concurrency}"
            values = [results[s][key] for s in systems]
            ratio = f"{values[0] / values[1]:>9.1f}x" if len(values) == 2 else ""
            print(f"{key:<30}" + "".join(f"{value:>14.1f}" for value in values) + ratio)
    if len(systems) == 2:
        for name in ("exact hit", "semantic hit", "miss"):
            ours = statistics.median(results["kvgate"][name][0])
            theirs = statistics.median(results["gptcache"][name][0])
            print(f"p50 {name}: kvgate / gptcache = {ours / theirs:.2f}")


if __name__ == "__main__":
    raise SystemExit(main())
