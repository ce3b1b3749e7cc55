"""What the supervisor of `kvgate serve --workers N` tells each child it starts, and where they meet.

A child is `python -m gateway.http.worker_process <plan>` or `python -m gateway.backends.engine_process <plan>`, the plan
one JSON argument; settings come from the same environment as the supervisor's. Everything the processes
share lives in one run directory: the engine's socket, one socket per worker, and the Prometheus
multiprocess files.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Literal

ENGINE_SOCKET = "engine.sock"
METRICS_DIR = "metrics"


@dataclass(frozen=True, slots=True)
class ProcessPlan:
    kind: Literal["engine", "worker"]
    run_dir: Path
    workers: int
    index: int = 0
    listen_fd: int | None = None
    """The listening socket every worker accepts on (inherited from the supervisor)."""
    store_url: str | None = None
    """The supervisor's embedded store (the supervisor keeps it running); None: the configured Redis."""
    host: str | None = None
    port: int | None = None
    """`kvgate serve --host/--port`, which override the settings as in a single process."""

    @property
    def engine_socket(self) -> Path:
        return self.run_dir / ENGINE_SOCKET

    @property
    def metrics_dir(self) -> Path:
        return self.run_dir / METRICS_DIR

    def to_json(self) -> str:
        return json.dumps(asdict(self) | {"run_dir": str(self.run_dir)})

    @classmethod
    def from_json(cls, text: str) -> ProcessPlan:
        data = json.loads(text)
        return cls(**(data | {"run_dir": Path(data["run_dir"])}))
