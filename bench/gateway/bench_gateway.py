"""End-to-end latency and throughput through HTTP: exact hits, semantic hits and misses, 1 and 32 clients.

Runs the real app (SmolLM2 engine, MiniLM embedder, embedded store) behind a real uvicorn server on
loopback, and drives it with httpx. Misses use distinct prompts; exact hits repeat stored prompts;
semantic hits send paraphrases of stored prompts (checked: only requests the gateway answered as
`semantic-hit` are counted in that class). Prints p50 / p99 latency and requests/s per class.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from gateway.http.app import create_app  # noqa: E402
from gateway.runtime.settings import Settings  # noqa: E402
from tests.gateway.live_server import serve  # noqa: E402

MODEL = "smollm2-135m-instruct"
TOPICS = [
    "the capital of France",
    "photosynthesis",
    "the speed of light",
    "black holes",
    "the French Revolution",
    "machine learning",
    "the water cycle",
    "volcanoes",
    "the Roman Empire",
    "quantum computing",
    "the human heart",
    "climate change",
    "the stock market",
    "DNA replication",
    "the moon landing",
    "plate tectonics",
    "the printing press",
    "vaccines",
    "the Great Wall of China",
    "electric cars",
    "honey bees",
    "the Olympic Games",
    "the Internet",
    "coral reefs",
    "the Renaissance",
    "jet engines",
    "the immune system",
    "rainbows",
    "chess openings",
    "the Amazon rainforest",
    "nuclear fusion",
    "tides",
]


def question(topic: str) -> str:
    return f"Can you explain {topic} in simple terms?"


def paraphrase(topic: str) -> str:
    return f"Could you explain {topic} in simple terms?"


def body(content: str, max_tokens: int) -> dict[str, Any]:
    return {
        "model": MODEL,
        "messages": [{"role": "user", "content": content}],
        "max_tokens": max_tokens,
        "temperature": 0,
    }


async def run_class(
    client: httpx.AsyncClient, prompts: list[str], concurrency: int, max_tokens: int, expect: str
) -> dict[str, float]:
    latencies: list[float] = []
    results: dict[str, int] = {}
    queue: asyncio.Queue[str] = asyncio.Queue()
    for prompt in prompts:
        queue.put_nowait(prompt)

    async def worker() -> None:
        while not queue.empty():
            prompt = queue.get_nowait()
            started = time.perf_counter()
            response = await client.post("/v1/chat/completions", json=body(prompt, max_tokens))
            elapsed = time.perf_counter() - started
            cache = response.headers.get("x-kvgate-cache", f"status-{response.status_code}")
            results[cache] = results.get(cache, 0) + 1
            if cache == expect:
                latencies.append(elapsed)

    started = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    wall = time.perf_counter() - started
    latencies.sort()
    return {
        "n": len(latencies),
        "p50_ms": 1000 * statistics.median(latencies) if latencies else float("nan"),
        "p99_ms": 1000 * latencies[min(len(latencies) - 1, int(0.99 * len(latencies)))]
        if latencies
        else float("nan"),
        "rps": len(latencies) / wall if wall else 0.0,
        "other": sum(count for cache, count in results.items() if cache != expect),
    }


async def measure(
    base_url: str, hits_per_class: int, misses: int, max_tokens: int
) -> list[tuple[str, int, dict[str, float]]]:
    rows = []
    async with httpx.AsyncClient(base_url=base_url, timeout=300) as client:
        for round_index, concurrency in enumerate((1, 32)):
            # Each round gets topics of its own, so its misses are not semantic hits on the last round's.
            topics = TOPICS[round_index * misses : (round_index + 1) * misses]
            miss_prompts = [question(topic) for topic in topics]
            rows.append(
                (
                    "miss",
                    concurrency,
                    await run_class(client, miss_prompts, min(concurrency, misses), max_tokens, "miss"),
                )
            )
            exact = [miss_prompts[index % len(miss_prompts)] for index in range(hits_per_class)]
            rows.append(
                (
                    "exact-hit",
                    concurrency,
                    await run_class(client, exact, concurrency, max_tokens, "exact-hit"),
                )
            )
            para = [paraphrase(topic) for topic in topics]
            semantic = [para[index % len(para)] for index in range(hits_per_class)]
            # A semantic hit stores nothing, so a repeated paraphrase is a semantic lookup again.
            rows.append(
                (
                    "semantic-hit",
                    concurrency,
                    await run_class(client, semantic, concurrency, max_tokens, "semantic-hit"),
                )
            )
    return rows


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--hits", type=int, default=320, help="requests per hit class and concurrency")
    parser.add_argument(
        "--misses", type=int, default=16, help="distinct miss prompts per concurrency (<= 16)"
    )
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--target", type=float, default=0.2, help="the semantic rule's false-hit target")
    args = parser.parse_args(argv)
    # Short answers (max_tokens) end with "length"; they are stored by default, so repeats hit. A loose
    # semantic target so that the paraphrases hit (the verifier then runs on every semantic lookup).
    settings = Settings(
        data_dir=Path(tempfile.mkdtemp(prefix="kvgate-bench-")),
        max_pending=256,
        target_false_hit_rate=args.target,
    )
    with serve(create_app(settings)) as base_url:
        rows = asyncio.run(measure(base_url, args.hits, args.misses, args.max_tokens))
    print(f"{'class':<13} {'clients':>7} {'n':>5} {'p50 ms':>9} {'p99 ms':>9} {'req/s':>8} {'other':>6}")
    for name, concurrency, row in rows:
        print(
            f"{name:<13} {concurrency:>7} {row['n']:>5.0f} {row['p50_ms']:>9.1f} {row['p99_ms']:>9.1f} "
            f"{row['rps']:>8.1f} {row['other']:>6.0f}"
        )
    print("(other: requests of that batch answered by another layer than the class measured)")


if __name__ == "__main__":
    main()
