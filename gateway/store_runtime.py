"""Which Redis kvgate talks to: the external one named by `KVGATE_REDIS_URL` (a single node, or a Redis
Cluster with `KVGATE_REDIS_CLUSTER`), or the embedded one it starts.

Owns the process (if any) and the asyncio client; knows nothing of what is stored.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import redis.asyncio as aioredis
from redis.asyncio.cluster import RedisCluster
from redis.exceptions import RedisClusterException

from gateway.embedded_store import EmbeddedStore
from gateway.settings import Settings
from semantic.changes import RedisClient


@dataclass(slots=True)
class StoreRuntime:
    """The live store: a client, how to describe it to operators, and the child process if embedded."""

    client: RedisClient
    kind: str
    url: str
    embedded: EmbeddedStore | None = field(default=None)

    @classmethod
    def open(cls, settings: Settings) -> StoreRuntime:
        if settings.redis_url is not None:
            url = str(settings.redis_url)
            if settings.redis_cluster:
                return cls(RedisCluster.from_url(url), kind="cluster", url=url)
            return cls(aioredis.Redis.from_url(url), kind="external", url=url)
        embedded = EmbeddedStore(settings.store_dir)
        embedded.start()
        return cls(
            aioredis.Redis.from_url(embedded.url), kind="embedded", url=embedded.url, embedded=embedded
        )

    async def describe(self) -> dict[str, object]:
        """What `/healthz` shows: kind, URL without credentials, server version, reachability."""
        try:
            info: dict[str, Any] = await self.client.info("server")
            if info and all(isinstance(value, dict) for value in info.values()):
                info = next(iter(info.values()))  # a cluster client answers per node: {"host:port": {...}}
            reachable, version = True, str(info.get("valkey_version") or info.get("redis_version"))
        except (aioredis.ConnectionError, aioredis.TimeoutError, RedisClusterException, OSError):
            reachable, version = False, None
        return {"kind": self.kind, "url": redact_url(self.url), "reachable": reachable, "version": version}

    async def close(self) -> None:
        await self.client.aclose()
        if self.embedded is not None:
            self.embedded.stop()


def redact_url(url: str) -> str:
    """Drop any password from a Redis URL before it is shown or logged."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    host = parts.hostname or ""
    netloc = f"{parts.username or ''}:***@{host}" + (f":{parts.port}" if parts.port else "")
    return urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))
