"""Micro-batched, off-loop embedding: concurrent callers share one embedder call (`semantic/embedding/micro_batch.py`).

Under load the batch grows with the load, and a lone request pays at most `max_wait_ms` extra.

A text the embedder would truncate (more tokens than its `max_tokens`) gets no vector: its first
`max_tokens` word pieces would stand for all of it and collide with anything sharing them.

Knows the `Embedder` protocol and asyncio; knows nothing about scopes, Redis or FAISS.
"""

from __future__ import annotations

from concurrent.futures import Executor
from dataclasses import dataclass

import numpy as np

from semantic.embedding.embedder import Embedder, Vectors
from semantic.embedding.micro_batch import MicroBatcher


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
        self.embedder = embedder
        self._batcher: MicroBatcher[str, Embedding] = MicroBatcher(
            self._embed_batch, max_batch, max_wait_ms, executor
        )

    @property
    def batch_sizes(self) -> list[int]:
        """The last few batch sizes, for tests and metrics."""
        return self._batcher.batch_sizes

    async def embed(self, text: str) -> Embedding:
        """The embedding of `text`, computed with whatever other texts are waiting."""
        return await self._batcher.submit(text)

    async def close(self) -> None:
        """Stop the drain task; waiters still queued get `asyncio.CancelledError`."""
        await self._batcher.close()

    def _embed_batch(self, texts: list[str]) -> list[Embedding]:
        counts = self.embedder.token_counts(texts)
        fits = [row for row, count in enumerate(counts) if count <= self.embedder.max_tokens]
        vectors = self.embedder.embed([texts[row] for row in fits]) if fits else np.zeros((0, 0), np.float32)
        by_row = dict(zip(fits, vectors, strict=True))
        return [Embedding(by_row.get(row), count) for row, count in enumerate(counts)]
