"""A lone greedy request decodes several tokens per native call (`LLMEngine._burst`): the tokens, text, ends
and block accounting of single steps, and no burst when anything else runs, waits or asks for logits."""

from __future__ import annotations

import random
from collections.abc import Iterator

import pytest

from engine.engine import LLMEngine
from engine.engine_config import EngineConfig
from engine.model.config import ModelConfig
from engine.model.llama import LlamaModel
from engine.model.native_build import load_decode_library
from engine.request_output import RequestOutput
from engine.runner import ModelRunner
from engine.sampler import SamplingParams
from engine.scheduler import SchedulerConfig
from engine.weights.formats import build_model
from tests.engine.llama_testing import QUANTISABLE_LLAMA, make_hf_llama
from tests.engine.serving.test_serving import ToyTokenizer
from tests.engine.test_engine_loop import run

pytestmark = pytest.mark.skipif(
    load_decode_library() is None, reason="this CPU has no AVX2, or there is no C compiler"
)

EOS = 2


@pytest.fixture(scope="module")
def model() -> LlamaModel:
    hf = make_hf_llama(
        seed=9, num_hidden_layers=2, tie_word_embeddings=True, eos_token_id=EOS, **QUANTISABLE_LLAMA
    )
    return build_model(ModelConfig.from_hf(hf.config), hf.state_dict(), "int4")


@pytest.fixture
def burst_calls(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[int]]:
    """The `steps` of every burst the engines run in the test."""
    calls: list[int] = []
    burst = ModelRunner.burst

    def counted(self: ModelRunner, chunk, steps: int, stop_ids) -> list[int]:  # type: ignore[no-untyped-def]
        calls.append(steps)
        return burst(self, chunk, steps, stop_ids)

    monkeypatch.setattr(ModelRunner, "burst", counted)
    yield calls


def make_engine(model: LlamaModel, bursts: bool, block_size: int = 4) -> LLMEngine:
    scheduler = SchedulerConfig(max_num_batched_tokens=64)
    config = EngineConfig(
        num_blocks=64, block_size=block_size, scheduler=scheduler, burst_tokens=8 if bursts else 1
    )
    engine = LLMEngine(model, ToyTokenizer(), config)
    assert engine.runner.bursts and EngineConfig().burst_tokens == 8  # the default bursts
    return engine


def summary(outputs: list[RequestOutput]) -> tuple[list[int], str, str | None, int]:
    return (
        [token for output in outputs for token in output.token_ids],
        "".join(output.text for output in outputs),
        outputs[-1].finish_reason,
        outputs[-1].completion_tokens,
    )


def prompts(count: int, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(3, 97) for _ in range(rng.randint(3, 21))] for _ in range(count)]


@pytest.mark.parametrize("block_size", [4, 16])
def test_a_lone_greedy_request_bursts_and_gets_the_tokens_of_single_steps(
    model: LlamaModel, burst_calls: list[int], block_size: int
) -> None:
    greedy = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)
    bursting, single = make_engine(model, True, block_size), make_engine(model, False, block_size)
    for index, prompt in enumerate(prompts(5, seed=block_size)):
        assert summary(run(bursting, f"b{index}", prompt, greedy)) == summary(
            run(single, f"s{index}", prompt, greedy)
        )
    assert burst_calls and max(burst_calls) == min(8, block_size)  # single steps never burst
    # Every block is free again, or kept only as reusable prefix cache.
    for engine in (bursting, single):
        assert engine.scheduler.block_manager.num_free_blocks == 64


def test_a_burst_ends_where_single_steps_end(model: LlamaModel, burst_calls: list[int]) -> None:
    prompt = prompts(1, seed=3)[0]
    free = summary(
        run(make_engine(model, False), "free", prompt, SamplingParams(temperature=0, max_tokens=30))
    )
    tokens, text = free[0], free[1]
    stop_token = tokens[6]
    ends = [
        SamplingParams(temperature=0, max_tokens=30),  # the model's own end, or the length
        SamplingParams(temperature=0, max_tokens=7),  # the length, inside a burst
        SamplingParams(temperature=0, max_tokens=30, stop_token_ids=(stop_token,)),
        SamplingParams(temperature=0, max_tokens=30, stop=(text[9:11],)),  # a stop string, held back
    ]
    for index, sampling in enumerate(ends):
        bursting = run(make_engine(model, True), f"b{index}", prompt, sampling)
        single = run(make_engine(model, False), f"s{index}", prompt, sampling)
        assert summary(bursting) == summary(single), sampling
    assert burst_calls


def test_blocks_a_burst_filled_serve_a_later_prompt_from_the_prefix_cache(
    model: LlamaModel, burst_calls: list[int]
) -> None:
    prompt = prompts(1, seed=5)[0]
    greedy = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    engine = make_engine(model, True)
    first = summary(run(engine, "first", prompt, greedy))[0]
    follow_up = prompt + first + [11, 12]
    warm = run(engine, "follow-up", follow_up, greedy)
    cold = run(make_engine(model, False), "cold", follow_up, greedy)
    assert warm[-1].cached_tokens >= (len(prompt) + len(first)) // 4 * 4 - 4  # the burst's blocks, reused
    assert summary(warm) == summary(cold)
    assert burst_calls


def test_no_burst_beside_another_request_or_for_logits_a_request_asks_for(
    model: LlamaModel, burst_calls: list[int]
) -> None:
    engine = make_engine(model, True)
    first, second = prompts(2, seed=8)
    together = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    engine.add_request("other", second, together)
    outputs = run(engine, "beside", first, together)  # prefilled in one step, decoding side by side
    assert len(outputs) == 12 and burst_calls == []
    for sampling in (
        SamplingParams(temperature=0.8, max_tokens=20, seed=1),
        SamplingParams(temperature=0, max_tokens=20, logprobs=2),
        SamplingParams(temperature=0, max_tokens=20, frequency_penalty=0.5),
        SamplingParams(temperature=0, max_tokens=20, logit_bias=((5, -3.0),)),
        SamplingParams(temperature=0, max_tokens=20, n=2),
    ):
        run(engine, f"asks-{len(burst_calls)}-{sampling.n}-{sampling.logprobs}", first, sampling)
    assert burst_calls == []
