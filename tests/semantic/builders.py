"""Builders for the semantic tests: requests, scopes, key prefixes (no fixtures here)."""

from __future__ import annotations

import os
import secrets
from typing import Any

import redis.asyncio as aioredis

from semantic.store.scope import RequestScope, build_scope

REDIS_URL = os.environ.get("KVGATE_TEST_REDIS_URL", "redis://127.0.0.1:6379/15")
EMBEDDER = "all-MiniLM-L6-v2"


def make_request(last: str = "How do I reset my password?", **overrides: Any) -> dict[str, Any]:
    """A chat request body: a system prompt and one user turn, plus any field overrides."""
    body: dict[str, Any] = {
        "model": "tiny-llama",
        "messages": [
            {"role": "system", "content": "You are a helpful assistant."},
            {"role": "user", "content": last},
        ],
        "temperature": 0,
        "max_tokens": 64,
    }
    body.update(overrides)
    return body


def make_scope(
    last: str = "How do I reset my password?", tenant: str = "acme", **overrides: Any
) -> RequestScope:
    return build_scope(make_request(last, **overrides), tenant=tenant, embedder=EMBEDDER)


def unique_prefix() -> str:
    return f"kvgate:test:{secrets.token_hex(6)}"


async def delete_prefix(client: aioredis.Redis, prefix: str) -> None:
    keys = [key async for key in client.scan_iter(match=f"{prefix}:*", count=1000)]
    for start in range(0, len(keys), 500):
        await client.delete(*keys[start : start + 500])
