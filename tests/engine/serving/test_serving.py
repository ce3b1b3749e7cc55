"""Acceptance for the serving engine on a tiny random Llama: many concurrent requests over shared prefixes,
with forced preemption and chunked prefill, give exactly the greedy tokens each gives alone, and leave
every block free; aborts free blocks at once; tenants never share blocks; impossible requests end cleanly.
The builders here (`make_engine`, `ToyTokenizer`) are reused by the other engine-serving tests."""

from __future__ import annotations

import functools
import random
from collections.abc import Iterator, Mapping
from typing import Any

import pytest
import torch

from engine.engine import LLMEngine
from engine.engine_config import ContextLengthExceeded, EngineConfig
from engine.model.llama import LlamaModel
from engine.sampler import SamplingParams
from engine.scheduler import SchedulerConfig
from tests.engine.llama_testing import make_engine_model, make_hf_llama

VOCAB = 97  # tests.engine.llama_testing.TINY_LLAMA
GREEDY = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)


class ToyTokenizer:
    """One letter per token id; id 2 (the tiny model's eos) is special and decodes to nothing."""

    special_ids = frozenset({2})

    def decode(self, token_ids: list[int], skip_special_tokens: bool = True) -> str:
        return "".join(
            chr(ord("a") + token_id % 26)
            for token_id in token_ids
            if not (skip_special_tokens and token_id in self.special_ids)
        )

    def encode(self, text: str) -> list[int]:
        return [3 + ord(char) % (VOCAB - 3) for char in text]

    def apply_chat_template(self, messages: list[Mapping[str, Any]], **_: Any) -> list[int]:
        return self.encode("".join(f"<{message['role']}>{message['content']}" for message in messages) + ">")


@pytest.fixture(autouse=True)
def one_torch_thread() -> Iterator[None]:
    """Tiny matmuls: two intra-op threads only spin against each other (17x slower on a busy 2-core box)."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


@functools.cache
def tiny_model() -> LlamaModel:
    return make_engine_model(make_hf_llama(seed=5))


def make_engine(
    num_blocks: int = 64,
    block_size: int = 4,
    max_num_batched_tokens: int = 512,
    max_model_len: int | None = None,
    **scheduler: int,
) -> LLMEngine:
    config = EngineConfig(
        num_blocks=num_blocks,
        block_size=block_size,
        scheduler=SchedulerConfig(max_num_batched_tokens=max_num_batched_tokens, **scheduler),
        max_model_len=max_model_len,
    )
    return LLMEngine(tiny_model(), ToyTokenizer(), config, model_name="tiny")


def random_tokens(rng: random.Random, length: int) -> list[int]:
    return [rng.randrange(3, VOCAB) for _ in range(length)]


def prefix_tree_prompts(rng: random.Random, count: int) -> list[list[int]]:
    """Prompts drawn from a small tree of shared prefixes (SGLang's test_radix_attention shape)."""
    roots = [random_tokens(rng, rng.randint(6, 20)) for _ in range(3)]
    nodes = [*roots, *(root + random_tokens(rng, rng.randint(3, 10)) for root in roots for _ in range(2))]
    return [rng.choice(nodes) + random_tokens(rng, rng.randint(1, 8)) for _ in range(count)]


def blocks_in_use(engine: LLMEngine) -> int:
    return engine.scheduler.block_manager.stats().num_blocks_in_use


def test_concurrent_requests_over_shared_prefixes_match_each_run_alone_and_free_every_block() -> None:
    rng = random.Random(0)
    prompts = prefix_tree_prompts(rng, 56)
    max_tokens = [rng.randint(4, 16) for _ in prompts]
    alone = make_engine(num_blocks=256)
    expected = [
        alone.generate([prompt], SamplingParams(temperature=0, max_tokens=n, ignore_eos=True))[0]
        for prompt, n in zip(prompts, max_tokens, strict=True)
    ]

    # 28 blocks of 4 tokens for 56 requests of up to 54 tokens: preemption is certain. A 12-token budget
    # splits most prompts into chunks and mixes them with other requests' decodes.
    engine = make_engine(num_blocks=28, max_num_batched_tokens=12)
    outputs: dict[str, list[int]] = {}
    pending = list(enumerate(prompts))
    while pending or engine.has_unfinished():
        for index, prompt in pending[:6]:  # staggered arrivals: a few new requests every step
            params = SamplingParams(temperature=0, max_tokens=max_tokens[index], ignore_eos=True)
            engine.add_request(f"r{index}", prompt, params)
        pending = pending[6:]
        for output in engine.step():
            outputs.setdefault(output.request_id, []).extend(output.token_ids)

    assert [outputs[f"r{index}"] for index in range(len(prompts))] == expected
    assert engine.scheduler.num_preemptions > 0
    assert max(map(len, prompts)) > 12  # chunked prefill happened
    stats = engine.scheduler.block_manager.stats()
    assert stats.num_blocks_in_use == 0
    assert engine.scheduler.block_manager.num_free_blocks == 28
    assert stats.prefix_cache_hits > 0


@pytest.mark.parametrize("steps_before_abort", [1, 4], ids=["mid-prefill", "mid-decode"])
def test_abort_frees_the_requests_blocks_at_once(steps_before_abort: int) -> None:
    engine = make_engine(max_num_batched_tokens=10)
    rng = random.Random(1)
    engine.add_request("bystander", random_tokens(rng, 9), GREEDY)
    engine.step()
    before = blocks_in_use(engine)
    engine.add_request("victim", random_tokens(rng, 21), SamplingParams(temperature=0, max_tokens=50))
    for _ in range(steps_before_abort):
        engine.step()
    victim = engine.scheduler.get("victim")
    assert victim is not None
    assert victim.is_prefilling == (steps_before_abort == 1)
    output = engine.abort("victim")
    assert output is not None and output.finish_reason == "abort"
    assert blocks_in_use(engine) == before + (1 if steps_before_abort > 1 else 0)  # the bystander grew
    assert engine.abort("victim") is None
    while engine.has_unfinished():
        engine.step()
    assert blocks_in_use(engine) == 0


def test_tenants_with_different_salts_never_share_blocks_and_one_tenant_does() -> None:
    engine = make_engine()
    prompt = random_tokens(random.Random(2), 21)

    def cached_tokens(request_id: str, salt: str | None) -> int:
        engine.add_request(request_id, prompt, GREEDY, cache_salt=salt)
        while engine.has_unfinished():
            outputs = engine.step()
        return outputs[-1].cached_tokens

    assert cached_tokens("a1", "tenant-a") == 0
    assert cached_tokens("b1", "tenant-b") == 0
    assert cached_tokens("none", None) == 0
    assert cached_tokens("a2", "tenant-a") == 20  # five full blocks; the last token is always computed
    assert cached_tokens("b2", "tenant-b") == 20


def test_a_prompt_with_no_room_for_a_completion_is_refused_before_scheduling() -> None:
    engine = make_engine(num_blocks=8)  # 32 tokens: the pool caps the model's 256-token context
    assert engine.max_model_len == 32
    with pytest.raises(ContextLengthExceeded) as refused:
        engine.add_request("long", list(range(3, 35)), GREEDY)
    assert refused.value.max_model_len == 32 and refused.value.num_prompt_tokens == 32
    assert not engine.has_unfinished()
    with pytest.raises(ValueError, match="token ids"):
        engine.add_request("bad", [VOCAB], GREEDY)


def test_a_request_longer_than_the_pool_ends_with_length_beside_others() -> None:
    engine = make_engine(num_blocks=8, max_num_batched_tokens=8)
    rng = random.Random(3)
    engine.add_request("huge", random_tokens(rng, 20), SamplingParams(temperature=0, max_tokens=100))
    engine.add_request("small", random_tokens(rng, 5), GREEDY)
    finished = {}
    for _ in range(200):
        for output in engine.step():
            if output.finish_reason is not None:
                finished[output.request_id] = output
        if not engine.has_unfinished():
            break
    assert finished["huge"].finish_reason == "length"
    assert finished["huge"].completion_tokens == 12  # 20 + 12 = the pool's 32 tokens
    assert finished["small"].finish_reason == "length" and finished["small"].completion_tokens == 8
    assert blocks_in_use(engine) == 0


def test_max_model_len_caps_the_output() -> None:
    engine = make_engine(max_model_len=16)
    [output] = engine.generate([list(range(3, 13))], SamplingParams(temperature=0, max_tokens=50))
    assert len(output) == 6
