"""The async client: it streams text deltas, ends with usage, shows prefix reuse in cached_tokens, aborts
within a step, refuses impossible prompts before scheduling, and runs requests concurrently off the loop."""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections.abc import AsyncIterator

import pytest

from engine.engine_config import ContextLengthExceeded
from engine.sampler import SamplingParams
from engine.serving.client import AsyncEngineClient, EngineStopped, Finished, TextDelta
from tests.engine.serving.test_serving import (  # noqa: F401  (one_torch_thread is an autouse fixture)
    ToyTokenizer,
    make_engine,
    one_torch_thread,
    random_tokens,
)

GREEDY = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)


@pytest.fixture
async def client() -> AsyncIterator[AsyncEngineClient]:
    client = AsyncEngineClient(make_engine(max_num_batched_tokens=16))
    client.start()
    yield client
    await client.shutdown()


async def collect(
    client: AsyncEngineClient,
    request_id: str,
    prompt: list[int],
    sampling: SamplingParams = GREEDY,
    **kw: object,
) -> tuple[list[TextDelta], Finished]:
    deltas: list[TextDelta] = []
    async for event in client.generate(request_id, prompt, sampling=sampling, **kw):  # type: ignore[arg-type]
        if isinstance(event, Finished):
            return deltas, event
        deltas.append(event)
    raise AssertionError("the stream ended without a Finished event")


def blocks_in_use(client: AsyncEngineClient) -> int:
    return client.engine.scheduler.block_manager.stats().num_blocks_in_use


async def test_generate_streams_deltas_then_usage_and_a_second_request_reuses_the_prefix(client) -> None:  # type: ignore[no-untyped-def]
    prompt = random_tokens(random.Random(0), 21)
    deltas, finished = await collect(client, "first", prompt)
    token_ids = [token for delta in deltas for token in delta.token_ids]
    assert len(deltas) == 6 and len(token_ids) == 6
    assert "".join(delta.text for delta in deltas) == ToyTokenizer().decode(token_ids)
    assert finished.finish_reason == "length"
    assert (finished.prompt_tokens, finished.completion_tokens) == (21, 6)
    assert finished.cached_tokens == 0

    _, again = await collect(client, "second", [*prompt[:17], 5, 6, 7])
    assert again.cached_tokens == 16  # four full blocks of the first request's prompt
    assert client.metrics.prefix_cache_hits == 16


async def test_chat_messages_are_encoded_with_the_tokenizers_template(client) -> None:  # type: ignore[no-untyped-def]
    messages = [{"role": "user", "content": "hello"}]
    expected = ToyTokenizer().apply_chat_template(messages)
    _, finished = await collect_messages(client, messages)
    assert finished.prompt_tokens == len(expected) == len(client.encode_chat(messages))


async def collect_messages(
    client: AsyncEngineClient, messages: list[dict[str, str]]
) -> tuple[None, Finished]:
    async for event in client.generate("chat", messages=messages, sampling=GREEDY):
        if isinstance(event, Finished):
            return None, event
    raise AssertionError("no Finished event")


async def test_concurrent_requests_match_the_engine_run_alone(client) -> None:  # type: ignore[no-untyped-def]
    rng = random.Random(1)
    shared = random_tokens(rng, 12)
    prompts = [shared + random_tokens(rng, rng.randint(1, 9)) for _ in range(12)]
    alone = make_engine()
    expected = [alone.generate([prompt], GREEDY)[0] for prompt in prompts]
    results = await asyncio.gather(*(collect(client, f"r{i}", prompt) for i, prompt in enumerate(prompts)))
    outputs = [[token for delta in deltas for token in delta.token_ids] for deltas, _ in results]
    assert outputs == expected
    assert blocks_in_use(client) == 0


async def test_abort_ends_the_stream_and_frees_blocks_before_returning(client) -> None:  # type: ignore[no-untyped-def]
    long = SamplingParams(temperature=0, max_tokens=200, ignore_eos=True)
    stream = client.generate("victim", random_tokens(random.Random(2), 30), sampling=long)
    events = []
    async with contextlib.aclosing(stream):
        events.append(await anext(stream))  # decoding has begun
        await client.abort("victim")
        assert blocks_in_use(client) == 0
        events.extend([event async for event in stream])
    assert isinstance(events[-1], Finished) and events[-1].finish_reason == "abort"
    assert events[-1].completion_tokens < 200
    await client.abort("victim")  # already gone: a no-op


async def test_a_consumer_that_stops_listening_frees_its_request(client) -> None:  # type: ignore[no-untyped-def]
    long = SamplingParams(temperature=0, max_tokens=200, ignore_eos=True)
    stream = client.generate("gone", random_tokens(random.Random(3), 10), sampling=long)
    await anext(stream)
    await stream.aclose()  # what a disconnecting HTTP client amounts to
    for _ in range(200):
        if not client.engine.has_unfinished():
            break
        await asyncio.sleep(0.01)
    assert not client.engine.has_unfinished()
    assert blocks_in_use(client) == 0


async def test_impossible_prompts_raise_before_anything_is_scheduled(client) -> None:  # type: ignore[no-untyped-def]
    too_long = [5] * client.max_model_len
    with pytest.raises(ContextLengthExceeded):
        await collect(client, "long", too_long)
    with pytest.raises(ValueError, match="exactly one"):
        await anext(client.generate("neither"))
    assert not client.engine.has_unfinished()


async def test_a_duplicate_request_id_fails_only_the_second_request(client) -> None:  # type: ignore[no-untyped-def]
    long = SamplingParams(temperature=0, max_tokens=30, ignore_eos=True)
    first = client.generate("same", [5, 6, 7], sampling=long)
    async with contextlib.aclosing(first):
        await anext(first)
        with pytest.raises(ValueError, match="already in use"):
            await collect(client, "same", [8, 9])
        assert isinstance([event async for event in first][-1], Finished)


async def test_after_shutdown_generate_refuses_and_running_requests_end_with_abort() -> None:
    client = AsyncEngineClient(make_engine())
    client.start()
    long = SamplingParams(temperature=0, max_tokens=200, ignore_eos=True)
    stream = client.generate("running", [5, 6, 7], sampling=long)
    async with contextlib.aclosing(stream):
        await anext(stream)
        await client.shutdown()
        events = [event async for event in stream]
    assert isinstance(events[-1], Finished) and events[-1].finish_reason == "abort"
    with pytest.raises(EngineStopped):
        await collect(client, "late", [5, 6])
    assert client.model_name == "tiny"


def test_gauges_are_true_after_an_abort_between_steps() -> None:
    """An abort while the loop is idle must not leave running/KV-usage gauges at their last step's values."""
    engine = make_engine()
    engine.add_request("a", list(range(1, 9)), SamplingParams(temperature=0, max_tokens=50))
    engine.step()
    assert engine.metrics.snapshot().num_running == 1
    engine.abort("a")
    stats = engine.metrics.snapshot()
    assert (stats.num_running, stats.num_waiting, stats.kv_cache_usage) == (0, 0, 0.0)
