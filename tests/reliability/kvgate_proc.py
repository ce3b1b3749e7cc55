"""A kvgate process for the reliability tests: `create_app` with a `ScriptedBackend`, served by uvicorn.

python tests/reliability/kvgate_proc.py PORT
Settings come from the environment (`KVGATE_REDIS_URL`, `KVGATE_API_KEYS`, ...); `KVGATE_TEST_DELAY_S`
slows the scripted backend down so that misses cost time.
"""

from __future__ import annotations

import os
import sys

import uvicorn

from gateway.app import create_app
from gateway.cli import KEEP_ALIVE_S
from gateway.settings import Settings
from tests.gateway.fakes import ScriptedBackend


def main(port: int) -> None:
    backend = ScriptedBackend(delay_s=float(os.environ.get("KVGATE_TEST_DELAY_S", "0")))
    app = create_app(Settings(), backend_factory=lambda settings: backend)
    uvicorn.run(
        app, host="127.0.0.1", port=port, log_level="warning", lifespan="on", timeout_keep_alive=KEEP_ALIVE_S
    )


if __name__ == "__main__":
    main(int(sys.argv[1]))
