"""Two real OS processes on one Redis: a write through one is a hit through the other within a second,
and a purge through one is a miss on both."""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from semantic.cache import LookupKind, SemanticCache
from semantic.store.scope import build_scope
from tests.semantic.builders import REDIS_URL

pytestmark = [pytest.mark.redis, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]


class Replica:
    """The other process, driven over its stdin / stdout."""

    def __init__(self, process: asyncio.subprocess.Process) -> None:
        self.process = process

    async def ask(self, **command: Any) -> dict[str, Any]:
        assert self.process.stdin is not None and self.process.stdout is not None
        self.process.stdin.write((json.dumps(command) + "\n").encode())
        await self.process.stdin.drain()
        line = await asyncio.wait_for(self.process.stdout.readline(), timeout=60)
        answer: dict[str, Any] = json.loads(line)
        return answer


@pytest.fixture
async def replica(cache: SemanticCache) -> AsyncIterator[Replica]:
    prefix = cache.store.prefix  # type: ignore[attr-defined]
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        str(Path(__file__).with_name("replica.py")),
        REDIS_URL,
        prefix,
        cwd=ROOT,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1"},
    )
    started = Replica(process)
    assert process.stdout is not None
    ready = json.loads(await asyncio.wait_for(process.stdout.readline(), timeout=180))
    assert ready["ready"]
    yield started
    assert process.stdin is not None
    process.stdin.write(b'{"op": "quit"}\n')
    await process.stdin.drain()
    await asyncio.wait_for(process.wait(), timeout=30)


def scope_of(text: str, cache: SemanticCache) -> Any:
    body = {"model": "tiny-llama", "messages": [{"role": "user", "content": text}], "temperature": 0}
    return build_scope(body, tenant="acme", embedder=cache.embedder.name)


async def test_write_through_one_process_hit_through_the_other(
    cache: SemanticCache, replica: Replica
) -> None:
    written = await replica.ask(op="insert", text="How do I reset my password?", response='{"answer": 1}')
    written_at = time.monotonic()
    while (
        found := await cache.lookup(scope_of("How can I reset my password?", cache))
    ).kind is LookupKind.MISS:
        assert time.monotonic() - written_at < 1.0, "the other process's write did not arrive within 1 s"
        await asyncio.sleep(0.02)
    assert found.kind is LookupKind.SEMANTIC_HIT and found.entry is not None
    assert found.entry.entry_id == written["entry_id"]

    inserted = await cache.insert(scope_of("What is the capital of France?", cache), '{"answer": "Paris"}')
    assert inserted is not None
    written_at = time.monotonic()
    while (await replica.ask(op="lookup", text="What's the capital of France?"))["kind"] != "semantic_hit":
        assert time.monotonic() - written_at < 1.0, "our write did not reach the other process within 1 s"
        await asyncio.sleep(0.02)


async def test_purge_through_one_process_misses_on_both(cache: SemanticCache, replica: Replica) -> None:
    inserted = await cache.insert(scope_of("How do I reset my password?", cache), '{"answer": 1}')
    assert inserted is not None
    while (await replica.ask(op="lookup", text="How can I reset my password?"))["kind"] != "semantic_hit":
        await asyncio.sleep(0.02)

    assert (await replica.ask(op="purge", entry_id=inserted.entry_id))["count"] == 1
    assert (await replica.ask(op="lookup", text="How can I reset my password?"))["kind"] == "miss"
    purged_at = time.monotonic()
    while cache.sync.index.contains(scope_of("x", cache).scope_id, inserted.entry_id):
        assert time.monotonic() - purged_at < 1.0, "the purge did not reach this process's index within 1 s"
        await asyncio.sleep(0.02)
    for text in ("How can I reset my password?", "How do I reset my password?"):
        assert (await cache.lookup(scope_of(text, cache))).kind is LookupKind.MISS
