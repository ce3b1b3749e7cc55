"""One generation in flight, shared by every client asking the same thing at once (request coalescing).

A `Flight` runs the backend in its own task and records every event; subscribers replay what they missed
and then follow live. The generation is aborted only when the last subscriber leaves before it ends, so
one impatient client never cancels an answer others are waiting for.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from collections.abc import AsyncGenerator, Awaitable, Callable

from gateway.backends.protocol import Backend, Finished, GenerationEvent, GenerationRequest, Routed

logger = logging.getLogger("kvgate.flight")

BeforeFinish = Callable[["Flight", Finished], Awaitable[None]]
"""Awaited before the final event is published (the answer is stored here, so a client that has
its answer can count on the next identical request finding it)."""
OnDone = Callable[["Flight"], Awaitable[None]]
"""Awaited once when the generation ends, with or without an error."""


class Flight:
    """A backend generation with a replayable event log and reference-counted subscribers."""

    def __init__(
        self, backend: Backend, request: GenerationRequest, before_finish: BeforeFinish, on_done: OnDone
    ) -> None:
        self.backend = backend
        self.request = request
        self.events: list[GenerationEvent] = []
        self.error: BaseException | None = None
        self.started = time.monotonic()
        self.duration_s = 0.0
        self.first_token_s: float | None = None
        self.answered_by: str | None = None
        """The pool member that answers (a fleet says so in its first event; None for one backend)."""
        self._before_finish = before_finish
        self._on_done = on_done
        self._changed = asyncio.Condition()
        self._subscribers = 0
        self._done = False
        self._task = asyncio.create_task(self._run(), name=f"flight-{request.request_id}")

    @property
    def done(self) -> bool:
        return self._done

    @property
    def finished(self) -> Finished | None:
        last = self.events[-1] if self.events else None
        return last if isinstance(last, Finished) else None

    async def follow(self) -> AsyncGenerator[GenerationEvent, None]:
        """Every event from the start, then live ones; re-raises the generation's error."""
        self._subscribers += 1
        position = 0
        try:
            while True:
                async with self._changed:
                    await self._changed.wait_for(functools.partial(self._has_news, position))
                while position < len(self.events):
                    event = self.events[position]
                    position += 1
                    yield event
                if self._done:
                    if self.error is not None:
                        raise self.error
                    return
        finally:
            self._subscribers -= 1
            if self._subscribers == 0 and not self._done:
                await self._cancel()

    def _has_news(self, position: int) -> bool:
        return position < len(self.events) or self._done

    async def _run(self) -> None:
        try:
            async for event in self.backend.generate(self.request):
                if isinstance(event, Routed):  # for the response's header, never for a client
                    self.answered_by = event.backend
                    continue
                if self.first_token_s is None:
                    self.first_token_s = time.monotonic() - self.started
                if isinstance(event, Finished):
                    self.duration_s = time.monotonic() - self.started
                    try:
                        await self._before_finish(self, event)
                    except Exception:
                        logger.exception("finishing %s failed", self.request.request_id)
                await self._publish(event)
        except asyncio.CancelledError:
            self.error = ConnectionAbortedError("generation aborted: every client left")
        except Exception as error:
            self.error = error
        finally:
            self.duration_s = self.duration_s or time.monotonic() - self.started
            async with self._changed:
                self._done = True
                self._changed.notify_all()
        try:
            await self._on_done(self)
        except Exception:
            logger.exception("releasing %s failed", self.request.request_id)

    async def _publish(self, event: GenerationEvent) -> None:
        async with self._changed:
            self.events.append(event)
            self._changed.notify_all()

    async def _cancel(self) -> None:
        self._task.cancel()
        with contextlib.suppress(Exception):
            await self.backend.abort(self.request.request_id)
