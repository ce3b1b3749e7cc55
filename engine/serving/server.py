"""The engine as a process of its own: an `AsyncEngineClient` served over a local unix socket.

With several gateway workers (`kvgate serve --workers N`) one process owns the model, the paged KV cache
and the scheduler, so every worker's misses share one prefix cache and one batch. Each worker holds one
connection and multiplexes its requests over it by request id (`engine.serving.remote_client` is the other end).

Messages (`engine.serving.ipc`, one JSON object per line), worker → engine:
    hello                               → hello {model_name, max_model_len, info}
    generate {id, prompt_token_ids, sampling, cache_salt, priority}
                                        → delta {id, text, token_ids, index, logprobs}* then finished {id,
                                          finish_reason, finish_reasons, usage} or error {id, kind, message, ...}
    abort {id, ack}                     → aborted {ack}, once the request's blocks are free
    metrics {ack}                       → metrics {ack, stats}
A connection that closes (its worker exited) aborts every request it started.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from pathlib import Path
from typing import Any

from engine.engine_config import ContextLengthExceeded
from engine.serving.client import AsyncEngineClient
from engine.serving.events import EngineStopped, Finished
from engine.serving.ipc import (
    MAX_LINE_BYTES,
    ConnectionClosed,
    Message,
    logprobs_to_wire,
    receive,
    sampling_from_wire,
    send,
    stats_to_wire,
)

logger = logging.getLogger("kvgate.engine.server")


class EngineServer:
    """Serves one started `AsyncEngineClient` on `socket_path` until `close()`."""

    def __init__(self, client: AsyncEngineClient, socket_path: Path, info: dict[str, Any]) -> None:
        self.client = client
        self.socket_path = socket_path
        self.info = info
        """Shown to workers in `hello` (the weights format and why, the model folder)."""
        self._server: asyncio.Server | None = None
        self._connections: set[asyncio.Task[None]] = set()

    async def start(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            self.socket_path.unlink()  # left by an engine process that was killed
        self._server = await asyncio.start_unix_server(
            self._serve_connection, path=str(self.socket_path), limit=MAX_LINE_BYTES
        )
        self.socket_path.chmod(0o600)

    async def close(self) -> None:
        """Stop listening, drop every connection (their requests are aborted), stop the engine."""
        if self._server is not None:
            self._server.close()
        for task in list(self._connections):
            task.cancel()
        await asyncio.gather(*self._connections, return_exceptions=True)
        await self.client.shutdown()
        with contextlib.suppress(FileNotFoundError):
            self.socket_path.unlink()

    async def _serve_connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._connections.add(task)
        connection = _Connection(self.client, writer, self.info)
        try:
            while True:
                await connection.handle(await receive(reader))
        except (ConnectionClosed, ConnectionError, asyncio.CancelledError):
            pass
        except Exception:
            logger.exception("dropping a worker connection after a bad message")
        finally:
            await connection.abort_all()
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()
            self._connections.discard(task)


class _Connection:
    """One worker's requests: a task per generation, writing its events back on the shared socket."""

    def __init__(self, client: AsyncEngineClient, writer: asyncio.StreamWriter, info: dict[str, Any]) -> None:
        self.client = client
        self.writer = writer
        self.info = info
        self.generations: dict[str, asyncio.Task[None]] = {}
        self._aborts: set[asyncio.Task[None]] = set()
        self._send_lock = asyncio.Lock()

    async def handle(self, message: Message) -> None:
        op = message.get("op")
        if op == "generate":
            request_id = str(message["id"])
            self.generations[request_id] = asyncio.create_task(self._generate(request_id, message))
        elif op == "abort":
            # In a task, so the read loop never waits for the engine to free a request; created after the
            # request's own task (asyncio runs tasks in order), so the engine sees the request first.
            task = asyncio.create_task(self._abort_and_ack(str(message["id"]), message.get("ack")))
            self._aborts.add(task)
            task.add_done_callback(self._aborts.discard)
        elif op == "metrics":
            await self.send({"op": "metrics", "ack": message.get("ack"), "stats": self._stats()})
        elif op == "hello":
            await self.send(
                {
                    "op": "hello",
                    "model_name": self.client.model_name,
                    "max_model_len": self.client.max_model_len,
                    "info": self.info,
                }
            )
        else:
            raise ValueError(f"unknown op {op!r}")

    async def send(self, message: Message) -> None:
        async with self._send_lock:
            await send(self.writer, message)

    async def abort_all(self) -> None:
        """The worker is gone: stop reading its streams (which frees them in the engine) and abort."""
        for task in list(self._aborts):
            task.cancel()
        for request_id, task in list(self.generations.items()):
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            await self.client.abort(request_id)

    async def _abort_and_ack(self, request_id: str, ack: object) -> None:
        """Abort, wait until the request's last event ("finished", reason abort) has been sent, then ack."""
        await self.client.abort(request_id)
        task = self.generations.get(request_id)
        if task is not None:
            await asyncio.gather(task, return_exceptions=True)
        with contextlib.suppress(ConnectionError):
            await self.send({"op": "aborted", "ack": ack})

    async def _generate(self, request_id: str, message: Message) -> None:
        try:
            events = self.client.generate(
                request_id,
                [int(token) for token in message["prompt_token_ids"]],
                sampling=sampling_from_wire(message["sampling"]),
                cache_salt=message.get("cache_salt"),
                priority=int(message.get("priority", 0)),
            )
            async for event in events:
                if isinstance(event, Finished):
                    finished: Message = {"op": "finished", "id": request_id}
                    finished["finish_reason"] = event.finish_reason
                    if event.finish_reasons:  # several choices
                        finished["finish_reasons"] = list(event.finish_reasons)
                    finished["usage"] = {
                        "prompt_tokens": event.prompt_tokens,
                        "completion_tokens": event.completion_tokens,
                        "cached_tokens": event.cached_tokens,
                    }
                    await self.send(finished)
                else:
                    delta: Message = {"op": "delta", "id": request_id, "text": event.text}
                    delta["token_ids"] = event.token_ids
                    if event.index:
                        delta["index"] = event.index
                    if event.logprobs:
                        delta["logprobs"] = logprobs_to_wire(event.logprobs)
                    await self.send(delta)
        except asyncio.CancelledError:
            raise
        except ContextLengthExceeded as error:
            await self._send_error(
                request_id,
                "context_length",
                str(error),
                num_prompt_tokens=error.num_prompt_tokens,
                max_model_len=error.max_model_len,
            )
        except EngineStopped as error:
            await self._send_error(request_id, "stopped", str(error))
        except ValueError as error:
            await self._send_error(request_id, "value", str(error))
        except Exception as error:
            await self._send_error(request_id, "engine", f"engine step failed: {error!r}")
        finally:
            if self.generations.get(request_id) is asyncio.current_task():
                del self.generations[request_id]

    async def _send_error(self, request_id: str, kind: str, text: str, **fields: Any) -> None:
        with contextlib.suppress(ConnectionError):
            await self.send({"op": "error", "id": request_id, "kind": kind, "message": text, **fields})

    def _stats(self) -> Message:
        return stats_to_wire(self.client.metrics)
