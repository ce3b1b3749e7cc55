"""Micro-batched, off-loop embedding: concurrent callers share one embedder call.

A caller awaits `embed(text)`. The first text to arrive starts a drain task, which waits
`max_wait_ms` for company, then embeds up to `max_batch` queued texts in one call on a worker thread
(the `executor`'s, else asyncio's default);
texts that arrive while a batch runs go into the next one. So under load the batch grows with the
load, and a lone request pays at most `max_wait_ms` extra.

A text the embedder would truncate (more tokens than its `max_tokens`) gets no vector: its first
`max_tokens` word pieces would stand for all of it and collide with anything sharing them.

Knows the `Embedder` protocol and asyncio; knows nothing about scopes, Redis or FAISS.
"""

from __future__ import annotations

import asyncio
from concurrent.futures import Executor
from dataclasses import dataclass

import numpy as np

from semantic.embedder import Embedder, Vectors


@dataclass(frozen=True, slots=True)
class Embedding:
    """One text's vector (shape (dimension,), unit length), or None when the text is too long."""

    vector: Vectors | None
    num_tokens: int

    @property
    def truncated(self) -> bool:
        return self.vector is None


class EmbedBatcher:
    """Collects concurrent `embed` calls into batches run on a worker thread."""

    def __init__(
        self,
        embedder: Embedder,
        max_batch: int = 64,
        max_wait_ms: float = 1.0,
        executor: Executor | None = None,
    ) -> None:
        if max_batch <= 0 or max_wait_ms < 0:
            raise ValueError("max_batch must be positive and max_wait_ms not negative")
        self.embedder = embedder
        self.executor = executor
        self.max_batch = max_batch
        self.max_wait_s = max_wait_ms / 1000
        self._queue: list[tuple[str, asyncio.Future[Embedding]]] = []
        self._drain: asyncio.Task[None] | None = None
        self.batch_sizes: list[int] = []  # the last few batch sizes, for tests and metrics

    async def embed(self, text: str) -> Embedding:
        """The embedding of `text`, computed with whatever other texts are waiting."""
        future: asyncio.Future[Embedding] = asyncio.get_running_loop().create_future()
        self._queue.append((text, future))
        if self._drain is None or self._drain.done():
            self._drain = asyncio.create_task(self._run())
        return await future

    async def close(self) -> None:
        """Stop the drain task; waiters still queued get `asyncio.CancelledError`."""
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
            batch = [(text, future) for text, future in batch if not future.done()]  # skip cancelled
            if not batch:
                continue
            self.batch_sizes = [*self.batch_sizes[-63:], len(batch)]
            try:
                texts = [text for text, _ in batch]
                loop = asyncio.get_running_loop()
                embeddings = await loop.run_in_executor(self.executor, self._embed_batch, texts)
            except Exception as error:  # every waiter of the batch sees the embedder's error
                for _, future in batch:
                    if not future.done():
                        future.set_exception(error)
                continue
            for (_, future), embedding in zip(batch, embeddings, strict=True):
                if not future.done():
                    future.set_result(embedding)

    def _embed_batch(self, texts: list[str]) -> list[Embedding]:
        counts = self.embedder.token_counts(texts)
        fits = [row for row, count in enumerate(counts) if count <= self.embedder.max_tokens]
        vectors = self.embedder.embed([texts[row] for row in fits]) if fits else np.zeros((0, 0), np.float32)
        by_row = dict(zip(fits, vectors, strict=True))
        return [Embedding(by_row.get(row), count) for row, count in enumerate(counts)]
