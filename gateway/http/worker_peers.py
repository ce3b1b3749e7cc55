"""How the workers of one `kvgate serve --workers N` reach each other: a unix socket per worker.

Each worker answers on `<run dir>/worker-<i>.sock` (one JSON object per line, `engine.serving.ipc`): `ping` (the
supervisor's readiness check) and `stats` (its hit-rate tallies and shadow counts). The worker asked for
`/admin/stats` asks every worker, itself included, and reports the sum, so the report counts all traffic
whichever worker a client reached. A worker that does not answer (it is restarting) is left out and the
report says how many answered.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from engine import ConnectionClosed, Message, ask_blocking, open_connection, receive, send
from gateway.observability.shadow import ShadowStats
from gateway.observability.stats import HitStats

if TYPE_CHECKING:  # the supervisor imports `ping`; it must not load the cache path (torch, the embedder)
    from gateway.service import CompletionService

PEER_TIMEOUT_S = 2.0


def worker_socket(run_dir: Path, index: int) -> Path:
    return run_dir / f"worker-{index}.sock"


@dataclass(frozen=True, slots=True)
class ClusterStats:
    stats: HitStats
    shadow: ShadowStats
    workers: int
    answered: int


class PeerServer:
    """This worker's socket for the supervisor and the other workers."""

    def __init__(self, path: Path, service: CompletionService) -> None:
        self.path = path
        self.service = service
        self._server: asyncio.Server | None = None

    async def start(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()
        self._server = await asyncio.start_unix_server(self._serve, path=str(self.path))
        self.path.chmod(0o600)

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                message = await receive(reader)
                reply: Message
                if message.get("op") == "stats":
                    reply = {
                        "op": "stats",
                        "stats": self.service.stats.export(),
                        "shadow": asdict(self.service.shadow),
                    }
                else:
                    reply = {"op": "pong", "pid": os.getpid()}
                await send(writer, reply)
        except (ConnectionClosed, ConnectionError, ValueError):
            pass
        finally:
            writer.close()


class WorkerPeers:
    """The sockets of all `workers` workers in `run_dir`."""

    def __init__(self, run_dir: Path, workers: int) -> None:
        self.run_dir = run_dir
        self.workers = workers

    async def stats(self) -> ClusterStats:
        """Every answering worker's tallies, summed."""
        replies = await asyncio.gather(*(self._ask(index, {"op": "stats"}) for index in range(self.workers)))
        answered = [reply for reply in replies if reply is not None]
        shadow = ShadowStats()
        for reply in answered:
            shadow.merge(ShadowStats(**reply["shadow"]))
        merged = HitStats.merged([reply["stats"] for reply in answered])
        return ClusterStats(merged, shadow, self.workers, len(answered))

    async def _ask(self, index: int, message: Message) -> Message | None:
        try:
            reader, writer = await asyncio.wait_for(
                open_connection(str(worker_socket(self.run_dir, index))), PEER_TIMEOUT_S
            )
        except (OSError, TimeoutError):
            return None
        try:
            await send(writer, message)
            return await asyncio.wait_for(receive(reader), PEER_TIMEOUT_S)
        except (OSError, ConnectionClosed, TimeoutError, ValueError):
            return None
        finally:
            writer.close()


def ping(path: Path, timeout_s: float = 1.0) -> int | None:
    """The pid of the worker answering on `path`, or None (blocking: the supervisor has no event loop)."""
    reply = ask_blocking(path, {"op": "ping"}, timeout_s)
    pid = reply.get("pid") if reply is not None else None
    return pid if isinstance(pid, int) else None
