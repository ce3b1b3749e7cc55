"""Start, SIGKILL and restart real kvgate processes (`kvgate_proc.py`) from a test or a bench."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from tests.reliability.redis_proc import free_port

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = Path(__file__).with_name("kvgate_proc.py")
ADMIN_TOKEN = "admin-secret-token"
KEYS = "key-alpha:alpha,key-beta:beta"


@dataclass
class KvgateProcess:
    """One kvgate OS process on its own loopback port, sharing `redis_url` with its siblings."""

    redis_url: str
    data_dir: Path
    env: dict[str, str] = field(default_factory=dict)
    port: int = field(default_factory=free_port)
    process: subprocess.Popen[bytes] | None = None
    stderr_path: Path | None = (
        None  # where the process's stderr (its warnings and errors) goes; None: dropped
    )

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def launch(self) -> None:
        """Start the process; `wait_ready` blocks until it serves (several can start at once)."""
        env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
        env |= {
            "KVGATE_REDIS_URL": self.redis_url,
            "KVGATE_DATA_DIR": str(self.data_dir),
            "KVGATE_API_KEYS": KEYS,
            "KVGATE_ADMIN_TOKEN": ADMIN_TOKEN,
        }
        stderr = self.stderr_path.open("ab") if self.stderr_path is not None else subprocess.DEVNULL
        try:
            self.process = subprocess.Popen(
                [sys.executable, str(SCRIPT), str(self.port)],
                cwd=ROOT,
                env=env | self.env,
                stdout=subprocess.DEVNULL,
                stderr=stderr,
            )
        finally:
            if self.stderr_path is not None:
                stderr.close()  # type: ignore[union-attr]

    def wait_ready(self, timeout_s: float = 120.0) -> None:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                if httpx.get(f"{self.base}/readyz", timeout=1.0).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            if self.process is None or self.process.poll() is not None:
                raise RuntimeError(f"kvgate on port {self.port} exited before it was ready")
            if time.monotonic() > deadline:
                raise RuntimeError(f"kvgate on port {self.port} was not ready within {timeout_s} s")
            time.sleep(0.1)

    def kill(self) -> None:
        """SIGKILL: no lifespan shutdown, nothing flushed."""
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait(timeout=10)
        self.process = None


def start_all(processes: list[KvgateProcess]) -> None:
    for process in processes:
        process.launch()
    for process in processes:
        process.wait_ready()
