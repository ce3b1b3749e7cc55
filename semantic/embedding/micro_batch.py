"""Micro-batching for work that runs off the event loop: concurrent callers share one call.

A caller awaits `submit(item)`. The first item to arrive starts a drain task, which waits `max_wait_ms`
for company (0: only for what arrived in the same loop iteration), then runs up to `max_batch` queued
items in one `run_batch` call on a worker thread (the `executor`'s, else asyncio's default); items that
arrive while a batch runs go into the next one. So under load the batch grows with the load, and a lone
caller pays at most `max_wait_ms` extra.

Knows asyncio; knows nothing about what the items are (texts to embed, pairs to verify).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from concurrent.futures import Executor
from typing import Generic, TypeVar

Item = TypeVar("Item")
Result = TypeVar("Result")


class MicroBatcher(Generic[Item, Result]):
    """Collects concurrent `submit` calls into `run_batch(items) -> results` calls on a worker thread."""

    def __init__(
        self,
        run_batch: Callable[[list[Item]], Sequence[Result]],
        max_batch: int = 64,
        max_wait_ms: float = 1.0,
        executor: Executor | None = None,
    ) -> None:
        if max_batch <= 0 or max_wait_ms < 0:
            raise ValueError("max_batch must be positive and max_wait_ms not negative")
        self.run_batch = run_batch
        self.executor = executor
        self.max_batch = max_batch
        self.max_wait_s = max_wait_ms / 1000
        self._queue: list[tuple[Item, asyncio.Future[Result]]] = []
        self._drain: asyncio.Task[None] | None = None
        self.batch_sizes: list[int] = []  # the last few batch sizes, for tests and metrics

    async def submit(self, item: Item) -> Result:
        """The result for `item`, computed with whatever other items are waiting."""
        future: asyncio.Future[Result] = asyncio.get_running_loop().create_future()
        self._queue.append((item, future))
        if self._drain is None or self._drain.done():
            self._drain = asyncio.create_task(self._run())
        return await future

    async def close(self) -> None:
        """Stop the drain task; callers still queued get `asyncio.CancelledError`."""
        if self._drain is not None:
            self._drain.cancel()
            await asyncio.gather(self._drain, return_exceptions=True)
        for _, future in self._queue:
            future.cancel()
        self._queue.clear()

    async def _run(self) -> None:
        while self._queue:
            if len(self._queue) < self.max_batch and self.max_wait_s > 0:
                await asyncio.sleep(self.max_wait_s)
            batch, self._queue = self._queue[: self.max_batch], self._queue[self.max_batch :]
            batch = [(item, future) for item, future in batch if not future.done()]  # skip cancelled
            if not batch:
                continue
            self.batch_sizes = [*self.batch_sizes[-63:], len(batch)]
            try:
                items = [item for item, _ in batch]
                loop = asyncio.get_running_loop()
                results = await loop.run_in_executor(self.executor, self.run_batch, items)
            except Exception as error:  # every caller of the batch sees the error
                for _, future in batch:
                    if not future.done():
                        future.set_exception(error)
                continue
            for (_, future), result in zip(batch, results, strict=True):
                if not future.done():
                    future.set_result(result)
