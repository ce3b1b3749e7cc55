"""Per-tenant rate limits: OpenAI's headers, hits counted or not, three replicas on one Redis, Redis outages."""

from __future__ import annotations

import os
import secrets
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
import redis
from fastapi.testclient import TestClient

from gateway.http.app import create_app
from tests.gateway.conftest import auth, chat, make_settings
from tests.gateway.fakes import ScriptedBackend

REDIS_URL = os.environ.get("KVGATE_TEST_REDIS_URL", "redis://127.0.0.1:6379/13")
RATE_HEADERS = [
    f"x-ratelimit-{kind}-{unit}"
    for kind in ("limit", "remaining", "reset")
    for unit in ("requests", "tokens")
]


def make_client(tmp_path: Path, **overrides: object) -> TestClient:
    app = create_app(make_settings(tmp_path, **overrides), backend_factory=lambda settings: ScriptedBackend())
    return TestClient(app)


def test_headers_count_down_then_429_in_openai_shape(tmp_path: Path) -> None:
    with make_client(tmp_path, rate_limit_rpm=3, rate_limit_tpm=10_000) as client:
        answers = [
            client.post("/v1/chat/completions", json=chat(f"q{n}", max_tokens=16), headers=auth())
            for n in range(4)
        ]
        other = client.post("/v1/chat/completions", json=chat("q0"), headers=auth("key-beta"))

    assert [answer.status_code for answer in answers] == [200, 200, 200, 429]
    first = answers[0].headers
    assert all(name in first for name in RATE_HEADERS)
    assert first["x-ratelimit-limit-requests"] == "3" and first["x-ratelimit-remaining-requests"] == "2"
    assert first["x-ratelimit-limit-tokens"] == "10000"
    assert int(first["x-ratelimit-remaining-tokens"]) == 10_000 - (2 // 4 + 16)  # chars/4 + max_tokens
    assert answers[2].headers["x-ratelimit-remaining-requests"] == "0"

    refused = answers[3]
    assert refused.json()["error"]["type"] == "rate_limit_error"
    assert refused.json()["error"]["code"] == "rate_limit_exceeded"
    assert int(refused.headers["retry-after"]) >= 1
    assert refused.headers["x-ratelimit-remaining-requests"] == "0"
    assert other.status_code == 200  # limits are per tenant


def test_tenant_override_and_free_cache_hits(tmp_path: Path) -> None:
    overrides = {"alpha": {"rpm": 2}}
    with make_client(
        tmp_path, rate_limit_rpm=100, tenant_limits=overrides, rate_limit_count_hits=False
    ) as client:
        statuses = [
            client.post("/v1/chat/completions", json=chat(text), headers=auth()).status_code
            for text in ["same", "same", "same", "other", "third"]
        ]
        hit = client.post("/v1/chat/completions", json=chat("same"), headers=auth())
        beta = client.post("/v1/chat/completions", json=chat("beta"), headers=auth("key-beta"))

    assert statuses == [200, 200, 200, 200, 429]  # two misses charged; the hits were free
    assert hit.headers["x-kvgate-cache"] == "exact-hit" and hit.headers["x-ratelimit-limit-requests"] == "2"
    assert beta.headers["x-ratelimit-limit-requests"] == "100"


def test_unlimited_tenants_get_no_headers(tmp_path: Path) -> None:
    with make_client(tmp_path) as client:
        answer = client.post("/v1/chat/completions", json=chat("free"), headers=auth())
    assert answer.status_code == 200 and "x-ratelimit-limit-requests" not in answer.headers


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def wait_for(url: str, process: subprocess.Popen[bytes], timeout_s: float = 120.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"{url} exited with {process.returncode}")
        try:
            if httpx.get(url + "/readyz", timeout=1.0).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise RuntimeError(f"{url} did not start")


@pytest.fixture
def redis_db() -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(REDIS_URL)
    try:
        client.ping()
    except redis.ConnectionError:
        pytest.skip("no Redis at " + REDIS_URL)
    yield client
    client.close()


@pytest.mark.redis
@pytest.mark.slow
def test_three_replicas_enforce_one_limit(tmp_path: Path, redis_db: redis.Redis) -> None:
    tenant = f"rl-{secrets.token_hex(4)}"
    rpm = 12
    environment = os.environ | {
        "KVGATE_REDIS_URL": REDIS_URL,
        "KVGATE_API_KEYS": f"replica-key:{tenant}",
        "KVGATE_RATE_LIMIT_RPM": str(rpm),
        "KVGATE_SCOPE_SECRET": tenant,
        "KVGATE_LOG_LEVEL": "warning",
        "PYTHONPATH": str(Path.cwd()),
    }
    ports = [free_port() for _ in range(3)]
    processes = [
        subprocess.Popen(
            [sys.executable, "tests/gateway/replica_app.py", str(port)],
            env=environment | {"KVGATE_DATA_DIR": str(tmp_path / str(port))},
        )
        for port in ports
    ]
    urls = [f"http://127.0.0.1:{port}" for port in ports]
    try:
        for url, process in zip(urls, processes, strict=True):
            wait_for(url, process)
        headers = {"Authorization": "Bearer replica-key"}

        def send(index: int) -> int:
            body = chat(f"replica question {index}")
            return httpx.post(
                urls[index % 3] + "/v1/chat/completions", json=body, headers=headers
            ).status_code

        started = time.monotonic()
        with ThreadPoolExecutor(max_workers=6) as pool:
            statuses = list(pool.map(send, range(45)))
        elapsed = time.monotonic() - started
    finally:
        for process in processes:
            process.terminate()
        for process in processes:
            process.wait(timeout=30)
        keys = list(redis_db.scan_iter(match=f"kvgate:ratelimit:{{{tenant}}}:*"))
        keys += list(redis_db.scan_iter(match=f"*{tenant}*"))
        if keys:
            redis_db.delete(*keys)

    allowed = statuses.count(200)
    refill = elapsed * rpm / 60.0
    assert set(statuses) <= {200, 429}
    assert rpm <= allowed <= rpm + refill + 1, (allowed, elapsed)


@pytest.mark.slow
def test_redis_outage_falls_back_to_local_buckets(tmp_path: Path) -> None:
    binary = shutil.which("redis-server")
    if binary is None:
        pytest.skip("redis-server is not installed")
    port = free_port()
    server = subprocess.Popen(
        [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"],
        stdout=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 10
        while True:
            try:
                redis.Redis(port=port).ping()
                break
            except redis.ConnectionError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
        settings = {"redis_url": f"redis://127.0.0.1:{port}/0", "rate_limit_rpm": 3, "breaker_failures": 2}
        with make_client(tmp_path, **settings) as client:

            def statuses(prefix: str) -> list[int]:
                return [
                    client.post(
                        "/v1/chat/completions", json=chat(f"{prefix} {n}"), headers=auth()
                    ).status_code
                    for n in range(4)
                ]

            before = statuses("before")
            assert client.get("/readyz").json()["rate_limiter"] == "redis"
            server.terminate()
            server.wait(timeout=10)
            during = statuses("during")
            ready = client.get("/readyz").json()
    finally:
        if server.poll() is None:
            server.terminate()
            server.wait(timeout=10)

    assert before == [200, 200, 200, 429]
    assert during == [200, 200, 200, 429]  # fresh per-process buckets: limited, never an error
    assert ready["rate_limiter"] == "local" and ready["breakers"]["store"]["state"] == "open"
