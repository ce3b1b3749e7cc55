"""A real `kvgate serve --workers N` (supervisor, engine process, workers, embedded store) for tests and
benches, with HTTP clients pinned to one worker: a kept-alive connection stays with the worker that
accepted it, and `/healthz` says which one that is."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from gateway.http.worker_peers import ping, worker_socket
from tests.reliability.redis_proc import free_port

ADMIN_TOKEN = "workers-admin-token"
KVGATE = str(Path(sys.executable).with_name("kvgate"))


@dataclass
class Cluster:
    workers: int
    env: dict[str, str] = field(default_factory=dict)
    port: int = field(default_factory=free_port)
    data_dir: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="kvw-", dir="/tmp")))
    process: subprocess.Popen[bytes] | None = None

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def log(self) -> Path:
        return self.data_dir / "kvgate.log"

    @property
    def admin(self) -> dict[str, str]:
        return {"authorization": f"Bearer {ADMIN_TOKEN}"}

    def start(self, timeout_s: float = 600.0) -> Cluster:
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "KVGATE_LOG_FORMAT": "text"}
        env |= {"KVGATE_DATA_DIR": str(self.data_dir), "KVGATE_ADMIN_TOKEN": ADMIN_TOKEN} | self.env
        if "KVGATE_REDIS_URL" not in self.env:
            env.pop("KVGATE_REDIS_URL", None)  # the embedded store, as `make serve` runs
        with self.log.open("ab") as log:
            self.process = subprocess.Popen(
                [KVGATE, "serve", "--workers", str(self.workers), "--port", str(self.port)],
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        deadline = time.monotonic() + timeout_s
        while not self._ready():
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"kvgate --workers did not start:\n{self.log.read_text()[-3000:]}")
            time.sleep(0.5)
        return self

    def _ready(self) -> bool:
        if self.workers > 1:  # every worker answers its ping once its app has started
            run_dir = self.data_dir / "run"
            return all(ping(worker_socket(run_dir, index)) for index in range(self.workers))
        try:
            return httpx.get(self.base + "/readyz", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    @contextmanager
    def pinned(self, worker: int, timeout_s: float = 120.0) -> Iterator[httpx.Client]:
        """A client whose one kept-alive connection was accepted by `worker`."""
        for _ in range(200):
            client = httpx.Client(
                base_url=self.base, timeout=timeout_s, limits=httpx.Limits(max_connections=1)
            )
            workers = client.get("/healthz").json()["workers"]
            if (workers["this"] if workers is not None else 0) == worker:
                try:
                    yield client
                finally:
                    client.close()
                return
            client.close()
        raise AssertionError(f"no connection reached worker {worker} in 200 tries")

    def rss_mb(self) -> dict[str, float]:
        """Resident memory of the supervisor (or the single process) and of each child, by role."""
        assert self.process is not None
        roles = {self.process.pid: "supervisor" if self.workers > 1 else "kvgate"}
        for pid, cmdline in self.children().items():
            if "worker_process" in cmdline:
                roles[pid] = "worker " + cmdline.split('"index": ')[1].split(",")[0]
            else:
                roles[pid] = "engine" if "engine_process" in cmdline else "store"
        return {role: _rss_mb(pid) for pid, role in sorted(roles.items(), key=lambda item: item[1])}

    def children(self) -> dict[int, str]:
        """pid -> command line of every live process the supervisor started (read from /proc)."""
        assert self.process is not None
        found = {}
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                stat = (entry / "stat").read_text()
                cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            except OSError:
                continue
            parent = int(stat.rsplit(")", 1)[1].split()[1])
            state = stat.rsplit(")", 1)[1].split()[0]
            if parent == self.process.pid and state != "Z":
                found[int(entry.name)] = cmdline
        return found

    def child_pid(self, module: str) -> int:
        pids = [pid for pid, cmdline in self.children().items() if module in cmdline]
        assert len(pids) == 1, self.children()
        return pids[0]

    def stop(self, timeout_s: float = 120.0) -> int:
        """SIGTERM the supervisor and wait for it; returns its exit code."""
        assert self.process is not None
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        try:
            return self.process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.process.kill()
            return self.process.wait()


def _rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")
