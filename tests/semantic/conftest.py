"""Shared pieces for the semantic cache tests: a real Redis per test (unique key prefix), the real
MiniLM embedder loaded once per session, and builders for requests and caches."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis.asyncio as aioredis

from semantic.cache import CacheConfig, SemanticCache
from semantic.embedding.embedder import SentenceEmbedder
from semantic.embedding.embedder_source import DEFAULT_EMBEDDER_NAME, resolve_embedder
from semantic.rule.threshold import CosineThresholdRule
from semantic.store.entries import RedisEntryStore
from tests.semantic.builders import REDIS_URL, delete_prefix, unique_prefix


@pytest.fixture
async def redis_client() -> AsyncIterator[aioredis.Redis]:
    client = aioredis.Redis.from_url(REDIS_URL)
    try:
        await client.ping()
    except (aioredis.ConnectionError, OSError):
        await client.aclose()
        pytest.skip(f"no Redis at {REDIS_URL}")
    yield client
    await client.aclose()


@pytest.fixture
async def store(redis_client: aioredis.Redis) -> AsyncIterator[RedisEntryStore]:
    prefix = unique_prefix()
    yield RedisEntryStore(redis_client, prefix=prefix)
    await delete_prefix(redis_client, prefix)


@pytest.fixture(scope="session")
def embedder() -> Iterator[SentenceEmbedder]:
    import torch

    # Two shared cores: OpenMP threads spinning against other processes turn 15 ms into 1 s.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield SentenceEmbedder(resolve_embedder(DEFAULT_EMBEDDER_NAME))
    torch.set_num_threads(threads)


@pytest.fixture
async def make_cache(embedder: SentenceEmbedder, store: RedisEntryStore) -> AsyncIterator[Any]:
    """Build caches on the test's store (same Redis, same prefix), as separate replicas would be."""
    caches: list[SemanticCache] = []

    def build(threshold: float = 0.8, **config: Any) -> SemanticCache:
        replica_store = RedisEntryStore(store.client, prefix=store.prefix)
        cache = SemanticCache(replica_store, embedder, CosineThresholdRule(threshold), CacheConfig(**config))
        caches.append(cache)
        return cache

    yield build
    for built in caches:
        await built.stop()


@pytest.fixture
async def cache(make_cache: Any) -> SemanticCache:
    built: SemanticCache = make_cache()
    await built.start()
    return built


def replica_script() -> Path:
    return Path(__file__).with_name("replica.py")
