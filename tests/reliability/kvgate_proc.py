"""A kvgate process for the reliability tests: `create_app` with a `ScriptedBackend`, served by uvicorn.

python tests/reliability/kvgate_proc.py PORT
Settings come from the environment (`KVGATE_REDIS_URL`, `KVGATE_API_KEYS`, ...); `KVGATE_TEST_DELAY_S`
slows the scripted backend down so that misses cost time. With `KVGATE_TEST_TRACEMALLOC=FILE`, Python
allocations are traced and each SIGUSR1 writes a `tracemalloc` snapshot to FILE.N (N = 1, 2, ...), for
finding what grows between two moments of a load run.
"""

from __future__ import annotations

import itertools
import os
import signal
import sys
import tracemalloc
from types import FrameType

import uvicorn

from gateway.http.app import create_app
from gateway.http.server import KEEP_ALIVE_S
from gateway.runtime.settings import Settings
from tests.gateway.fakes import ScriptedBackend


def trace_allocations(prefix: str, frames: int = 8) -> None:
    tracemalloc.start(frames)
    numbers = itertools.count(1)

    def dump(signum: int, frame: FrameType | None) -> None:
        tracemalloc.take_snapshot().dump(f"{prefix}.{next(numbers)}")

    signal.signal(signal.SIGUSR1, dump)


def main(port: int) -> None:
    if os.environ.get("KVGATE_TEST_TRACEMALLOC"):
        trace_allocations(os.environ["KVGATE_TEST_TRACEMALLOC"])
    # A long-lived process must not keep every request it was asked (the fake's `calls` is for tests).
    backend = ScriptedBackend(delay_s=float(os.environ.get("KVGATE_TEST_DELAY_S", "0")), keep_calls=False)
    app = create_app(Settings(), backend_factory=lambda settings: backend)
    uvicorn.run(
        app, host="127.0.0.1", port=port, log_level="warning", lifespan="on", timeout_keep_alive=KEEP_ALIVE_S
    )


if __name__ == "__main__":
    main(int(sys.argv[1]))
