"""The engine process as one worker sees it: the same surface as `AsyncEngineClient`, over a unix socket.

`generate` streams `TextDelta`s and one `Finished`; `abort` returns once the engine has freed the
sequence; a consumer that stops iterating (client disconnect) aborts its sequence, exactly as in process.
Tokenizing happens here, in the worker, with the model folder's own tokenizer, so the engine process only
ever sees token ids.

While the engine process is unreachable (it died and the supervisor is starting it again) every call raises
`EngineUnavailable` at once, streams in flight end with it, and a background task reconnects; nothing waits
on a dead socket.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable, Mapping
from collections.abc import Sequence as SequenceOf
from pathlib import Path
from typing import Any

from engine.engine_config import ContextLengthExceeded
from engine.metrics import ITL_BUCKETS, TTFT_BUCKETS, EngineStats, Histogram
from engine.sampler import SamplingParams
from engine.serving.client import encode_chat, encode_prompt
from engine.serving.events import EngineError, EngineEvent, EngineStopped, Finished, TextDelta
from engine.serving.ipc import (
    ConnectionClosed,
    Message,
    logprobs_from_wire,
    open_connection,
    receive,
    sampling_to_wire,
    send,
    stats_from_wire,
)

logger = logging.getLogger("kvgate.engine.remote")

RECONNECT_INTERVAL_S = 0.25
REPLY_TIMEOUT_S = 5.0


class EngineUnavailable(EngineStopped):
    """The engine process cannot be reached now (it is starting, or starting again after a crash)."""


class RemoteEngineClient:
    """One connection to the engine process; `await connect()` it, `await shutdown()` it."""

    def __init__(self, socket_path: Path, load_tokenizer: Callable[[Path], Any]) -> None:
        self.socket_path = socket_path
        self._load_tokenizer = load_tokenizer
        self.tokenizer: Any = None
        self.model_name = ""
        self.max_model_len = 0
        self.info: dict[str, Any] = {}
        """What the engine process said about itself in `hello` (weights format, model folder)."""
        self._writer: asyncio.StreamWriter | None = None
        self._reader_task: asyncio.Task[None] | None = None
        self._reconnect_task: asyncio.Task[None] | None = None
        self._streams: dict[str, asyncio.Queue[EngineEvent | BaseException]] = {}
        self._replies: dict[int, asyncio.Future[Message]] = {}
        self._next_ack = 0
        self._send_lock = asyncio.Lock()
        self._stats = _empty_stats()
        self._closed = False

    @property
    def connected(self) -> bool:
        return self._writer is not None

    async def connect(self, timeout_s: float) -> None:
        """Connect and learn the model (retrying until `timeout_s`: the engine may still be loading)."""
        deadline = asyncio.get_running_loop().time() + timeout_s
        while True:
            try:
                await self._open()
                break
            except (OSError, ConnectionClosed) as error:
                if asyncio.get_running_loop().time() > deadline:
                    raise EngineUnavailable(f"no engine at {self.socket_path}: {error}") from error
                await asyncio.sleep(RECONNECT_INTERVAL_S)
        if self.tokenizer is None:
            self.tokenizer = await asyncio.to_thread(self._load_tokenizer, Path(self.info["folder"]))

    async def shutdown(self) -> None:
        self._closed = True
        for task in (self._reconnect_task, self._reader_task):
            if task is not None:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
        self._disconnected(EngineStopped("the engine client is shut down"))

    # Requests -----------------------------------------------------------------------------------

    async def generate(
        self,
        request_id: str,
        prompt_token_ids: SequenceOf[int],
        *,
        sampling: SamplingParams | None = None,
        cache_salt: str | None = None,
        priority: int = 0,
    ) -> AsyncIterator[EngineEvent]:
        """Stream one completion of token ids from the engine process."""
        if request_id in self._streams:
            raise ValueError(f"request id {request_id!r} is already running")
        events: asyncio.Queue[EngineEvent | BaseException] = asyncio.Queue()
        self._streams[request_id] = events
        finished = False
        try:
            await self._send(
                {
                    "op": "generate",
                    "id": request_id,
                    "prompt_token_ids": list(prompt_token_ids),
                    "sampling": sampling_to_wire(sampling or SamplingParams()),
                    "cache_salt": cache_salt,
                    "priority": priority,
                }
            )
            while True:
                item = await events.get()
                if isinstance(item, BaseException):
                    finished = True
                    raise item
                yield item
                if isinstance(item, Finished):
                    finished = True
                    return
        finally:
            self._streams.pop(request_id, None)
            if not finished and self.connected:  # the consumer left: free the sequence in the engine
                with contextlib.suppress(Exception):
                    await self._send({"op": "abort", "id": request_id})

    async def abort(self, request_id: str) -> None:
        """Cancel a request; returns once the engine freed its blocks. A no-op when disconnected."""
        if self.connected:
            with contextlib.suppress(EngineStopped, TimeoutError):
                await self._ask({"op": "abort", "id": request_id})

    def encode_chat(self, messages: SequenceOf[Mapping[str, Any]]) -> list[int]:
        return encode_chat(self.tokenizer, messages)

    def encode_prompt(self, text: str) -> list[int]:
        return encode_prompt(self.tokenizer, text)

    @property
    def metrics(self) -> EngineStats:
        """The engine's metrics as of the last `refresh_metrics()`."""
        return self._stats

    async def refresh_metrics(self) -> EngineStats:
        """Read the engine's metrics now (the last reading if it does not answer)."""
        with contextlib.suppress(EngineStopped, TimeoutError):
            self._stats = stats_from_wire((await self._ask({"op": "metrics"}))["stats"])
        return self._stats

    # Connection ---------------------------------------------------------------------------------

    async def _open(self) -> None:
        reader, writer = await open_connection(str(self.socket_path))
        try:
            await send(writer, {"op": "hello"})
            hello = await asyncio.wait_for(receive(reader), REPLY_TIMEOUT_S)
            model_name, max_model_len = str(hello["model_name"]), int(hello["max_model_len"])
            info = dict(hello.get("info") or {})
        except (KeyError, TypeError, ValueError) as error:
            writer.close()
            raise ConnectionClosed(f"not an engine's hello: {error!r}") from error
        except BaseException:
            writer.close()
            raise
        self.model_name, self.max_model_len, self.info = model_name, max_model_len, info
        self._writer = writer
        self._reader_task = asyncio.create_task(self._read(reader, writer), name="engine-connection")

    async def _read(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                self._dispatch(await receive(reader))
        except (ConnectionClosed, OSError, ValueError, KeyError, TypeError) as error:
            if not self._closed:  # a bad message is treated as a lost engine: reconnecting resynchronises
                logger.error("lost the engine process (%r); misses answer 503 until it is back", error)
        finally:
            writer.close()
            if self._writer is writer:
                self._disconnected(EngineUnavailable("the engine process is not running"))
                if not self._closed:
                    self._reconnect_task = asyncio.create_task(self._reconnect(), name="engine-reconnect")

    async def _reconnect(self) -> None:
        while not self._closed:
            await asyncio.sleep(RECONNECT_INTERVAL_S)
            try:
                await self._open()
            except (OSError, ConnectionClosed, TimeoutError):
                continue
            logger.info("the engine process is back at %s", self.socket_path)
            return

    def _disconnected(self, error: EngineStopped) -> None:
        self._writer = None
        for events in self._streams.values():
            events.put_nowait(error)
        for future in self._replies.values():
            if not future.done():
                future.set_exception(error)
        self._replies.clear()

    def _dispatch(self, message: Message) -> None:
        op = message["op"]
        if op in ("aborted", "metrics"):
            ack = message.get("ack")
            future = self._replies.pop(int(ack), None) if ack is not None else None
            if future is not None and not future.done():
                future.set_result(message)
            return
        events = self._streams.get(str(message["id"]))
        if events is None:
            return  # a stream whose consumer already left
        if op == "delta":
            logprobs = logprobs_from_wire(message.get("logprobs") or [])
            index = int(message.get("index", 0))
            events.put_nowait(TextDelta(str(message["text"]), tuple(message["token_ids"]), index, logprobs))
        elif op == "finished":
            reasons = tuple(message.get("finish_reasons") or ())
            events.put_nowait(Finished(message["finish_reason"], **message["usage"], finish_reasons=reasons))
        elif op == "error":
            events.put_nowait(_error(message))

    async def _send(self, message: Message) -> None:
        writer = self._writer
        if writer is None:
            raise EngineUnavailable("the engine process is not running")
        try:
            async with self._send_lock:
                await send(writer, message)
        except (ConnectionError, OSError) as error:
            raise EngineUnavailable(f"the engine process went away: {error}") from error

    async def _ask(self, message: Message) -> Message:
        self._next_ack += 1
        ack = self._next_ack
        future: asyncio.Future[Message] = asyncio.get_running_loop().create_future()
        self._replies[ack] = future
        try:
            await self._send({**message, "ack": ack})
            return await asyncio.wait_for(future, REPLY_TIMEOUT_S)
        finally:
            self._replies.pop(ack, None)


def _error(message: Message) -> Exception:
    kind, text = message.get("kind"), str(message.get("message", ""))
    if kind == "context_length":
        return ContextLengthExceeded(int(message["num_prompt_tokens"]), int(message["max_model_len"]))
    if kind == "value":
        return ValueError(text)
    if kind == "stopped":
        return EngineUnavailable(text)
    return EngineError(text)


def _empty_stats() -> EngineStats:
    return EngineStats(
        num_running=0,
        num_waiting=0,
        kv_cache_usage=0.0,
        prefix_cache_queries=0,
        prefix_cache_hits=0,
        num_preemptions=0,
        prompt_tokens=0,
        generation_tokens=0,
        finished={},
        time_to_first_token=Histogram(TTFT_BUCKETS),
        inter_token_latency=Histogram(ITL_BUCKETS),
    )
