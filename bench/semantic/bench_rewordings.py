"""Rewordings as a cache meets them: one scope holding every `a` of a pairs part, each new `b` looked up.

    .venv/bin/python bench/semantic/bench_rewordings.py                          # chatbot test part, k = 1 and 3
    .venv/bin/python bench/semantic/bench_rewordings.py --file adversarial_dev.jsonl --judged 3

Runs the real cache (Redis store, FAISS index, embedder batching) with the served rule at its default
target, once per `--judged` value (`CacheConfig.judged`: how many of the nearest stored prompts the rule
judges), side by side in one run. The stored answer of each entry is its prompt, so a hit shows what it
served. A served prompt is right when positive pairs of the file join it to the wording looked up
(`evaluation/scope_lookups.py`); any other hit serves a non-paraphrase (unlabelled pairs count as wrong).

Prints, per k: of the new wordings whose paraphrase is stored, the share served a paraphrase; of all hits,
the share serving a non-paraphrase; per kind of the pair the wording came from; p50 lookup time.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import secrets
import statistics
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import redis.asyncio as aioredis

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from evaluation.pair_sets import CHATBOT_FILE, file_part
from evaluation.probes import default_embedder
from evaluation.scope_lookups import PopulatedScope, populated_scope
from semantic.cache import CacheConfig, Lookup, LookupKind, SemanticCache
from semantic.embedding.embedder import SentenceEmbedder
from semantic.rule.calibrated_rule import CalibratedRule
from semantic.rule.calibration import DEFAULT_TARGET_FALSE_HIT_RATE
from semantic.rule.loading import load_rule
from semantic.store.entries import RedisEntryStore
from semantic.store.scope import RequestScope, build_scope

DATA_DIR = Path(__file__).resolve().parents[3] / "shared" / "data"
REDIS_URL = os.environ.get("KVGATE_BENCH_REDIS_URL", "redis://127.0.0.1:6379/14")
CONCURRENCY = 16


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--data-dir", type=Path, default=DATA_DIR)
    parser.add_argument("--file", default=CHATBOT_FILE)
    parser.add_argument("--part", default="test")
    parser.add_argument("--judged", default="1,3", help="comma-separated values of CacheConfig.judged")
    parser.add_argument("--target", type=float, default=DEFAULT_TARGET_FALSE_HIT_RATE)
    parser.add_argument("--show-wrong", type=int, default=10, help="print this many wrong hits")
    args = parser.parse_args()
    scope = populated_scope(file_part(args.data_dir / args.file, args.part))
    rule = load_rule(None, args.target)
    embedder = default_embedder()
    with_paraphrase = scope.groups_stored()
    wanted = [pair.b for pair in scope.queries if scope.paraphrase_groups.get(pair.b) in with_paraphrase]
    print(
        f"{args.file} {args.part}: {len(scope.stored)} prompts stored in one scope, {len(scope.queries)} new "
        f"wordings looked up, {len(wanted)} of them with a stored paraphrase; target {args.target}"
    )
    for judged in (int(value) for value in args.judged.split(",")):
        results, timings = asyncio.run(run(scope, embedder, rule, judged))
        report(scope, results, timings, judged, wanted, args.show_wrong)
    return 0


async def run(
    scope: PopulatedScope, embedder: SentenceEmbedder, rule: CalibratedRule, judged: int
) -> tuple[dict[str, Lookup], list[float]]:
    client = aioredis.Redis.from_url(REDIS_URL)
    prefix = f"kvgate:bench:rewordings:{secrets.token_hex(4)}"
    cache = SemanticCache(
        RedisEntryStore(client, prefix=prefix),
        embedder,
        rule,
        CacheConfig(default_ttl_s=3600.0, judged=judged),
    )
    await cache.start()
    try:
        for start in range(0, len(scope.stored), CONCURRENCY):
            window = scope.stored[start : start + CONCURRENCY]
            await asyncio.gather(*(cache.insert(_scope(text), text) for text in window))
        results: dict[str, Lookup] = {}
        timings: list[float] = []
        queries = [pair.b for pair in scope.queries]
        for start in range(0, len(queries), CONCURRENCY):
            window = queries[start : start + CONCURRENCY]
            started = time.perf_counter()
            found = await asyncio.gather(*(cache.lookup(_scope(text)) for text in window))
            timings.append((time.perf_counter() - started) * 1000 / len(window))
            results.update(zip(window, found, strict=True))
        return results, timings
    finally:
        await cache.stop()
        keys = [key async for key in client.scan_iter(match=f"{prefix}:*", count=1000)]
        for start in range(0, len(keys), 500):
            await client.delete(*keys[start : start + 500])
        await client.aclose()


def report(
    scope: PopulatedScope,
    results: dict[str, Lookup],
    timings: list[float],
    judged: int,
    wanted: list[str],
    show_wrong: int,
) -> None:
    kinds = {pair.b: pair.kind for pair in scope.queries}
    served: dict[str, str] = {}
    for text, lookup in results.items():
        if lookup.kind is LookupKind.SEMANTIC_HIT and lookup.entry is not None:
            served[text] = lookup.entry.response
    right = {text for text, answer in served.items() if scope.is_paraphrase(text, answer)}
    wrong = [text for text in served if text not in right]
    wanted_set = set(wanted)
    recall = len(right & wanted_set) / max(len(wanted), 1)
    wrong_share = len(wrong) / max(len(served), 1)
    print(
        f"\njudged {judged}: {len(served)} semantic hits, {len(right & wanted_set)} of {len(wanted)} new wordings "
        f"with a stored paraphrase served one ({recall:.3f}); {len(wrong)} hits serve a non-paraphrase "
        f"({wrong_share:.4f}); {statistics.median(timings):.1f} ms a lookup (batches of {CONCURRENCY})"
    )
    per_kind_wanted = Counter(kinds[text] for text in wanted)
    per_kind_right = Counter(kinds[text] for text in right & wanted_set)
    per_kind_wrong = Counter(kinds[text] for text in wrong)
    for kind in sorted(set(kinds.values())):
        total = per_kind_wanted[kind]
        if not total and not per_kind_wrong[kind]:
            continue
        share = f"{per_kind_right[kind] / total:.2f}" if total else "  — "
        print(
            f"  {kind:14s} served {per_kind_right[kind]:4d} of {total:4d} ({share})  wrong hits {per_kind_wrong[kind]}"
        )
    for text in wrong[:show_wrong]:
        print(f"  wrong: {text!r} -> {served[text]!r}")


def _scope(text: str) -> RequestScope:
    request: dict[str, Any] = {
        "model": "bench",
        "messages": [{"role": "user", "content": text}],
        "temperature": 0,
    }
    return build_scope(request, tenant="bench-rewordings", embedder="all-MiniLM-L6-v2")


if __name__ == "__main__":
    raise SystemExit(main())
