"""Which Redis kvgate talks to: the external one named by `KVGATE_REDIS_URL` (a single node, or a Redis
Cluster with `KVGATE_REDIS_CLUSTER`), or the embedded one it starts.

Owns the process (if any) and the asyncio client; knows nothing of what is stored. An embedded store whose
child process dies is started again on the same data directory (its append-only file keeps the entries);
meanwhile the store is unreachable, so `/readyz` says degraded and the cache fails open.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import redis.asyncio as aioredis
from redis.asyncio.cluster import RedisCluster
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisClusterException

from gateway.runtime.background import cancel_and_wait
from gateway.runtime.embedded_store import EmbeddedStore, EmbeddedStoreError
from gateway.runtime.settings import Settings
from semantic import RedisClient

logger = logging.getLogger("kvgate.store")

WATCH_INTERVAL_S = 0.5
RESTART_BACKOFF_CAP_S = 10.0


@dataclass(slots=True)
class StoreRuntime:
    """The live store: a client, how to describe it to operators, and the child process if embedded."""

    client: RedisClient
    kind: str
    url: str
    embedded: EmbeddedStore | None = field(default=None)
    _watcher: asyncio.Task[None] | None = field(default=None, init=False, repr=False)

    @classmethod
    def open(cls, settings: Settings) -> StoreRuntime:
        if settings.redis_url is not None:
            url = str(settings.redis_url)
            if settings.redis_cluster:
                # The cluster client already retries a lost node (rediscovering the topology) by default.
                return cls(RedisCluster.from_url(url), kind="cluster", url=url)
            return cls(single_node_client(url), kind="external", url=url)
        embedded = EmbeddedStore(settings.store_dir)
        embedded.start()
        return cls(single_node_client(embedded.url), kind="embedded", url=embedded.url, embedded=embedded)

    @classmethod
    def attach(cls, url: str) -> StoreRuntime:
        """The embedded store another process (the supervisor of `--workers N`) runs and keeps running."""
        return cls(single_node_client(url), kind="embedded", url=url)

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

    def start_watching(self) -> None:
        """Keep the embedded store's child process alive (a no-op for an external Redis)."""
        if self.embedded is not None and self._watcher is None:
            self._watcher = asyncio.create_task(self._keep_running(self.embedded), name="embedded-store")

    async def close(self) -> None:
        await cancel_and_wait(self._watcher)
        await self.client.aclose()
        if self.embedded is not None:
            self.embedded.stop()

    async def _keep_running(self, embedded: EmbeddedStore) -> None:
        backoff_s = WATCH_INTERVAL_S
        while True:
            await asyncio.sleep(WATCH_INTERVAL_S)
            if embedded.running:
                continue
            logger.error("the embedded store's process exited; starting it again on %s", embedded.directory)
            while not embedded.running:
                try:
                    await asyncio.to_thread(embedded.start)
                except (EmbeddedStoreError, OSError) as error:
                    logger.error(
                        "the embedded store did not start (retrying in %.1f s): %s", backoff_s, error
                    )
                    await asyncio.sleep(backoff_s)
                    backoff_s = min(2 * backoff_s, RESTART_BACKOFF_CAP_S)
            backoff_s = WATCH_INTERVAL_S
            logger.info("the embedded store is back (pid %s)", embedded.pid)


def single_node_client(url: str) -> aioredis.Redis:
    """A client that retries a connection error once, at once, on a fresh connection.

    A restarted server leaves every pooled connection dead; without this the first command after the
    restart fails on one of them and the store's breaker opens again, although the store is back.
    (`Redis.from_url` builds its own pool, which does not get redis-py's default retry, so it is set here.)
    Timeouts are not retried: a store that answers slowly is the breaker's business.
    """
    retry = Retry(NoBackoff(), retries=1, supported_errors=(RedisConnectionError,))
    return aioredis.Redis.from_url(url, retry=retry)


def redact_url(url: str) -> str:
    """Drop any password from a Redis URL before it is shown or logged."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    host = parts.hostname or ""
    netloc = f"{parts.username or ''}:***@{host}" + (f":{parts.port}" if parts.port else "")
    return urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))
