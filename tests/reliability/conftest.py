"""Reliability fixtures: a Redis of our own and three kvgate processes on it, shared by the module
tests that need real processes (starting one costs seconds of imports on two cores)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.reliability.kvgate_runner import KvgateProcess, start_all
from tests.reliability.redis_proc import RedisProcess


@pytest.fixture(scope="session")
def shared_redis(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisProcess]:
    server = RedisProcess(tmp_path_factory.mktemp("redis"), appendfsync="everysec")
    server.start()
    yield server
    server.kill()


@pytest.fixture(scope="session")
def replicas(
    shared_redis: RedisProcess, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[list[KvgateProcess]]:
    """Three kvgate processes on one Redis; a scripted backend slow enough for writes to overlap."""
    root: Path = tmp_path_factory.mktemp("kvgate")
    processes = [
        KvgateProcess(shared_redis.url, root / f"r{index}", env={"KVGATE_TEST_DELAY_S": "0.02"})
        for index in range(3)
    ]
    try:
        start_all(processes)
        yield processes
    finally:
        for process in processes:
            process.kill()
