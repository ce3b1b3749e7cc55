"""The uvicorn server kvgate runs, the same in a single process and in each worker."""

from __future__ import annotations

import socket

import uvicorn
from fastapi import FastAPI

from gateway.runtime.settings import Settings

KEEP_ALIVE_S = 75


def run_http(app: FastAPI, settings: Settings, sockets: list[socket.socket] | None = None) -> None:
    """Serve `app` on the settings' host and port, or on `sockets` already listening (a worker's)."""
    config = uvicorn.Config(
        app,
        host=settings.host,
        port=settings.port,
        log_level=settings.log_level,
        log_config=None,
        # Longer than clients' and load balancers' idle timeouts: the server never closes a kept-alive
        # connection just as a client reuses it (uvicorn's 5 s default dropped requests under load).
        timeout_keep_alive=KEEP_ALIVE_S,
    )
    uvicorn.Server(config).run(sockets=sockets)
