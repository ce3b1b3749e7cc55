"""One kvgate process with the scripted backend, for multi-replica tests.

python tests/gateway/replica_app.py PORT   (settings from KVGATE_* in the environment)
"""

from __future__ import annotations

import sys

import uvicorn

from gateway.http.app import create_app
from gateway.http.server import KEEP_ALIVE_S
from gateway.runtime.settings import Settings
from tests.gateway.fakes import ScriptedBackend

if __name__ == "__main__":
    backend = ScriptedBackend()
    app = create_app(Settings(), backend_factory=lambda settings: backend)
    uvicorn.run(
        app, host="127.0.0.1", port=int(sys.argv[1]), log_level="warning", timeout_keep_alive=KEEP_ALIVE_S
    )
