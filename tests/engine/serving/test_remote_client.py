"""The engine process's socket: a `RemoteEngineClient` behaves like the in-process `AsyncEngineClient` it
talks to (same tokens, usage, prefix reuse, aborts, errors), and survives the engine going away."""

from __future__ import annotations

import asyncio
import json
import random
import shutil
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from engine.engine_config import ContextLengthExceeded
from engine.sampler import SamplingParams
from engine.serving.client import AsyncEngineClient, EngineStopped, Finished, TextDelta
from engine.serving.ipc import open_connection, receive, sampling_to_wire
from engine.serving.remote_client import EngineUnavailable, RemoteEngineClient
from engine.serving.server import EngineServer
from tests.engine.serving.test_serving import (  # noqa: F401  (one_torch_thread is an autouse fixture)
    ToyTokenizer,
    make_engine,
    one_torch_thread,
    random_tokens,
)

GREEDY = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
LONG = SamplingParams(temperature=0, max_tokens=200, ignore_eos=True)


@pytest.fixture
def socket_path() -> AsyncIterator[Path]:
    directory = Path(tempfile.mkdtemp(prefix="kvgate-", dir="/tmp"))  # unix socket paths are short
    yield directory / "engine.sock"
    shutil.rmtree(directory, ignore_errors=True)


async def serve(path: Path, **engine: int) -> tuple[EngineServer, AsyncEngineClient]:
    local = AsyncEngineClient(make_engine(**engine), ToyTokenizer())
    local.start()
    server = EngineServer(local, path, {"folder": "unused", "weights": None})
    await server.start()
    return server, local


@pytest.fixture
async def engine(socket_path: Path) -> AsyncIterator[tuple[EngineServer, AsyncEngineClient]]:
    server, local = await serve(socket_path, max_num_batched_tokens=16)
    yield server, local
    await server.close()


@pytest.fixture
async def remote(socket_path: Path, engine: object) -> AsyncIterator[RemoteEngineClient]:
    client = RemoteEngineClient(socket_path, lambda folder: ToyTokenizer())
    await client.connect(timeout_s=5)
    yield client
    await client.shutdown()


async def collect(
    client: AsyncEngineClient | RemoteEngineClient, request_id: str, prompt: list[int]
) -> tuple[list[int], Finished]:
    tokens: list[int] = []
    async for event in client.generate(request_id, prompt, sampling=GREEDY):
        if isinstance(event, Finished):
            return tokens, event
        tokens.extend(event.token_ids)
    raise AssertionError("the stream ended without a Finished event")


def blocks_in_use(client: AsyncEngineClient) -> int:
    return client.engine.scheduler.block_manager.stats().num_blocks_in_use


async def wait_until_free(local: AsyncEngineClient) -> None:
    for _ in range(200):
        if blocks_in_use(local) == 0 and not local.engine.has_unfinished():
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"{blocks_in_use(local)} blocks still in use")


async def test_remote_generation_equals_local_and_shares_its_prefix_cache(engine, remote) -> None:  # type: ignore[no-untyped-def]
    _, local = engine
    prompt = random_tokens(random.Random(0), 21)
    remote_tokens, remote_finished = await collect(remote, "over-the-socket", prompt)
    local_tokens, local_finished = await collect(local, "in-process", prompt)
    assert remote_tokens == local_tokens and len(remote_tokens) == 6
    assert remote_finished.finish_reason == local_finished.finish_reason == "length"
    assert remote_finished.cached_tokens == 0
    assert local_finished.cached_tokens == 20  # the remote request's blocks: one prefix cache
    assert remote.max_model_len == local.max_model_len and remote.model_name == local.model_name
    stats = await remote.refresh_metrics()
    assert stats.prefix_cache_hits == local.metrics.prefix_cache_hits == 20


async def test_a_consumer_that_leaves_frees_its_sequence_in_the_engine(engine, remote) -> None:  # type: ignore[no-untyped-def]
    _, local = engine
    events = remote.generate("leaves", random_tokens(random.Random(1), 12), sampling=LONG)
    first = await anext(events)
    assert isinstance(first, TextDelta)
    assert blocks_in_use(local) > 0
    await events.aclose()
    await wait_until_free(local)


async def test_abort_returns_once_the_engine_freed_the_request(engine, remote) -> None:  # type: ignore[no-untyped-def]
    _, local = engine
    events = remote.generate("aborted", random_tokens(random.Random(2), 12), sampling=LONG)
    await anext(events)
    await remote.abort("aborted")
    assert blocks_in_use(local) == 0
    rest = [event async for event in events]
    assert isinstance(rest[-1], Finished) and rest[-1].finish_reason == "abort"


async def test_errors_known_before_scheduling_cross_the_socket(engine, remote) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ContextLengthExceeded):
        await collect(remote, "too-long", random_tokens(random.Random(3), 1000))
    with pytest.raises(ValueError, match="empty"):
        await collect(remote, "empty", [])


async def test_a_worker_connection_that_drops_aborts_its_requests(engine, socket_path) -> None:  # type: ignore[no-untyped-def]
    _, local = engine
    client = RemoteEngineClient(socket_path, lambda folder: ToyTokenizer())
    await client.connect(timeout_s=5)
    events = client.generate("orphan", random_tokens(random.Random(4), 12), sampling=LONG)
    await anext(events)
    await client.shutdown()  # as when a worker process dies: its socket closes
    await wait_until_free(local)
    with pytest.raises(EngineStopped):  # after the deltas that had already arrived
        async for _ in events:
            pass


async def test_while_the_engine_is_gone_calls_fail_fast_and_the_client_reconnects(socket_path) -> None:  # type: ignore[no-untyped-def]
    server, _ = await serve(socket_path)
    client = RemoteEngineClient(socket_path, lambda folder: ToyTokenizer())
    await client.connect(timeout_s=5)
    try:
        events = client.generate("in-flight", random_tokens(random.Random(5), 12), sampling=LONG)
        await anext(events)
        await server.close()  # the engine process exits
        with pytest.raises(EngineUnavailable):
            async for _ in events:
                pass
        assert not client.connected
        with pytest.raises(EngineUnavailable):
            await collect(client, "while-down", random_tokens(random.Random(6), 8))
        server, _ = await serve(socket_path)  # the supervisor starts it again
        for _ in range(100):
            if client.connected:
                break
            await asyncio.sleep(0.05)
        tokens, finished = await collect(client, "after", random_tokens(random.Random(7), 8))
        assert len(tokens) == 6 and finished.finish_reason == "length"
    finally:
        await client.shutdown()
        await server.close()


async def test_an_abort_read_together_with_its_generate_never_reaches_the_engine(engine, socket_path) -> None:  # type: ignore[no-untyped-def]
    _, local = engine
    reader, writer = await open_connection(str(socket_path))
    generate = {
        "op": "generate",
        "id": "gone",
        "prompt_token_ids": random_tokens(random.Random(8), 12),
        "sampling": sampling_to_wire(LONG),
    }
    lines = [json.dumps(message) for message in (generate, {"op": "abort", "id": "gone", "ack": 1})]
    writer.write(("\n".join(lines) + "\n").encode())  # one read: no await between the two
    replies = [await asyncio.wait_for(receive(reader), 5) for _ in range(2)]
    writer.close()
    assert replies[0] == {
        "op": "finished",
        "id": "gone",
        "finish_reason": "abort",
        "usage": {"prompt_tokens": 12, "completion_tokens": 0, "cached_tokens": 0},
    }
    assert replies[1] == {"op": "aborted", "ack": 1}
    assert local.metrics.generation_tokens == 0 and not local.engine.has_unfinished()


async def test_choices_logprobs_and_penalties_cross_the_socket_unchanged(engine, remote) -> None:  # type: ignore[no-untyped-def]
    _, local = engine
    prompt = random_tokens(random.Random(12), 10)
    sampling = SamplingParams(
        temperature=0.8,
        seed=3,
        n=3,
        max_tokens=5,
        ignore_eos=True,
        logprobs=2,
        frequency_penalty=0.5,
        logit_bias=((7, -3.0),),
    )

    async def events(client: AsyncEngineClient | RemoteEngineClient, request_id: str) -> list[object]:
        return [event async for event in client.generate(request_id, prompt, sampling=sampling)]

    near, far = await events(local, "near"), await events(remote, "far")
    assert isinstance(near[-1], Finished) and isinstance(far[-1], Finished)
    assert near[-1].finish_reasons == far[-1].finish_reasons
    assert near[-1].completion_tokens == far[-1].completion_tokens

    def flat(stream: list[object]) -> list[tuple[object, ...]]:
        return [
            (event.index, event.text, event.token_ids, entry.token, [token for token, _ in entry.top])
            for event in stream
            if isinstance(event, TextDelta)
            for entry in event.logprobs
        ]

    def values(stream: list[object]) -> list[float]:
        deltas = [event for event in stream if isinstance(event, TextDelta)]
        return [value for delta in deltas for entry in delta.logprobs for _, value in entry.top]

    # The second run's prompt comes from the prefix cache: its logits may differ in the last bits.
    assert flat(near) == flat(far) and values(near) == pytest.approx(values(far), abs=1e-4)
    deltas = [event for event in far if isinstance(event, TextDelta)]
    assert {delta.index for delta in deltas} == {0, 1, 2} and all(len(d.logprobs) <= 1 for d in deltas)
    finished = far[-1]
    assert isinstance(finished, Finished) and finished.finish_reasons == ("length",) * 3
    assert (finished.prompt_tokens, finished.completion_tokens) == (10, 15)
