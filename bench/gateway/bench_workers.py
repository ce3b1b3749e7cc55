"""`kvgate serve --workers 2` next to `--workers 1`, measured side by side in one run (default settings).

    .venv/bin/python bench/gateway/bench_workers.py              # both parts, ~6 minutes on 2 cores
    .venv/bin/python bench/gateway/bench_workers.py --part hits  # only the hit path

Hits (reverse-proxy mode over an instant local upstream, so only the cache path runs; embedded store):
exact and semantic hits/s with `wrk -t1 -c32` (a fresh case variant of a stored prompt per semantic
request), p50 / p99 of both, and the resident memory of every process.

Engine (engine mode, the default SmolLM2): TTFT of a ~1,000-token shared system prompt sent cold through
worker 0 and then, with another question, warm through worker 1 (a connection pinned to a worker by its
`/healthz`); greedy answers to the same prompts under both; tokens/s of 16 concurrent generations; p50 of
semantic hits idle and with 8 long generations in flight.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.gateway.bench_hit_path import FRAMES, SUBJECTS, fill, sequential, variant_prompts, wrk  # noqa: E402
from bench.gateway.wrk_scripts import fixed_body_script, variant_script  # noqa: E402
from tests.gateway.upstream_server import upstream_process  # noqa: E402
from tests.integration.workers_cluster import Cluster  # noqa: E402

ENGINE_MODEL = "smollm2-135m-instruct"
UPSTREAM_MODEL = "up-small"
PATH = "/v1/chat/completions"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--part", choices=("all", "hits", "engine"), default="all")
    parser.add_argument("--seconds", type=int, default=10, help="wrk duration per throughput row")
    parser.add_argument("--requests", type=int, default=200, help="sequential requests per latency row")
    args = parser.parse_args(argv)
    results: dict[str, dict[str, Any]] = {}
    if args.part in ("all", "hits"):
        with upstream_process() as upstream:
            for workers in (1, 2):
                results[f"hits, --workers {workers}"] = measure_hits(workers, upstream, args)
    if args.part in ("all", "engine"):
        for workers in (1, 2):
            results[f"engine, --workers {workers}"] = measure_engine(workers, args)
    report(results)
    return 0


def measure_hits(workers: int, upstream: str, args: argparse.Namespace) -> dict[str, Any]:
    prompts = [frame.format(subject) for subject in SUBJECTS for frame in FRAMES]
    cluster = Cluster(workers, env={"KVGATE_UPSTREAM_URL": f"{upstream}/v1"}).start()
    folder = Path(tempfile.mkdtemp(prefix="kvgate-workers-"))
    try:
        url = cluster.base + PATH
        fill(url, [_chat(prompt, UPSTREAM_MODEL) for prompt in prompts], "x-kvgate-cache", "bypass")
        result: dict[str, Any] = {
            "exact 1": sequential(
                url, [_chat(prompts[i % 32], UPSTREAM_MODEL) for i in range(args.requests)]
            ),
            "semantic 1": sequential(
                url,
                [_chat(text, UPSTREAM_MODEL) for text in variant_prompts(prompts, args.requests, False)],
                "semantic-hit",
            ),
        }
        body = _chat(prompts[0], UPSTREAM_MODEL)
        result["exact 32"] = wrk(fixed_body_script(folder, PATH, body, "kvgate"), cluster.base, args)
        script = variant_script(folder, PATH, prompts, "kvgate", UPSTREAM_MODEL, False, seed=7)
        result["semantic 32"] = wrk(script, cluster.base, args)
        result["rss_mb"] = cluster.rss_mb()
    finally:
        cluster.stop()
    print(json.dumps({f"hits {workers}": result}), flush=True)
    return result


def measure_engine(workers: int, args: argparse.Namespace) -> dict[str, Any]:
    cluster = Cluster(workers).start()
    result: dict[str, Any] = {}
    try:
        with cluster.pinned(0) as first, cluster.pinned(1 if workers > 1 else 0) as second:
            system = _long_system_prompt(random.Random(11))
            cold_s, cold_usage = _ttft(first, system, "Which of these rules matters most?")
            warm_s, warm_usage = _ttft(second, system, "Which of these rules is the shortest?")
            result["ttft_cold_s"], result["ttft_warm_s"] = cold_s, warm_s
            result["prompt_tokens"], result["warm_cached_tokens"] = (
                cold_usage["prompt_tokens"],
                warm_usage["prompt_tokens_details"]["cached_tokens"],
            )
            result["greedy"] = [
                first.post(PATH, json=_chat(question, ENGINE_MODEL, max_tokens=32), headers=_NO_CACHE).json()[
                    "choices"
                ][0]["message"]["content"]
                for question in GREEDY_QUESTIONS
            ]
            stored = [f"Tell me one fact about {subject}." for subject in SUBJECTS[:8]]
            for text in stored:
                first.post(PATH, json=_chat(text, ENGINE_MODEL, max_tokens=8)).raise_for_status()
            variants = [_variant(text, seed) for seed in range(40) for text in stored[:1]]
            result["hit idle"] = _hit_latencies(first, variants)
            result["concurrent 16"] = _concurrent(cluster.base, 16, 64)
            result["identical 8"] = _identical(cluster.base, first, 8)
            busy = threading.Thread(target=_concurrent, args=(cluster.base, 8, 256, "busy"))
            busy.start()
            time.sleep(3)  # the 8 generations are admitted and decoding
            result["hit busy"] = _hit_latencies(
                first, [_variant(text, 100 + seed) for seed in range(40) for text in stored[1:2]]
            )
            busy.join()
        result["rss_mb"] = cluster.rss_mb()
    finally:
        cluster.stop()
    print(json.dumps({f"engine {workers}": result}), flush=True)
    return result


GREEDY_QUESTIONS = [
    "What is the capital of France?",
    "Write a haiku about autumn.",
    "List three prime numbers.",
    "Explain what a CPU does in one sentence.",
]
_NO_CACHE = {"cache-control": "no-store, no-cache"}


def _chat(text: str, model: str, **fields: Any) -> dict[str, Any]:
    return {"model": model, "messages": [{"role": "user", "content": text}], "temperature": 0} | fields


def _long_system_prompt(rng: random.Random) -> str:
    words = [word for subject in SUBJECTS for word in subject.split()]
    rules = [f"Rule {n}: " + " ".join(rng.choice(words) for _ in range(14)) + "." for n in range(60)]
    return "You follow these house rules. " + " ".join(rules)


def _ttft(client: httpx.Client, system: str, question: str) -> tuple[float, dict[str, Any]]:
    body = {
        "model": ENGINE_MODEL,
        "messages": [{"role": "system", "content": system}, {"role": "user", "content": question}],
        "temperature": 0,
        "max_tokens": 8,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    started = time.perf_counter()
    first: float | None = None
    usage: dict[str, Any] = {}
    with client.stream("POST", PATH, json=body, headers=_NO_CACHE) as response:
        for line in response.iter_lines():
            if not line.startswith("data: {"):
                continue
            chunk = json.loads(line[6:])
            if first is None and chunk["choices"] and chunk["choices"][0]["delta"].get("content"):
                first = time.perf_counter() - started
            usage = chunk.get("usage") or usage
    assert first is not None, "no content streamed"
    return first, usage


def _variant(text: str, seed: int) -> str:
    rng = random.Random(seed)
    return "".join(char.swapcase() if char.isalpha() and rng.random() < 0.3 else char for char in text)


def _hit_latencies(client: httpx.Client, texts: list[str]) -> dict[str, Any]:
    timings, kinds = [], {}
    for text in dict.fromkeys(texts):
        started = time.perf_counter()
        response = client.post(PATH, json=_chat(text, ENGINE_MODEL, max_tokens=8))
        elapsed = (time.perf_counter() - started) * 1000
        kind = response.headers.get("x-kvgate-cache", str(response.status_code))
        kinds[kind] = kinds.get(kind, 0) + 1
        if kind == "semantic-hit":
            timings.append(elapsed)
    return {"p50_ms": statistics.median(timings) if timings else float("nan"), "kinds": kinds}


def _concurrent(base: str, count: int, max_tokens: int, label: str = "run") -> dict[str, Any]:
    tokens: list[int] = []

    def one(index: int) -> None:
        body = _chat(
            f"Write a long story about {SUBJECTS[index % len(SUBJECTS)]}, {label} {index}.", ENGINE_MODEL
        )
        with httpx.Client(base_url=base, timeout=600) as client:
            response = client.post(PATH, json=body | {"max_tokens": max_tokens}, headers=_NO_CACHE)
            tokens.append(response.json()["usage"]["completion_tokens"])

    elapsed = _at_once([threading.Thread(target=one, args=(index,)) for index in range(count)])
    return {"tokens": sum(tokens), "seconds": elapsed, "tok_s": sum(tokens) / elapsed}


def _identical(base: str, observer: httpx.Client, count: int) -> dict[str, Any]:
    """`count` identical misses at once on fresh connections: how many generations the engine ran."""

    def generations() -> float:
        scrape = observer.get("/metrics").text
        return sum(
            float(line.rsplit(" ", 1)[1])
            for line in scrape.splitlines()
            if line.startswith("kvgate_engine_request_success_total")
        )

    before = generations()
    body = _chat("Describe a sunrise over the sea in five sentences.", ENGINE_MODEL, max_tokens=64)
    answers: list[str] = []

    def one() -> None:
        with httpx.Client(base_url=base, timeout=600) as client:
            answers.append(client.post(PATH, json=body).headers.get("x-kvgate-cache", "?"))

    elapsed = _at_once([threading.Thread(target=one) for _ in range(count)])
    return {"generations": generations() - before, "seconds": elapsed, "kinds": sorted(answers)}


def _at_once(threads: list[threading.Thread]) -> float:
    """Start every thread, wait for all; the seconds it took."""
    started = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return time.perf_counter() - started


def report(results: dict[str, dict[str, Any]]) -> None:
    print("\n## kvgate serve --workers (bench/gateway/bench_workers.py)\n")
    one, two = results.get("hits, --workers 1"), results.get("hits, --workers 2")
    if one and two:
        print("| hits (reverse-proxy mode, instant upstream) | --workers 1 | --workers 2 | ratio |")
        print("|---|---|---|---|")
        for label, key, kind in (
            ("exact", "exact 32", "exact-hit"),
            ("semantic", "semantic 32", "semantic-hit"),
        ):
            rate1, rate2 = _rate(one[key], kind), _rate(two[key], kind)
            print(f"| {label} hits/s, wrk -c32 | {rate1:,.0f} | {rate2:,.0f} | {rate2 / rate1:.2f}x |")
            print(
                f"| {label} p99 ms, wrk -c32 | {one[key]['p99_ms']:.1f} | {two[key]['p99_ms']:.1f} | {two[key]['p99_ms'] / one[key]['p99_ms']:.2f} |"
            )
        for label, key in (("exact", "exact 1"), ("semantic", "semantic 1")):
            print(
                f"| {label} hit p50 / p99 ms, 1 client | {one[key]['p50_ms']:.2f} / {one[key]['p99_ms']:.2f} | {two[key]['p50_ms']:.2f} / {two[key]['p99_ms']:.2f} | |"
            )
        print(f"| RSS MB | {_rss(one['rss_mb'])} | {_rss(two['rss_mb'])} | |")
    one, two = results.get("engine, --workers 1"), results.get("engine, --workers 2")
    if one and two:
        print("\n| engine mode | --workers 1 | --workers 2 | ratio |")
        print("|---|---|---|---|")
        for row in (one, two):
            row["ttft_ratio"] = row["ttft_warm_s"] / row["ttft_cold_s"]
        print(
            f"| TTFT cold / warm s ({one['prompt_tokens']}-token prompt; warm through the other worker) | {one['ttft_cold_s']:.2f} / {one['ttft_warm_s']:.3f} | {two['ttft_cold_s']:.2f} / {two['ttft_warm_s']:.3f} | |"
        )
        print(f"| TTFT warm / cold | {one['ttft_ratio']:.3f} | {two['ttft_ratio']:.3f} | |")
        print(
            f"| cached tokens of the warm request | {one['warm_cached_tokens']} | {two['warm_cached_tokens']} | |"
        )
        print(f"| greedy answers identical | | {one['greedy'] == two['greedy']} | |")
        c1, c2 = one["concurrent 16"]["tok_s"], two["concurrent 16"]["tok_s"]
        print(f"| 16 concurrent generations, tok/s | {c1:.1f} | {c2:.1f} | {c2 / c1:.2f}x |")
        i1, i2 = one["identical 8"], two["identical 8"]
        print(
            f"| 8 identical concurrent misses: engine generations, wall s | {i1['generations']:.0f}, {i1['seconds']:.2f} | {i2['generations']:.0f}, {i2['seconds']:.2f} | |"
        )
        for row in (one, two):
            row["busy_ratio"] = row["hit busy"]["p50_ms"] / row["hit idle"]["p50_ms"]
        print(
            f"| semantic hit p50 ms idle / 8 generations running | {one['hit idle']['p50_ms']:.1f} / {one['hit busy']['p50_ms']:.1f} | {two['hit idle']['p50_ms']:.1f} / {two['hit busy']['p50_ms']:.1f} | |"
        )
        print(f"| busy / idle | {one['busy_ratio']:.2f} | {two['busy_ratio']:.2f} | |")
        print(f"| RSS MB | {_rss(one['rss_mb'])} | {_rss(two['rss_mb'])} | |")
    print("\n" + json.dumps(results))


def _rate(row: dict[str, Any], kind: str) -> float:
    return float(row["kinds"].get(kind, 0) / row["seconds"])


def _rss(rss: dict[str, float]) -> str:
    return ", ".join(f"{role} {mb:.0f}" for role, mb in rss.items()) + f" (total {sum(rss.values()):.0f})"


if __name__ == "__main__":
    sys.exit(main())
