"""kvgate in front of a fleet of three real engines: prompt tokens reused under prefix routing, round-robin,
and one server holding everything, side by side in one run (issue 47).

    .venv/bin/python bench/gateway/bench_fleet.py                  # ~5 minutes on 2 cores
    .venv/bin/python bench/gateway/bench_fleet.py --prompts 8 --turns 4

Three `kvgate serve` processes in engine mode (SmolLM2-135M, each with its paged KV cache and prefix
reuse; shadow mode on, so their own answer caches never answer) and one `kvgate serve` in front of them
with an upstreams file of three pools over the same engines: `prefix` (KV-aware routing), `round-robin`,
and `single` (engine 0 alone: one server holding everything, the reuse a single cache reaches). Each pool
gets the same workload with its own texts (so no pool reuses another's KV): several long system prompts
shared across tenants, two conversations per prompt, each of several turns that re-send the earlier turns
and answers, run a few conversations at a time. Requests bypass kvgate's answer cache (`no-cache,
no-store`): every one reaches an engine. Reused tokens are what the engines report,
`usage.prompt_tokens_details.cached_tokens`; the backend of each answer is its `x-kvgate-backend`.

Printed: per pool, requests, prompt tokens, reused tokens, requests per backend and max/mean; then the
three bars: prefix reuses >= 1.5x what round-robin reuses and >= 0.9x of one server, with max/mean
requests per backend <= 1.3.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import sys
import tempfile
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import yaml

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tests.integration.workers_cluster import Cluster  # noqa: E402

ENGINE_MODEL = "smollm2-135m-instruct"
POOLS = ("prefix", "round-robin", "single")
UNCACHED = {"Cache-Control": "no-cache, no-store"}
ENGINE_ENV = {
    "KVGATE_SHADOW_MODE": "true",  # the engines' own answer caches compare, never answer
    "KVGATE_TORCH_THREADS": "1",  # three engines on two cores
    "KVGATE_INFERENCE_THREADS": "1",
    "KVGATE_KV_CACHE_TOKENS": "16384",
}
VOCABULARY = (
    "account order refund policy shipping warranty invoice customer support agent answer politely briefly "
    "always never check verify escalate manager product catalogue price discount coupon delivery window "
    "address change cancel return label damaged item replacement stock store online payment card bank "
    "transfer receipt loyalty points tier member benefit holiday hours contact email phone chat queue "
    "priority urgent ticket number reference case history note summary tone friendly formal concise"
)
WORDS = tuple(VOCABULARY.split())


@dataclass
class Outcome:
    requests: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0
    backends: Counter[str] = field(default_factory=Counter)
    seconds: list[float] = field(default_factory=list)

    @property
    def balance(self) -> float:
        counts = list(self.backends.values())
        return max(counts) / statistics.mean(counts) if counts else float("nan")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--prompts", type=int, default=6, help="long system prompts, shared across tenants")
    parser.add_argument(
        "--prompt-words", type=int, default=360, help="words per system prompt (~1.4 tokens each)"
    )
    parser.add_argument("--conversations", type=int, default=2, help="conversations per system prompt")
    parser.add_argument("--turns", type=int, default=3, help="turns per conversation")
    parser.add_argument("--tenants", type=int, default=6)
    parser.add_argument("--concurrency", type=int, default=6, help="conversations in flight at once")
    parser.add_argument("--max-tokens", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)

    engines = [Cluster(1, env=ENGINE_ENV) for _ in range(3)]
    gateway: Cluster | None = None
    started = time.monotonic()
    try:
        _start_all(engines)
        folder = Path(tempfile.mkdtemp(prefix="kvgate-fleet-"))
        upstreams = folder / "upstreams.yaml"
        upstreams.write_text(yaml.safe_dump(_model_list(engines)))
        keys = ",".join(f"key-{index}:tenant-{index}" for index in range(args.tenants))
        gateway = Cluster(1, env={"KVGATE_UPSTREAMS_FILE": str(upstreams), "KVGATE_API_KEYS": keys}).start()
        print(f"engines and gateway up in {time.monotonic() - started:.0f} s", flush=True)
        outcomes = {pool: asyncio.run(_run(gateway.base, pool, args)) for pool in POOLS}
        names = {
            engine.base.removeprefix("http://"): f"engine {index}" for index, engine in enumerate(engines)
        }
        _print(outcomes, names, args)
    finally:
        for cluster in [*engines, *([gateway] if gateway is not None else [])]:
            if cluster.process is not None:
                cluster.stop()
    return 0


def _start_all(engines: list[Cluster]) -> None:
    """Start the engines side by side (each loads its model: a minute or so on 2 cores)."""
    errors: list[BaseException] = []

    def start(engine: Cluster) -> None:
        try:
            engine.start()
        except BaseException as error:
            errors.append(error)

    threads = [threading.Thread(target=start, args=(engine,)) for engine in engines]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        raise errors[0]


def _model_list(engines: list[Cluster]) -> dict[str, Any]:
    entries = []
    for pool in POOLS:
        for engine in engines[:1] if pool == "single" else engines:
            params = {"model": ENGINE_MODEL, "api_base": engine.base + "/v1"}
            entries.append(
                {
                    "model_name": f"bench-{pool}",
                    "litellm_params": params,
                    "routing": "round-robin" if pool == "round-robin" else "prefix",
                }
            )
    return {"model_list": entries}


async def _run(base: str, pool: str, args: argparse.Namespace) -> Outcome:
    """Every conversation of the workload through the `pool` model, a few at a time."""
    rng = random.Random(args.seed)
    systems = [
        f"[{pool} #{index}] You are the support assistant of shop {index}. " + _text(rng, args.prompt_words)
        for index in range(args.prompts)
    ]
    conversations = [
        (system, index % args.tenants) for index, system in enumerate(systems * args.conversations)
    ]
    rng.shuffle(conversations)
    outcome = Outcome()
    gate = asyncio.Semaphore(args.concurrency)
    async with httpx.AsyncClient(base_url=base, timeout=600) as client:

        async def converse(number: int, system: str, tenant: int) -> None:
            async with gate:
                messages = [{"role": "system", "content": system}]
                for turn in range(args.turns):
                    question = f"Customer {number} turn {turn}: " + _text(
                        random.Random(f"{pool}{number}{turn}"), 30
                    )
                    messages.append({"role": "user", "content": question})
                    body = {
                        "model": f"bench-{pool}",
                        "messages": messages,
                        "max_tokens": args.max_tokens,
                        "temperature": 0,
                    }
                    headers = UNCACHED | {"Authorization": f"Bearer key-{tenant}"}
                    began = time.monotonic()
                    response = await client.post("/v1/chat/completions", json=body, headers=headers)
                    response.raise_for_status()
                    answer = response.json()
                    usage = answer["usage"]
                    outcome.requests += 1
                    outcome.prompt_tokens += usage["prompt_tokens"]
                    outcome.cached_tokens += (usage.get("prompt_tokens_details") or {}).get(
                        "cached_tokens"
                    ) or 0
                    outcome.backends[response.headers["x-kvgate-backend"]] += 1
                    outcome.seconds.append(time.monotonic() - began)
                    messages.append(
                        {"role": "assistant", "content": answer["choices"][0]["message"]["content"]}
                    )

        await asyncio.gather(
            *(converse(number, system, tenant) for number, (system, tenant) in enumerate(conversations))
        )
    return outcome


def _text(rng: random.Random, words: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(words)) + "."


def _print(outcomes: dict[str, Outcome], names: dict[str, str], args: argparse.Namespace) -> None:
    print(
        f"\n3 engines (kvgate serve, {ENGINE_MODEL}), {args.prompts} system prompts of {args.prompt_words} words x "
        f"{args.conversations} conversations x {args.turns} turns, {args.tenants} tenants, "
        f"{args.concurrency} conversations at a time, max_tokens {args.max_tokens}"
    )
    print(
        f"{'routing':<22}{'requests':>9}{'prompt tok':>12}{'reused tok':>12}{'reused':>8}{'p50 s':>7}  per backend (max/mean)"
    )
    for pool, outcome in outcomes.items():
        label = "one server (engine 0)" if pool == "single" else pool
        per = ", ".join(
            f"{names.get(name, name)}: {count}"
            for name, count in sorted(outcome.backends.items(), key=lambda item: names.get(item[0], item[0]))
        )
        share = outcome.cached_tokens / outcome.prompt_tokens if outcome.prompt_tokens else 0.0
        print(
            f"{label:<22}{outcome.requests:>9}{outcome.prompt_tokens:>12,}{outcome.cached_tokens:>12,}{share:>8.1%}"
            f"{statistics.median(outcome.seconds):>7.2f}  {per} ({outcome.balance:.2f})"
        )
    prefix, round_robin, single = (outcomes[pool] for pool in POOLS)
    versus_rr = prefix.cached_tokens / max(1, round_robin.cached_tokens)
    versus_one = prefix.cached_tokens / max(1, single.cached_tokens)
    print(
        f"prefix / round-robin reused tokens: {versus_rr:.2f}x (bar >= 1.5: {'met' if versus_rr >= 1.5 else 'NOT met'})"
    )
    print(
        f"prefix / one server reused tokens:  {versus_one:.2f}x (bar >= 0.9: {'met' if versus_one >= 0.9 else 'NOT met'})"
    )
    print(
        f"prefix max/mean requests per backend: {prefix.balance:.2f} (bar <= 1.3: {'met' if prefix.balance <= 1.3 else 'NOT met'})"
    )


if __name__ == "__main__":
    sys.exit(main())
