"""Sampling: greedy, seeded reproducibility, top-k / top-p masks, penalties, logit bias and logprobs;
stopping: tokens, strings, length."""

from __future__ import annotations

import pytest
import torch

from engine.logprobs import PendingLogprobs, TokenLogprob, top_logprobs
from engine.penalties import apply_penalties
from engine.sampler import (
    RequestSampler,
    SamplingParams,
    mask_top_k,
    mask_top_p,
    sample_batch,
    token_probabilities,
)
from engine.stopping import Finish, FinishReason, StopChecker


def random_logits(rows: int = 1, vocab: int = 50, seed: int = 0) -> torch.Tensor:
    return torch.randn(rows, vocab, generator=torch.Generator().manual_seed(seed)) * 3


def draw(params: SamplingParams, logits: torch.Tensor, count: int = 20) -> list[int]:
    sampler = RequestSampler(params)
    return [sampler.sample(logits) for _ in range(count)]


def test_greedy_is_argmax() -> None:
    logits = random_logits(4)
    samplers = [RequestSampler(SamplingParams(temperature=0)) for _ in range(4)]
    assert sample_batch(logits, samplers) == logits.argmax(-1).tolist()


def test_a_seed_reproduces_the_draws_and_another_seed_does_not() -> None:
    logits = random_logits()[0]
    params = SamplingParams(temperature=1.5, seed=1234)
    assert draw(params, logits) == draw(params, logits)
    assert draw(params, logits) != draw(SamplingParams(temperature=1.5, seed=4321), logits)


def test_seeded_draws_do_not_depend_on_the_batch() -> None:
    logits = random_logits(3)
    params = SamplingParams(temperature=1.0, top_p=0.9, seed=7)
    alone = [RequestSampler(params) for _ in range(1)]
    batched = [
        RequestSampler(SamplingParams(temperature=0.7)),
        RequestSampler(params),
        RequestSampler(params),
    ]
    for _ in range(10):
        [expected] = sample_batch(logits[1:2], alone)
        _, got, _ = sample_batch(logits, batched)
        assert got == expected


def test_top_k_keeps_exactly_the_k_largest() -> None:
    logits = torch.tensor([0.1, 5.0, -2.0, 3.0, 4.0])
    masked = mask_top_k(logits, 2)
    assert torch.isfinite(masked).tolist() == [False, True, False, False, True]
    assert set(draw(SamplingParams(top_k=2, seed=0), logits, 200)) == {1, 4}


def test_top_p_keeps_the_smallest_set_reaching_p() -> None:
    probs = torch.tensor([0.5, 0.05, 0.3, 0.15])
    logits = probs.log()
    assert torch.isfinite(mask_top_p(logits, 0.8)).tolist() == [True, False, True, False]  # 0.5 + 0.3 = 0.8
    assert torch.isfinite(mask_top_p(logits, 0.81)).tolist() == [True, False, True, True]
    assert torch.isfinite(mask_top_p(logits, 0.1)).tolist() == [True, False, False, False]  # top token kept
    kept = token_probabilities(logits, 1.0, None, 0.8)
    torch.testing.assert_close(kept, torch.tensor([0.625, 0.0, 0.375, 0.0]))


def test_temperature_sharpens_and_flattens() -> None:
    logits = torch.tensor([1.0, 2.0, 3.0])
    cold, warm = token_probabilities(logits, 0.1, None, 1.0), token_probabilities(logits, 10.0, None, 1.0)
    assert cold[2] > 0.99
    assert warm.max() - warm.min() < 0.1


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(temperature=-1.0),
        dict(top_k=0),
        dict(top_p=0.0),
        dict(top_p=1.5),
        dict(max_tokens=0),
        dict(stop=("",)),
    ],
)
def test_invalid_params_are_refused(kwargs: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        SamplingParams(**kwargs)  # type: ignore[arg-type]


def test_stop_on_eos_and_stop_token_ids_unless_eos_is_ignored() -> None:
    checker = StopChecker(SamplingParams(stop_token_ids=(9,)), eos_token_ids=[2])
    assert checker.check([5, 2], "ab", 1) == Finish(FinishReason.STOP)
    assert checker.check([5, 9], "ab", 1) == Finish(FinishReason.STOP)
    assert checker.check([5, 6], "ab", 1) is None
    ignoring = StopChecker(SamplingParams(ignore_eos=True, stop_token_ids=(9,)), eos_token_ids=[2])
    assert ignoring.check([5, 2], "ab", 1) is None
    assert ignoring.check([5, 9], "ab", 1) == Finish(FinishReason.STOP)


def test_stop_string_spanning_tokens_truncates_the_text() -> None:
    checker = StopChecker(SamplingParams(stop=("END", "\n\n")), eos_token_ids=[])
    assert checker.check([1], "hello E", 7) is None
    assert checker.check([1, 2], "hello EN", 1) is None
    assert checker.check([1, 2, 3], "hello ENDing", 4) == Finish(FinishReason.STOP, text_end=6)
    assert checker.check([1], "a\n\nb END", 8) == Finish(FinishReason.STOP, text_end=1)  # earliest stop wins


def test_a_match_already_passed_is_not_found_again() -> None:
    checker = StopChecker(SamplingParams(stop=("xy",)), eos_token_ids=[])
    assert checker.check([1, 2], "xyz and more", 5) is None  # "xy" lies wholly before the new characters


def test_length_finish_and_holdback() -> None:
    checker = StopChecker(SamplingParams(max_tokens=3, stop=("STOP",)), eos_token_ids=[0])
    assert checker.check([4, 5], "ab", 1) is None
    assert checker.check([4, 5, 6], "abc", 1) == Finish(FinishReason.LENGTH)
    assert checker.num_held_back_chars("fine ST") == 2
    assert checker.num_held_back_chars("fine S") == 1
    assert checker.num_held_back_chars("fine") == 0


# Penalties, logit bias, logprobs ------------------------------------------------------------------


def test_frequency_and_presence_penalties_follow_openais_formula() -> None:
    logits = torch.tensor([1.0, 2.0, 3.0, 4.0])
    sampler = RequestSampler(SamplingParams(temperature=0, frequency_penalty=0.5, presence_penalty=0.25))
    for token_id in (3, 3, 1):
        sampler.record(token_id)
    adjusted = apply_penalties(logits.clone(), sampler.params, sampler.counts)
    # logits[t] -= count[t] * frequency + (count[t] > 0) * presence
    assert adjusted.tolist() == [1.0, 2.0 - 0.5 - 0.25, 3.0, 4.0 - 2 * 0.5 - 0.25]


def test_a_penalty_changes_a_greedy_choice_and_leaves_the_logits_and_other_rows_alone() -> None:
    logits = torch.tensor([[0.0, 3.0, 2.5], [0.0, 3.0, 2.5]])
    penalised = RequestSampler(SamplingParams(temperature=0, presence_penalty=1.0))
    plain = RequestSampler(SamplingParams(temperature=0))
    assert sample_batch(logits, [penalised, plain]) == [1, 1]
    penalised.record(1)
    plain.record(1)
    assert sample_batch(logits, [penalised, plain]) == [2, 1]
    assert logits.tolist() == [[0.0, 3.0, 2.5], [0.0, 3.0, 2.5]]  # adjusted on a copy


def test_logit_bias_is_added_and_minus_100_bans_the_greedy_token() -> None:
    logits = random_logits()[0]
    best = int(logits.argmax())
    banned = RequestSampler(SamplingParams(temperature=0, logit_bias=((best, -100.0),)))
    assert sample_batch(logits[None], [banned]) != [best]
    forced = RequestSampler(SamplingParams(temperature=1.0, seed=0, logit_bias=((7, 100.0),)))
    assert {forced.sample(logits) for _ in range(20)} == {7}


@pytest.mark.parametrize(
    "fields",
    [
        {"n": 0},
        {"n": 17},
        {"logprobs": 21},
        {"logprobs": -1},
        {"presence_penalty": 2.5},
        {"frequency_penalty": -3.0},
        {"logit_bias": ((5, 101.0),)},
        {"logit_bias": ((-1, 1.0),)},
    ],
)
def test_out_of_range_sampling_features_are_refused(fields: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        SamplingParams(**fields)  # type: ignore[arg-type]


def test_logprobs_are_the_raw_log_softmax_with_the_best_alternatives_first() -> None:
    logits = random_logits(3)
    chosen = [int(logits[0].argmin()), int(logits[1].argmax()), 4]
    [first, second] = top_logprobs(logits, [0, 1], chosen[:2], [3, 0])
    expected = torch.log_softmax(logits, dim=-1)
    assert first.token_id == chosen[0] and first.logprob == pytest.approx(float(expected[0, chosen[0]]))
    assert [token_id for token_id, _ in first.top] == torch.topk(expected[0], 3).indices.tolist()
    assert [value for _, value in first.top] == pytest.approx(torch.topk(expected[0], 3).values.tolist())
    assert second.top == () and second.logprob == pytest.approx(float(expected[1].max()))


def test_pending_logprobs_are_released_with_their_text_and_cut_at_a_stop_string() -> None:
    pending = PendingLogprobs()
    for token in ("Hel", "lo", " wor", "ld"):
        pending.add(TokenLogprob(token, -1.0))
    assert [entry.token for entry in pending.release(4)] == ["Hel"]  # "lo" ends at 5: held with its text
    assert [entry.token for entry in pending.release(9)] == ["lo", " wor"]
    assert [entry.token for entry in pending.release(10, final=True)] == ["l"]  # the text ends at 10
