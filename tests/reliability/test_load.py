"""Load, shortened (`make bench` runs 200 clients for 60 s): 50 clients for 10 s on exact hits,
semantic hits and misses against one kvgate process whose backend overloads: no 5xx, no dropped
connection, every overload a 429 with Retry-After, RSS and p50 / p99 per class reported."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from bench.gateway.bench_reliability import run_load
from tests.reliability.kvgate_runner import KvgateProcess
from tests.reliability.redis_proc import RedisProcess

pytestmark = pytest.mark.slow


def test_fifty_clients_for_ten_seconds(tmp_path: Path) -> None:
    redis_server = RedisProcess(tmp_path / "redis", appendfsync="everysec")  # its own: it seeds prompts
    redis_server.start()
    env = {"KVGATE_MAX_PENDING": "4", "KVGATE_TEST_DELAY_S": "0.02"}
    kvgate = KvgateProcess(redis_server.url, tmp_path / "kvgate", env=env)
    try:
        kvgate.launch()
        kvgate.wait_ready()
        assert kvgate.process is not None
        report = asyncio.run(run_load(kvgate.base, clients=50, duration_s=10.0, pid=kvgate.process.pid))
    finally:
        kvgate.kill()
        redis_server.kill()
    print("\n" + "\n".join(report.lines(10.0)))
    assert not report.errors, f"dropped connections: {report.errors}"
    assert report.server_errors == 0, report.statuses
    assert report.statuses["429"] > 0, "the load never reached max_pending: the overload path went untested"
    assert report.missing_retry_after == 0
    assert report.latencies["exact-hit"] and report.latencies["semantic-hit"] and report.latencies["miss"]
