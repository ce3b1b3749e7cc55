"""Several choices, logprobs, penalties and seeds in the step loop, on the tiny random Llama: an n=3 request
prefills its prompt once and its choices share the prompt's blocks (copied only where they diverge); each
choice is what a request alone with its seed would give; a seeded request gives the same tokens alone and
batched beside others; logprobs spell the text; penalties and bias change a greedy answer."""

from __future__ import annotations

import random
from collections import defaultdict

from engine.engine import LLMEngine
from engine.request_output import RequestOutput
from engine.sampler import SamplingParams
from tests.engine.serving.test_serving import (  # noqa: F401  (one_torch_thread is an autouse fixture)
    make_engine,
    one_torch_thread,
    random_tokens,
)


def run_all(engine: LLMEngine) -> dict[str, list[RequestOutput]]:
    outputs: dict[str, list[RequestOutput]] = defaultdict(list)
    while engine.has_unfinished():
        for output in engine.step():
            outputs[output.request_id].append(output)
    return outputs


def choice_tokens(outputs: list[RequestOutput]) -> dict[int, list[int]]:
    tokens: dict[int, list[int]] = defaultdict(list)
    for output in outputs:
        tokens[output.index].extend(output.token_ids)
    return dict(tokens)


def alone(prompt: list[int], sampling: SamplingParams) -> list[int]:
    engine = make_engine()
    engine.add_request("alone", prompt, sampling)
    return choice_tokens(run_all(engine)["alone"])[0]


def test_three_choices_prefill_the_prompt_once_and_share_its_blocks() -> None:
    engine = make_engine(block_size=4)
    computed: list[int] = []
    copies: list[tuple[int, int]] = []
    execute = engine.runner.execute

    def counting_execute(chunks, block_copies=()):  # type: ignore[no-untyped-def]
        computed.append(sum(len(chunk.token_ids) for chunk in chunks))
        copies.extend(block_copies)
        return execute(chunks, block_copies)

    engine.runner.execute = counting_execute  # type: ignore[method-assign]
    prompt = random_tokens(random.Random(3), 10)  # two full blocks and one holding 2 tokens
    sampling = SamplingParams(temperature=1.0, seed=11, n=3, max_tokens=5, ignore_eos=True)
    engine.add_request("forked", prompt, sampling)
    first = engine.step()  # the prefill, then three first tokens from its one logits row
    assert computed == [10] and sorted(output.index for output in first) == [0, 1, 2]
    manager = engine.scheduler.block_manager
    tables = [manager.block_table(seq_id) for seq_id in ("forked", "forked#1", "forked#2")]
    assert tables[0] == tables[1] == tables[2] and len(tables[0]) == 3
    assert [manager.pool.blocks[block_id].ref_count for block_id in tables[0]] == [3, 3, 3]
    outputs = first + run_all(engine)["forked"]
    # Every later step computes one token per choice; the shared partial block was copied for two of them.
    assert computed[1:] == [3, 3, 3, 3] and len(copies) == 2
    tables_after = {source for source, _ in copies}
    assert tables_after == {tables[0][2]}
    stats = engine.metrics.snapshot()
    assert stats.prompt_tokens == 10 and stats.prefix_cache_queries == 10 and stats.generation_tokens == 15
    assert stats.finished == {"length": 1}
    assert [output.last for output in outputs].count(True) == 1 and outputs[-1].last
    assert manager.num_free_blocks == engine.config.num_blocks  # every block back


def test_each_choice_is_what_a_request_alone_with_seed_plus_index_draws() -> None:
    prompt = random_tokens(random.Random(4), 13)
    sampling = SamplingParams(temperature=1.0, seed=100, n=3, max_tokens=8, ignore_eos=True)
    engine = make_engine()
    engine.add_request("forked", prompt, sampling)
    choices = choice_tokens(run_all(engine)["forked"])
    for index in range(3):
        single = SamplingParams(temperature=1.0, seed=100 + index, max_tokens=8, ignore_eos=True)
        assert choices[index] == alone(prompt, single)
    assert len({tuple(tokens) for tokens in choices.values()}) == 3  # distinct streams


def test_greedy_choices_agree_with_the_greedy_answer_alone() -> None:
    # Copy-on-write keeps each choice's KV exact: all three continue the prompt as one request does.
    prompt = random_tokens(random.Random(5), 14)
    greedy = SamplingParams(temperature=0, max_tokens=9, ignore_eos=True)
    engine = make_engine()
    engine.add_request("forked", prompt, SamplingParams(temperature=0, n=3, max_tokens=9, ignore_eos=True))
    choices = choice_tokens(run_all(engine)["forked"])
    assert choices == {index: alone(prompt, greedy) for index in range(3)}


def test_a_seeded_request_draws_the_same_alone_and_batched_beside_others() -> None:
    prompt = random_tokens(random.Random(6), 11)
    seeded = SamplingParams(temperature=0.9, top_p=0.95, seed=42, max_tokens=10, ignore_eos=True)
    expected = alone(prompt, seeded)
    engine = make_engine(max_num_batched_tokens=16)  # chunked prefills beside the decodes
    rng = random.Random(7)
    engine.add_request("other-greedy", random_tokens(rng, 20), SamplingParams(temperature=0, max_tokens=6))
    engine.add_request(
        "other-n", random_tokens(rng, 9), SamplingParams(temperature=1.2, n=2, max_tokens=7, ignore_eos=True)
    )
    engine.add_request("seeded", prompt, seeded)
    engine.add_request(
        "other-penalised",
        random_tokens(rng, 6),
        SamplingParams(temperature=0.5, presence_penalty=1.0, logit_bias=((5, 3.0),), max_tokens=8),
    )
    assert choice_tokens(run_all(engine)["seeded"])[0] == expected


def test_penalties_and_bias_change_a_greedy_answer() -> None:
    prompt = random_tokens(random.Random(8), 9)
    plain = alone(prompt, SamplingParams(temperature=0, max_tokens=12, ignore_eos=True))
    assert len(set(plain)) < len(plain)  # the tiny model repeats itself
    penalised = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True, frequency_penalty=2.0)
    assert alone(prompt, penalised) != plain
    present = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True, presence_penalty=2.0)
    assert alone(prompt, present) != plain
    biased = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True, logit_bias=((plain[0], -100.0),))
    assert alone(prompt, biased)[0] != plain[0]


def test_greedy_logprobs_choose_the_top_token_and_spell_the_text() -> None:
    engine = make_engine()
    prompt = random_tokens(random.Random(9), 10)
    engine.add_request(
        "scored", prompt, SamplingParams(temperature=0, max_tokens=8, ignore_eos=True, logprobs=3, n=2)
    )
    outputs = run_all(engine)["scored"]
    for index in (0, 1):
        mine = [output for output in outputs if output.index == index]
        entries = [entry for output in mine for entry in output.logprobs]
        assert len(entries) == 8
        assert "".join(entry.token for entry in entries) == "".join(output.text for output in mine)
        for entry in entries:
            assert len(entry.top) == 3 and entry.top[0] == (entry.token, entry.logprob)
            assert entry.logprob <= 0 and [value for _, value in entry.top] == sorted(
                (value for _, value in entry.top), reverse=True
            )
