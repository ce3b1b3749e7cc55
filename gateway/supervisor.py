"""`kvgate serve --workers N`: one supervisor owning the embedded store, one engine process and N workers.

    supervisor ── embedded store (valkey-server; none with KVGATE_REDIS_URL)
               ── engine process (model, paged KV cache, scheduler; none in reverse-proxy mode)
               ── worker 0 … N-1 (HTTP + the whole cache path, accepting on one shared listening socket)

Children start in that order, each once the one before answers; the supervisor reports ready when every
worker answers its ping. A child that exits is started again (with back-off); a worker's Prometheus gauges
are dropped with it. SIGTERM or SIGINT drains: the workers first (uvicorn finishes the requests it has
accepted, streams included), then the engine, then the store. Every child is told to die with the
supervisor (PR_SET_PDEATHSIG), so none outlives `kill -9` of it. The supervisor itself is a plain
synchronous loop: it holds no model, no index and no event loop.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path
from types import FrameType

from prometheus_client import multiprocess

from engine import ask_blocking
from gateway.http.worker_peers import ping, worker_socket
from gateway.runtime.embedded_store import EmbeddedStore, die_with_parent
from gateway.runtime.process_plan import ENGINE_SOCKET, ProcessPlan
from gateway.runtime.settings import Settings

logger = logging.getLogger("kvgate.supervisor")

POLL_S = 0.2
ENGINE_START_TIMEOUT_S = 900.0  # the first start converts the GGUF and measures the weights formats
WORKER_START_TIMEOUT_S = 300.0
DRAIN_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 15.0
RESTART_BACKOFF_S = 0.5
RESTART_BACKOFF_CAP_S = 10.0
STABLE_S = 30.0  # a child up this long has recovered: its next crash restarts it without waiting
LISTEN_BACKLOG = 2048


class SupervisorError(RuntimeError):
    """A child could not be started at all (its log says why)."""


@dataclass(slots=True)
class Child:
    name: str
    module: str
    plan: ProcessPlan
    process: subprocess.Popen[bytes] | None = None
    restarts: int = 0
    started_at: float = 0.0
    next_start: float = 0.0
    backoff_s: float = field(default=RESTART_BACKOFF_S)

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None


class Supervisor:
    def __init__(self, settings: Settings, workers: int, host: str | None, port: int | None) -> None:
        self.settings = settings
        self.workers = workers
        self.host = host or settings.host
        self.port = port or settings.port
        self.run_dir = settings.data_dir / "run"
        self.store: EmbeddedStore | None = None
        self.engine: Child | None = None
        self.children: list[Child] = []
        self._listener: socket.socket | None = None
        self._owns_run_dir = False
        self._stopping = False

    def run(self) -> None:
        """Start everything, keep it running until SIGTERM/SIGINT, then drain and stop it all."""
        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, self._stop_requested)
        try:
            self._start()
            if not self._stopping:
                self._watch()
        finally:
            self._shutdown()

    # Start-up -----------------------------------------------------------------------------------

    def _start(self) -> None:
        # Bound now, so a port in use fails at once; listening only once the workers are about to accept.
        family = socket.AF_INET6 if ":" in self.host else socket.AF_INET
        self._listener = socket.socket(family, socket.SOCK_STREAM)
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind((self.host, self.port))
        store_url = None
        if self.settings.redis_url is None:
            self.store = EmbeddedStore(self.settings.store_dir)
            self.store.start()  # refuses a data dir whose store another kvgate already serves
            store_url = self.store.url
        self._prepare_run_dir()
        base = ProcessPlan(
            "worker", self.run_dir, self.workers, store_url=store_url, host=self.host, port=self.port
        )
        if not self.settings.reverse_proxy:
            self.engine = Child("engine", "gateway.backends.engine_process", replace(base, kind="engine"))
            self._spawn(self.engine)
            self._wait_ready(self.engine, ENGINE_START_TIMEOUT_S, lambda: _engine_answers(base.engine_socket))
            if self._stopping:
                return
        self._listener.listen(LISTEN_BACKLOG)
        self._listener.set_inheritable(True)
        fd = self._listener.fileno()
        for index in range(self.workers):
            plan = replace(base, index=index, listen_fd=fd)
            self.children.append(Child(f"worker {index}", "gateway.http.worker_process", plan))
        for child in self.children:
            self._spawn(child)
        for child in self.children:
            self._wait_ready(child, WORKER_START_TIMEOUT_S, partial(_worker_answers, self.run_dir, child))
        if self._stopping:
            return
        logger.info(
            "kvgate ready: %d workers on %s:%d, engine=%s, store=%s",
            self.workers,
            self.host,
            self.port,
            "process" if self.engine is not None else "upstream",
            "embedded" if self.store is not None else "external",
        )

    def _prepare_run_dir(self) -> None:
        self.run_dir.mkdir(parents=True, exist_ok=True)
        if _engine_answers(self.run_dir / ENGINE_SOCKET) or any(
            ping(path) is not None for path in self.run_dir.glob("worker-*.sock")
        ):
            raise SupervisorError(
                f"another kvgate already runs with {self.run_dir}; stop it or point KVGATE_DATA_DIR elsewhere"
            )
        for stale in self.run_dir.glob("*.sock"):
            stale.unlink()  # left by a supervisor that was killed
        self._owns_run_dir = True
        metrics_dir = self.run_dir / "metrics"
        shutil.rmtree(metrics_dir, ignore_errors=True)  # counts start from zero with the gateway
        metrics_dir.mkdir()

    def _wait_ready(self, child: Child, timeout_s: float, answers: Callable[[], bool]) -> None:
        deadline = time.monotonic() + timeout_s
        while not self._stopping:
            if not child.running:
                code = child.process.returncode if child.process is not None else None
                raise SupervisorError(f"the {child.name} exited with {code} while starting")
            if answers():
                return
            if time.monotonic() > deadline:
                raise SupervisorError(f"the {child.name} did not become ready within {timeout_s:.0f} s")
            time.sleep(POLL_S)

    def _spawn(self, child: Child) -> None:
        env = dict(os.environ)
        env["PROMETHEUS_MULTIPROC_DIR"] = str(child.plan.metrics_dir)
        pass_fds = (child.plan.listen_fd,) if child.plan.listen_fd is not None else ()
        child.process = subprocess.Popen(
            [sys.executable, "-m", child.module, child.plan.to_json()],
            env=env,
            pass_fds=pass_fds,
            preexec_fn=die_with_parent,
            # A group of its own: Ctrl-C, or `kill` of the supervisor's group, reaches the supervisor only,
            # which stops the children in order (an engine stopped before the workers drain fails them).
            process_group=0,
        )
        child.started_at = time.monotonic()
        logger.info("started the %s (pid %d)", child.name, child.process.pid)

    # Running ------------------------------------------------------------------------------------

    def _watch(self) -> None:
        while not self._stopping:
            time.sleep(POLL_S)
            if self.store is not None and not self.store.running and not self._stopping:
                logger.error("the embedded store exited; starting it again")
                with contextlib.suppress(Exception):
                    self.store.start()
            for child in ([self.engine] if self.engine is not None else []) + self.children:
                if not self._stopping:
                    self._keep_running(child)

    def _keep_running(self, child: Child) -> None:
        now = time.monotonic()
        if child.running:
            if now - child.started_at > STABLE_S:
                child.backoff_s = RESTART_BACKOFF_S
            return
        if child.process is not None:
            code = child.process.returncode
            logger.error(
                "the %s (pid %d) exited with %s; starting it again in %.1f s (restart %d)",
                child.name,
                child.process.pid,
                code,
                child.backoff_s,
                child.restarts + 1,
            )
            if child.plan.kind == "worker":
                multiprocess.mark_process_dead(  # type: ignore[no-untyped-call]
                    child.process.pid, str(child.plan.metrics_dir)
                )
            child.process = None
            child.next_start = now + child.backoff_s
            child.backoff_s = min(2 * child.backoff_s, RESTART_BACKOFF_CAP_S)
        if now >= child.next_start:
            child.restarts += 1
            self._spawn(child)

    # Shutdown -----------------------------------------------------------------------------------

    def _stop_requested(self, signum: int, frame: FrameType | None) -> None:
        if not self._stopping:
            logger.info("signal %d: draining the workers, then stopping the engine and the store", signum)
            self._stopping = True
            return
        logger.warning("signal %d again: killing every child without draining", signum)
        for child in ([self.engine] if self.engine is not None else []) + self.children:
            if child.running and child.process is not None:
                child.process.kill()

    def _shutdown(self) -> None:
        self._stopping = True
        _stop_all(self.children, DRAIN_TIMEOUT_S)  # in-flight requests still need the engine
        if self._listener is not None:
            self._listener.close()
        if self.engine is not None:
            _stop_all([self.engine], STOP_TIMEOUT_S)
        if self.store is not None:
            self.store.stop()
        if self._owns_run_dir:  # never another kvgate's sockets, when this one failed to start beside it
            for leftover in self.run_dir.glob("*.sock"):
                leftover.unlink(missing_ok=True)
        logger.info("kvgate stopped")


def _stop_all(children: list[Child], timeout_s: float) -> None:
    running = [child for child in children if child.running]
    for child in running:
        assert child.process is not None
        child.process.terminate()
    deadline = time.monotonic() + timeout_s
    for child in running:
        assert child.process is not None
        try:
            child.process.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            logger.error("the %s did not stop within %.0f s; killing it", child.name, timeout_s)
            child.process.kill()
            child.process.wait()


def _worker_answers(run_dir: Path, child: Child) -> bool:
    return ping(worker_socket(run_dir, child.plan.index)) is not None


def _engine_answers(path: Path) -> bool:
    reply = ask_blocking(path, {"op": "hello"})
    return reply is not None and reply.get("op") == "hello"
