"""The engine as the gateway sees it: `generate` streams text deltas, `abort` cancels, off the event loop.

`LLMEngine` is synchronous and owns the model, so one background thread runs its step loop. Requests and
aborts reach that thread through a thread-safe command queue; its outputs come back to each request's
event loop with `loop.call_soon_threadsafe`, into an `asyncio.Queue` per request. The event loop never
waits on a forward pass, and every engine structure (scheduler, block manager) is touched by one thread.

A stream yields `TextDelta`s (each of one choice, `index`, with the logprobs of its tokens when asked) and
ends with exactly one `Finished` (finish_reason "stop", "length", or "abort" when `abort` cancelled it; with
`n > 1` choices, `finish_reasons` has each choice's and the token counts take the prompt once and every
choice's tokens). Problems known before scheduling raise from the first iteration:
`ContextLengthExceeded` (the gateway's 400 `context_length_exceeded`), ValueError for a bad prompt or a
duplicate request id, `EngineStopped` once the client is shut down.
"""

from __future__ import annotations

import asyncio
import contextlib
import queue
import threading
import time
from collections.abc import AsyncIterator, Mapping
from collections.abc import Sequence as SequenceOf
from dataclasses import dataclass, field
from typing import Any

from engine.engine import LLMEngine, build_engine
from engine.engine_config import ContextLengthExceeded, EngineConfig
from engine.metrics import EngineStats
from engine.request_output import RequestOutput
from engine.sampler import SamplingParams
from engine.sequence import FinishReason
from engine.serving.events import EngineError, EngineEvent, EngineStopped, Finished, TextDelta
from engine.weights.loader import LoadedModel

__all__ = [
    "AsyncEngineClient",
    "ContextLengthExceeded",
    "EngineError",
    "EngineStopped",
    "Finished",
    "TextDelta",
]


@dataclass(slots=True)
class _Stream:
    loop: asyncio.AbstractEventLoop
    events: asyncio.Queue[EngineEvent | BaseException]
    choices: dict[int, tuple[FinishReason | None, int]] = field(default_factory=dict)
    """Each choice seen so far: its finish reason (None while running) and its completion tokens."""

    def put(self, item: EngineEvent | BaseException) -> None:
        with contextlib.suppress(RuntimeError):  # the caller's loop is closed: nobody is listening
            self.loop.call_soon_threadsafe(self.events.put_nowait, item)

    def finished(self, output: RequestOutput) -> Finished:
        """The request's end, from its last output and what its other choices reported before."""
        self.choices[output.index] = (output.finish_reason, output.completion_tokens)
        reason = output.finish_reason or "abort"
        reasons = tuple(
            self.choices.get(index, (None, 0))[0] or reason for index in range(max(self.choices) + 1)
        )
        completion_tokens = sum(tokens for _, tokens in self.choices.values())
        several = reasons if len(reasons) > 1 else ()
        return Finished(reasons[0], output.prompt_tokens, completion_tokens, output.cached_tokens, several)


@dataclass(frozen=True, slots=True)
class _Add:
    request_id: str
    prompt_token_ids: list[int]
    sampling: SamplingParams
    cache_salt: str | None
    priority: int
    arrival_time: float
    stream: _Stream


@dataclass(frozen=True, slots=True)
class _Abort:
    request_id: str
    done: tuple[asyncio.AbstractEventLoop, asyncio.Future[None]] | None


class _Stop:
    pass


class AsyncEngineClient:
    """Async front of one `LLMEngine`; `start()` it, `await shutdown()` it."""

    def __init__(self, engine: LLMEngine, tokenizer: Any | None = None) -> None:
        self.engine = engine
        self.tokenizer = tokenizer if tokenizer is not None else engine.tokenizer
        self.model_name = engine.model_name
        self.max_model_len = engine.max_model_len
        self.info: dict[str, Any] = {}
        """What this engine says about itself (`build_engine` puts its weights choice and model folder here); the
        engine process sends it to the workers, whose `RemoteEngineClient.info` it becomes."""
        self._commands: queue.SimpleQueue[_Add | _Abort | _Stop] = queue.SimpleQueue()
        self._streams: dict[str, _Stream] = {}  # owned by the engine thread
        self._thread: threading.Thread | None = None
        self._stopped = False

    @classmethod
    def from_loaded(
        cls, loaded: LoadedModel, model_name: str, config: EngineConfig | None = None
    ) -> AsyncEngineClient:
        return cls(build_engine(loaded, model_name, config), loaded.tokenizer)

    # Lifecycle ----------------------------------------------------------------------------------

    def start(self) -> None:
        if self._thread is not None:
            return
        self._thread = threading.Thread(target=self._run, name="kvgate-engine", daemon=True)
        self._thread.start()

    async def connect(self, timeout_s: float) -> None:
        """Nothing to reach in process (`RemoteEngineClient` connects here)."""

    @property
    def connected(self) -> bool:
        """Always: an engine in this process cannot be unreachable (a stopped one raises `EngineStopped`)."""
        return True

    async def shutdown(self) -> None:
        """Stop the step loop; requests still running end with finish_reason "abort"."""
        if self._thread is None or self._stopped:
            self._stopped = True
            return
        self._stopped = True
        self._commands.put(_Stop())
        await asyncio.get_running_loop().run_in_executor(None, self._thread.join)

    # Requests -----------------------------------------------------------------------------------

    async def generate(
        self,
        request_id: str,
        prompt_token_ids: SequenceOf[int] | None = None,
        *,
        messages: SequenceOf[Mapping[str, Any]] | None = None,
        sampling: SamplingParams | None = None,
        cache_salt: str | None = None,
        priority: int = 0,
    ) -> AsyncIterator[EngineEvent]:
        """Stream one completion of token ids or chat messages (exactly one of them)."""
        if (prompt_token_ids is None) == (messages is None):
            raise ValueError("pass exactly one of prompt_token_ids and messages")
        token_ids = (
            list(prompt_token_ids) if prompt_token_ids is not None else self.encode_chat(messages or [])
        )
        self.engine.check_prompt(token_ids)  # reads only immutable engine settings: safe off-thread
        if self._thread is None or self._stopped:
            raise EngineStopped("the engine client is not running")
        stream = _Stream(asyncio.get_running_loop(), asyncio.Queue())
        sampling = sampling or SamplingParams()
        self._commands.put(
            _Add(request_id, token_ids, sampling, cache_salt, priority, time.monotonic(), stream)
        )
        finished = False
        try:
            while True:
                item = await stream.events.get()
                if isinstance(item, BaseException):
                    finished = True
                    raise item
                yield item
                if isinstance(item, Finished):
                    finished = True
                    return
        finally:
            if not finished:  # the consumer went away (client disconnect, cancellation): free it
                self._commands.put(_Abort(request_id, None))

    async def abort(self, request_id: str) -> None:
        """Cancel a request; returns once its blocks are free. A no-op for an unknown or finished one."""
        if self._thread is None or not self._thread.is_alive():
            return
        loop = asyncio.get_running_loop()
        done: asyncio.Future[None] = loop.create_future()
        self._commands.put(_Abort(request_id, (loop, done)))
        await done

    def encode_chat(self, messages: SequenceOf[Mapping[str, Any]]) -> list[int]:
        return encode_chat(self.tokenizer, messages)

    def encode_prompt(self, text: str) -> list[int]:
        return encode_prompt(self.tokenizer, text)

    @property
    def metrics(self) -> EngineStats:
        return self.engine.metrics.snapshot()

    async def refresh_metrics(self) -> EngineStats:
        """The metrics now (in process they are always current)."""
        return self.metrics

    # Engine thread ------------------------------------------------------------------------------

    def _run(self) -> None:
        while True:
            # Idle: sleep until a command arrives. Busy: take what has arrived, then step.
            commands = [self._commands.get()] if not self.engine.has_unfinished() else []
            while True:
                try:
                    commands.append(self._commands.get_nowait())
                except queue.Empty:
                    break
            for command in commands:
                if isinstance(command, _Stop):
                    self._abort_all(None)
                    return
                self._apply(command)
            if self.engine.has_unfinished():
                try:
                    outputs = self.engine.step()
                except Exception as error:  # fail the requests in flight, keep serving new ones
                    self._abort_all(EngineError(f"engine step failed: {error!r}"))
                    continue
                for output in outputs:
                    self._deliver(output)

    def _apply(self, command: _Add | _Abort) -> None:
        if isinstance(command, _Abort):
            output = self.engine.abort(command.request_id)
            if output is not None:
                self._deliver(output)
            if command.done is not None:
                loop, future = command.done
                with contextlib.suppress(RuntimeError):
                    loop.call_soon_threadsafe(_resolve, future)
            return
        try:
            self.engine.add_request(
                command.request_id,
                command.prompt_token_ids,
                command.sampling,
                cache_salt=command.cache_salt,
                priority=command.priority,
                arrival_time=command.arrival_time,
            )
        except Exception as error:
            command.stream.put(error)
            return
        self._streams[command.request_id] = command.stream

    def _deliver(self, output: RequestOutput) -> None:
        stream = self._streams.get(output.request_id)
        if stream is None:
            return
        if output.text or output.token_ids:
            stream.put(TextDelta(output.text, tuple(output.token_ids), output.index, output.logprobs))
        if output.last:
            stream.put(stream.finished(output))
            del self._streams[output.request_id]
        else:
            stream.choices[output.index] = (output.finish_reason, output.completion_tokens)

    def _abort_all(self, error: Exception | None) -> None:
        for request_id in list(self._streams):
            output = self.engine.abort(request_id)
            stream = self._streams.pop(request_id)
            if error is not None:
                stream.put(error)
            elif output is not None:
                stream.put(stream.finished(output))


def encode_chat(tokenizer: Any, messages: SequenceOf[Mapping[str, Any]]) -> list[int]:
    """Prompt token ids of a chat, with the model's own chat template and the assistant turn opened."""
    ids = tokenizer.apply_chat_template(
        [dict(message) for message in messages],
        add_generation_prompt=True,
        tokenize=True,
        return_dict=False,
    )
    return list(ids)


def encode_prompt(tokenizer: Any, text: str) -> list[int]:
    """Prompt token ids of plain text (legacy completions)."""
    return list(tokenizer.encode(text))


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)
