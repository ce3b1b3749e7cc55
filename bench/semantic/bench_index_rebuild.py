"""A large scope's index rebuilds: blocking the event loop (as before) vs in the background, side by side.

    .venv/bin/python bench/semantic/bench_index_rebuild.py            # 200k vectors, ~5 min on 2 cores

A scope crossing the HNSW threshold, and a scope whose tombstones pass the ratio, both need every vector
copied into a new index. Run inline (`ScopeIndex.rebuild`, on the loop's thread) the loop stalls for
the whole build; run by `IndexSync` (snapshot, build on the builder thread, catch up, swap) lookups go
on. For each case this prints the inline stall, then the background rebuild's duration and, measured
meanwhile, the p50 / p99 / max latency of searches issued every 10 ms from the loop and its largest
scheduling lag. Random unit vectors (384-d), an empty store on a real Redis (db 15).
"""

from __future__ import annotations

import argparse
import asyncio
import secrets
import time
from collections.abc import Callable, Sequence

import numpy as np
import redis.asyncio as aioredis

from semantic.index.scope_index import ScopeIndex
from semantic.index.sync import IndexSync
from semantic.index.vector_index import IndexConfig, VectorIndex
from semantic.store.entries import RedisEntryStore

DIMENSION = 384
GOAL_LAG_MS = 1000.0  # a background rebuild must never hold the loop for a second


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--size", type=int, default=200_000, help="vectors in the scope")
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/15")
    args = parser.parse_args(argv)
    vectors = np.random.default_rng(0).standard_normal((args.size, DIMENSION), dtype=np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    config = IndexConfig(DIMENSION, hnsw_threshold=args.size // 2, tombstone_ratio=0.2)
    entry_ids = [f"e{row}" for row in range(args.size)]
    purged = entry_ids[: args.size // 4]

    VectorIndex(config)  # one OpenMP thread on this (the loop's) thread, as in the gateway
    scope = ScopeIndex(config)
    scope.add(entry_ids, vectors)
    inline_convert = timed(scope.rebuild)
    scope.remove(purged)
    inline_compact = timed(scope.rebuild)
    del scope

    background = asyncio.run(run_background(args, config, entry_ids, vectors, purged))
    print(f"\n{args.size:,} vectors, 384-d; HNSW threshold {config.hnsw_threshold:,}; 25% purged")
    header = f"{'case':<22}{'inline stall s':>16}{'background s':>14}{'search p50/p99/max ms':>26}{'max lag ms':>12}"
    print(header)
    failed = []
    for name, stall in (("flat -> HNSW", inline_convert), ("drop tombstones", inline_compact)):
        took, latencies, lag = background[name]
        spread = f"{percentile(latencies, 0.5):.1f}/{percentile(latencies, 0.99):.1f}/{max(latencies):.1f}"
        print(f"{name:<22}{stall:>16.1f}{took:>14.1f}{spread:>26}{lag:>12.0f}")
        print(f"{'':<22}longest loop stall, background / inline = {lag / 1000 / stall:.4f}")
        if lag > GOAL_LAG_MS:
            failed.append(name)
    if failed:
        raise RuntimeError(f"a background rebuild held the loop for more than {GOAL_LAG_MS:.0f} ms: {failed}")
    return 0


async def run_background(
    args: argparse.Namespace,
    config: IndexConfig,
    entry_ids: list[str],
    vectors: np.ndarray,
    purged: list[str],
) -> dict[str, tuple[float, list[float], float]]:
    client = aioredis.Redis.from_url(args.redis_url)
    sync = IndexSync(RedisEntryStore(client, prefix=f"kvgate:bench:{secrets.token_hex(4)}"), config)
    results: dict[str, tuple[float, list[float], float]] = {}
    try:
        await sync.start()
        for entry_id, vector in zip(entry_ids, vectors, strict=True):  # as the cache's inserts do
            sync.add_local("scope", entry_id, vector, None)
        results["flat -> HNSW"] = await while_rebuilding(sync, vectors)
        sync.remove_local("scope", purged)
        results["drop tombstones"] = await while_rebuilding(sync, vectors)
        assert sync.index.scope_kind("scope") == "hnsw"
    finally:
        await sync.stop()
        await client.aclose()
    return results


async def while_rebuilding(sync: IndexSync, vectors: np.ndarray) -> tuple[float, list[float], float]:
    """Search every 10 ms until the scope rebuild in flight ends: (seconds, search ms, max lag ms)."""
    started = time.perf_counter()
    latencies: list[float] = []
    lag = 0.0
    rebuild = asyncio.ensure_future(sync.settle())
    row = 0
    while not rebuild.done():
        asked = time.perf_counter()
        sync.index.search("scope", vectors[row % len(vectors)], 4)
        latencies.append((time.perf_counter() - asked) * 1000)
        row += 7919
        slept = time.perf_counter()
        await asyncio.sleep(0.01)
        lag = max(lag, (time.perf_counter() - slept - 0.01) * 1000)
    await rebuild
    return time.perf_counter() - started, latencies, lag


def timed(work: Callable[[], object]) -> float:
    started = time.perf_counter()
    work()
    return time.perf_counter() - started


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(fraction * (len(ordered) - 1)))]


if __name__ == "__main__":
    raise SystemExit(main())
