"""Concurrent embeds share batches; too-long texts get no vector; errors reach every waiter."""

from __future__ import annotations

import asyncio
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from semantic.embedding.embed_batcher import EmbedBatcher


class CountingEmbedder:
    """A fake with the real one's shape: one token per word plus two specials, a slow embed."""

    name = "counting"
    dimension = 4
    max_tokens = 8

    def __init__(self, delay_s: float = 0.02, fail: bool = False) -> None:
        self.delay_s = delay_s
        self.fail = fail
        self.batches: list[list[str]] = []
        self.threads: set[int] = set()

    def token_counts(self, texts: list[str]) -> list[int]:
        return [len(text.split()) + 2 for text in texts]

    def embed(self, texts: list[str]) -> np.ndarray:
        self.threads.add(threading.get_ident())
        self.batches.append(list(texts))
        time.sleep(self.delay_s)
        if self.fail:
            raise RuntimeError("embedder broke")
        vectors = np.ones((len(texts), self.dimension), dtype=np.float32)
        vectors[:, 0] = [len(text) for text in texts]
        return vectors


async def test_concurrent_embeds_are_batched_off_the_loop() -> None:
    embedder = CountingEmbedder()
    batcher = EmbedBatcher(embedder, max_batch=64, max_wait_ms=2.0)
    texts = [f"text number {number}" + "x" * number for number in range(40)]
    embeddings = await asyncio.gather(*(batcher.embed(text) for text in texts))
    assert [embedding.vector[0] for embedding in embeddings] == [len(text) for text in texts]  # type: ignore[index]
    assert len(embedder.batches) <= 2 and sum(map(len, embedder.batches)) == 40
    assert threading.get_ident() not in embedder.threads
    await batcher.close()


async def test_batches_are_capped_and_later_arrivals_wait_for_the_next_batch() -> None:
    embedder = CountingEmbedder(delay_s=0.05)
    batcher = EmbedBatcher(embedder, max_batch=8, max_wait_ms=0.0)
    first = asyncio.create_task(batcher.embed("first"))
    await asyncio.sleep(0.01)  # the first batch is running now
    rest = await asyncio.gather(*(batcher.embed(f"later {number}") for number in range(20)))
    await first
    assert embedder.batches[0] == ["first"]
    assert [len(batch) for batch in embedder.batches[1:]] == [8, 8, 4]
    assert all(not embedding.truncated for embedding in rest)
    await batcher.close()


async def test_a_text_the_embedder_would_truncate_gets_no_vector() -> None:
    embedder = CountingEmbedder()
    batcher = EmbedBatcher(embedder)
    short, long = await asyncio.gather(
        batcher.embed("six words fit in eight tokens"), batcher.embed("w " * 7)
    )
    assert short.vector is not None and short.num_tokens == 8
    assert long.truncated and long.num_tokens == 9
    assert embedder.batches == [["six words fit in eight tokens"]]  # the long one never reached embed()
    await batcher.close()


async def test_an_embedder_error_reaches_every_waiter_of_its_batch() -> None:
    batcher = EmbedBatcher(CountingEmbedder(fail=True), max_wait_ms=2.0)
    results = await asyncio.gather(batcher.embed("a"), batcher.embed("b"), return_exceptions=True)
    assert all(isinstance(result, RuntimeError) for result in results)
    await batcher.close()


async def test_a_cancelled_waiter_does_not_break_the_batch() -> None:
    embedder = CountingEmbedder()
    batcher = EmbedBatcher(embedder, max_wait_ms=5.0)
    doomed = asyncio.create_task(batcher.embed("doomed"))
    kept = asyncio.create_task(batcher.embed("kept"))
    await asyncio.sleep(0)
    doomed.cancel()
    assert (await kept).vector is not None
    assert embedder.batches == [["kept"]]
    await batcher.close()


def test_settings_are_checked() -> None:
    with pytest.raises(ValueError):
        EmbedBatcher(CountingEmbedder(), max_batch=0)


async def test_batches_run_on_the_given_executor() -> None:
    embedder = CountingEmbedder(delay_s=0.0)
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="inference") as executor:
        batcher = EmbedBatcher(embedder, max_batch=4, max_wait_ms=0.0, executor=executor)
        await asyncio.gather(*(batcher.embed(f"text {number}") for number in range(12)))
        (worker,) = executor._threads  # one worker thread ran every batch
        assert embedder.threads == {worker.ident}
        await batcher.close()
