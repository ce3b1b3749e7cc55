"""Fleet test builders: model server processes on free ports, and a gateway in front of them."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from gateway.http.app import create_app
from tests.gateway.conftest import make_settings
from tests.gateway.fleet.fleet_upstream import ModelServer
from tests.gateway.live_server import serve
from tests.reliability.redis_proc import free_port

# A miss every time, nothing stored: the backends are what these tests watch.
UNCACHED = {"Cache-Control": "no-cache, no-store"}
FAST_HEALTH = {"fleet_health_interval_s": 0.25, "fleet_health_timeout_s": 1.0, "fleet_slow_start_s": 1.0}


@contextmanager
def model_servers(*models: list[str]) -> Iterator[list[ModelServer]]:
    """One server process per model list, started together; stopped (or found dead) afterwards."""
    servers = [ModelServer(free_port(), list(names)) for names in models]
    try:
        for server in servers:
            server.start()
        for server in servers:
            server.wait_ready()
        yield servers
    finally:
        for server in servers:
            server.stop()


@contextmanager
def gateway(data_dir: Path, **settings: Any) -> Iterator[str]:
    """kvgate (open, embedded store) on a free port in this process, in front of what `settings` names."""
    app = create_app(make_settings(data_dir, api_keys=None, **(FAST_HEALTH | settings)))
    with serve(app) as url:
        yield url
