"""A second kvgate-like process for the two-process test: one SemanticCache, driven by JSON lines.

python tests/semantic/replica.py REDIS_URL PREFIX
stdin:  {"op": "insert" | "lookup" | "purge" | "quit", "text": ..., "entry_id": ...}
stdout: {"ready": true, "indexed": N} once started, then one JSON answer per command.
"""

from __future__ import annotations

import asyncio
import json
import sys
from typing import Any

import redis.asyncio as aioredis
import torch

from semantic.cache import SemanticCache
from semantic.embedding.embedder import SentenceEmbedder
from semantic.embedding.embedder_source import DEFAULT_EMBEDDER_NAME, resolve_embedder
from semantic.rule.threshold import CosineThresholdRule
from semantic.store.entries import RedisEntryStore
from semantic.store.purge import PurgeSelector
from semantic.store.scope import build_scope


async def serve(url: str, prefix: str) -> None:
    torch.set_num_threads(1)
    embedder = SentenceEmbedder(resolve_embedder(DEFAULT_EMBEDDER_NAME))
    client = aioredis.Redis.from_url(url)
    cache = SemanticCache(RedisEntryStore(client, prefix=prefix), embedder, CosineThresholdRule(0.8))
    reply({"ready": True, "indexed": await cache.start()})
    loop = asyncio.get_running_loop()
    while line := await loop.run_in_executor(None, sys.stdin.readline):
        command = json.loads(line)
        if command["op"] == "quit":
            break
        reply(await run(cache, command))
    await cache.stop()
    await client.aclose()


async def run(cache: SemanticCache, command: dict[str, Any]) -> dict[str, Any]:
    if command["op"] == "purge":
        return {"count": await cache.purge(PurgeSelector(entry_id=command["entry_id"]))}
    body = {
        "model": "tiny-llama",
        "messages": [{"role": "user", "content": command["text"]}],
        "temperature": 0,
    }
    scope = build_scope(body, tenant="acme", embedder=cache.embedder.name)
    if command["op"] == "insert":
        inserted = await cache.insert(scope, command["response"])
        return {"entry_id": inserted.entry_id if inserted else None}
    found = await cache.lookup(scope)
    return {"kind": str(found.kind), "entry_id": found.entry.entry_id if found.entry else None}


def reply(message: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(message) + "\n")
    sys.stdout.flush()


if __name__ == "__main__":
    asyncio.run(serve(sys.argv[1], sys.argv[2]))
