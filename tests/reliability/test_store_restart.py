"""A store that restarts while nobody is asking: the first request after it is back must store again;
an embedded store whose process dies is started again by kvgate.

The failure this guards against: Redis restarts, the store's breaker opens on the requests that failed
open meanwhile, then the half-open probe runs on a pooled connection that died with the old server, fails,
and caching stays off for another cool-down. With a quiet gap longer than the cool-down, the first
request after the restart must be stored and the second must be an exact hit.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import httpx
import pytest

from gateway.http.app import create_app
from tests.gateway.conftest import auth, chat, make_settings
from tests.gateway.fakes import ScriptedBackend
from tests.gateway.live_server import serve
from tests.reliability.redis_proc import RedisProcess

pytestmark = pytest.mark.slow

FAILED_OPEN = 5


def cache_of(client: httpx.Client, prompt: str) -> str:
    response = client.post("/v1/chat/completions", json=chat(prompt), headers=auth())
    assert response.status_code == 200, response.text
    return response.headers["x-kvgate-cache"]


@pytest.mark.parametrize("stop", ["kill", "shutdown"])
def test_first_request_after_a_quiet_restart_is_stored(tmp_path: Path, stop: str) -> None:
    redis_server = RedisProcess(tmp_path / "redis", appendfsync="always")
    redis_server.start()
    settings = make_settings(
        tmp_path / "kvgate", redis_url=redis_server.url, store_error_log_interval_s=0.001
    )
    app = create_app(settings, backend_factory=lambda _: ScriptedBackend())
    try:
        with serve(app) as base, httpx.Client(base_url=base, timeout=10.0) as client:
            assert cache_of(client, "Before the restart?") == "miss"
            assert cache_of(client, "Before the restart?") == "exact-hit"
            if stop == "kill":
                redis_server.kill()
            else:
                redis_server.shutdown()
            for turn in range(FAILED_OPEN):
                assert cache_of(client, f"During the outage {turn}?") == "miss"  # failed open
            redis_server.start()
            time.sleep(2 * settings.breaker_cooldown_s + 1.0)  # quiet: no request reaches the store

            assert cache_of(client, "After the restart?") == "miss"
            assert cache_of(client, "After the restart?") == "exact-hit"
            assert cache_of(client, "Before the restart?") == "exact-hit"  # the AOF kept it
            assert client.get("/readyz").json()["status"] == "ready"
    finally:
        redis_server.kill()


def test_the_embedded_store_is_started_again_after_kill_minus_nine(tmp_path: Path) -> None:
    settings = make_settings(tmp_path)  # no redis_url: the embedded store `make serve` runs
    app = create_app(settings, backend_factory=lambda _: ScriptedBackend())
    with serve(app) as base, httpx.Client(base_url=base, timeout=10.0) as client:
        assert cache_of(client, "Kept by the append-only file?") == "miss"
        assert cache_of(client, "Kept by the append-only file?") == "exact-hit"
        time.sleep(1.2)  # appendfsync everysec: let the entry reach the disk, as a crash test must
        embedded = app.state.store.embedded
        old_pid = embedded.pid
        os.kill(old_pid, signal.SIGKILL)

        seen = []
        deadline = time.monotonic() + 15.0
        while time.monotonic() < deadline:
            seen.append(client.get("/readyz").json()["status"])
            if seen[-1] == "ready" and "degraded" in seen:
                break
            time.sleep(0.01)
        assert "degraded" in seen and seen[-1] == "ready", seen
        assert embedded.pid != old_pid and embedded.directory == settings.store_dir

        assert cache_of(client, "Kept by the append-only file?") == "exact-hit"
        assert cache_of(client, "Asked after the restart?") == "miss"
        assert cache_of(client, "Asked after the restart?") == "exact-hit"
