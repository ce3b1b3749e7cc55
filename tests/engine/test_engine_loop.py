"""The step loop's output side: stop strings and tokens (with held-back text), incremental detokenisation,
seeded sampling independent of batching, and the metrics the gateway exports."""

from __future__ import annotations

import random

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from engine.detokenizer import IncrementalDetokenizer
from engine.engine import LLMEngine
from engine.metrics import register_engine_metrics
from engine.request_output import RequestOutput
from engine.sampler import SamplingParams
from tests.engine.serving.test_serving import (  # noqa: F401  (one_torch_thread is an autouse fixture)
    ToyTokenizer,
    make_engine,
    one_torch_thread,
    random_tokens,
)


def run(
    engine: LLMEngine, request_id: str, prompt: list[int], sampling: SamplingParams
) -> list[RequestOutput]:
    engine.add_request(request_id, prompt, sampling)
    outputs: list[RequestOutput] = []
    while engine.has_unfinished():
        outputs.extend(output for output in engine.step() if output.request_id == request_id)
    return outputs


def test_a_stop_string_ends_the_text_before_it_and_is_never_streamed() -> None:
    engine = make_engine()
    prompt = random_tokens(random.Random(0), 9)
    free_run = run(engine, "free", prompt, SamplingParams(temperature=0, max_tokens=12, ignore_eos=True))
    text = "".join(output.text for output in free_run)
    stop = text[5:7]
    cut = text.find(stop)
    outputs = run(engine, "stopped", prompt, SamplingParams(temperature=0, max_tokens=12, stop=(stop,)))
    assert outputs[-1].finish_reason == "stop"
    assert "".join(output.text for output in outputs) == text[:cut]
    # While the first character of the stop string could still start it, it was held back.
    assert all(stop not in output.text for output in outputs)


def test_a_stop_token_ends_the_request_without_its_text() -> None:
    engine = make_engine()
    prompt = random_tokens(random.Random(1), 9)
    tokens = engine.generate([prompt], SamplingParams(temperature=0, max_tokens=10, ignore_eos=True))[0]
    stop_token = tokens[3]
    first = tokens.index(stop_token)
    outputs = run(engine, "stopped", prompt, SamplingParams(temperature=0, stop_token_ids=(stop_token,)))
    assert [token for output in outputs for token in output.token_ids] == tokens[: first + 1]
    assert "".join(output.text for output in outputs) == ToyTokenizer().decode(tokens[:first])
    assert outputs[-1].finish_reason == "stop" and outputs[-1].completion_tokens == first + 1


def test_seeded_sampling_gives_the_same_tokens_alone_and_batched() -> None:
    rng = random.Random(2)
    prompts = [random_tokens(rng, n) for n in (7, 15, 4)]
    seeded = SamplingParams(temperature=0.9, top_p=0.9, seed=11, max_tokens=10, ignore_eos=True)
    alone = make_engine().generate(prompts[:1], seeded)[0]
    engine = make_engine(max_num_batched_tokens=8)
    engine.add_request("other-1", prompts[1], SamplingParams(temperature=1.0, max_tokens=10))
    engine.add_request("other-2", prompts[2], SamplingParams(temperature=0, max_tokens=10))
    assert [
        token for output in run(engine, "seeded", prompts[0], seeded) for token in output.token_ids
    ] == alone


def test_metrics_count_tokens_latencies_and_prefix_hits_and_export_to_prometheus() -> None:
    engine = make_engine()
    prompt = random_tokens(random.Random(3), 13)
    engine.generate([prompt, [*prompt, 5]], SamplingParams(temperature=0, max_tokens=4, ignore_eos=True))
    stats = engine.metrics.snapshot()
    assert stats.generation_tokens == 8
    assert stats.time_to_first_token.count == 2 and stats.inter_token_latency.count == 6
    assert stats.finished == {"length": 2} and stats.prompt_tokens == 27
    assert stats.prefix_cache_queries == 27 and stats.prefix_cache_hits == 12  # the second waited, then hit
    assert (stats.num_running, stats.num_waiting, stats.kv_cache_usage) == (0, 0, 0.0)

    registry = CollectorRegistry()
    register_engine_metrics(registry, engine.metrics.snapshot)
    exported = generate_latest(registry).decode()
    assert "kvgate_engine_prefix_cache_hits_total 12.0" in exported
    assert "kvgate_engine_time_to_first_token_seconds_count 2.0" in exported
    assert 'kvgate_engine_request_success_total{finished_reason="length"} 2.0' in exported
    assert "kvgate_engine_num_requests_running 0.0" in exported


def test_incremental_detokenisation_rebuilds_multibyte_text_exactly() -> None:
    from engine.weights.loader import ensure_hf_folder, load_tokenizer
    from engine.weights.model_files import resolve_generator
    from gateway.runtime.settings import Settings

    # The default GGUF's tokenizer, converted here if no earlier test did (a fresh clone's first run).
    model_dir = Settings().model_dir
    source = resolve_generator("smollm2-135m-instruct", model_dir)
    if not source.present:
        pytest.skip(f"default GGUF not fetched into {model_dir} (run `kvgate models`)")
    tokenizer = load_tokenizer(ensure_hf_folder(source, model_dir))
    text = " Café ☕ naïve — 日本語 🙂🙂 end\n  indented"
    prompt = tokenizer.encode("Say:")
    token_ids = tokenizer.encode(text)
    detokenizer = IncrementalDetokenizer(tokenizer, prompt)
    deltas = [detokenizer.add(token_id) for token_id in token_ids]
    assert "".join(deltas) + detokenizer.flush() == tokenizer.decode(token_ids)
    assert "\ufffd" not in "".join(deltas)  # half a character is never streamed
