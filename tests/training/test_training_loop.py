from __future__ import annotations

import math
import random

import pytest
import torch
from transformers import BertConfig

from semantic.verifier.minilm import encode_pairs, load_tokenizer
from semantic.verifier.pair_classifier import PairClassifier
from training.training_loop import (
    Example,
    Schedule,
    bf16_is_faster,
    fine_tune,
    grouped_batches,
    length_grouped_batches,
    listwise_loss,
    pair_loss,
    query_groups,
    ranking_loss,
)

EXAMPLES = [
    Example(f"text number {index}", f"text {'x' * (index % 7)}", float(index % 2)) for index in range(40)
]


def test_batches_are_full_cover_every_example_and_depend_only_on_the_seed() -> None:
    first = length_grouped_batches(EXAMPLES, 8, 10, random.Random(3))
    again = length_grouped_batches(EXAMPLES, 8, 10, random.Random(3))
    other = length_grouped_batches(EXAMPLES, 8, 10, random.Random(4))
    assert len(first) == 10 and all(len(batch) == 8 for batch in first)
    assert first == again and first != other
    shown = [example for batch in first for example in batch]
    assert {example.a for example in shown} == {example.a for example in EXAMPLES}  # two epochs


@pytest.fixture(scope="module")
def tokenizer():  # type: ignore[no-untyped-def]
    from semantic.embedding.embedder_source import packaged_model_dir

    return load_tokenizer(packaged_model_dir())


def tiny_classifier(tokenizer) -> PairClassifier:  # type: ignore[no-untyped-def]
    torch.manual_seed(0)
    config = BertConfig(
        vocab_size=tokenizer.vocab_size, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
        intermediate_size=64, max_position_embeddings=64,
    )  # fmt: skip
    return PairClassifier(config)


def test_fine_tune_learns_and_checkpoints_on_schedule(tokenizer) -> None:  # type: ignore[no-untyped-def]
    model = tiny_classifier(tokenizer)
    # Same texts -> 1, texts about different things -> 0: learnable in a few dozen steps.
    words = ["apple", "river", "engine", "garden", "violin", "planet", "copper", "winter"]
    examples = [Example(f"the {a}", f"the {b}", float(a == b)) for a in words for b in words]
    batch = encode_pairs(tokenizer, [(e.a, e.b) for e in examples], 16)
    targets = torch.tensor([e.target for e in examples])
    loss = torch.nn.BCEWithLogitsLoss()
    with torch.no_grad():
        before = loss(model(**batch), targets).item()
    checkpoints: list[int] = []
    taken = fine_tune(
        model,
        tokenizer,
        examples,
        Schedule(steps=120, batch_size=16, learning_rate=3e-3, checkpoint_every=50),
        random.Random(0),
        on_checkpoint=checkpoints.append,
        log=lambda line: None,
    )
    with torch.no_grad():
        after = loss(model(**batch), targets).item()
    assert taken == 120
    assert checkpoints == [50, 100]  # not at the last step: the caller holds the final weights
    assert after < 0.5 * before
    assert not model.training


def test_timing_bf16_leaves_the_model_as_it_found_it(tokenizer) -> None:  # type: ignore[no-untyped-def]
    model = tiny_classifier(tokenizer)
    before = {name: tensor.clone() for name, tensor in model.state_dict().items()}
    chosen = bf16_is_faster(model, encode_pairs(tokenizer, [("a cat", "a dog")] * 4, 16), passes=1)
    assert isinstance(chosen, bool)
    assert all(parameter.grad is None for parameter in model.parameters())  # no gradient leaks into step 1
    assert all(torch.equal(before[name], tensor) for name, tensor in model.state_dict().items())


def test_ranking_loss_charges_only_negatives_within_the_margin_of_a_positive() -> None:
    targets = torch.tensor([1.0, 1.0, 0.0, 0.0])
    apart = torch.tensor([5.0, 4.0, 2.0, -3.0])  # every positive at least 2 above every negative
    assert ranking_loss(apart, targets, margin=1.0).item() == 0.0
    close = torch.tensor([4.7, 4.7, 4.7, -3.0])  # a confident negative level with the positives
    # Pairs (4.7, 4.7) cost the margin, 1.0 each; pairs against -3.0 nothing: (1 + 1 + 0 + 0) / 4.
    assert ranking_loss(close, targets, margin=1.0).item() == pytest.approx(0.5)
    assert ranking_loss(torch.tensor([1.0, 2.0]), torch.tensor([1.0, 1.0]), margin=1.0).item() == 0.0


def test_smoothed_targets_stop_rewarding_a_confident_logit_at_their_own_odds() -> None:
    """Smoothed to 0.1 / 0.9, a positive's loss is lowest at logit ln 9 (~2.2) and rises beyond it, where plain
    targets keep pushing it up towards saturation; the ranking term reads the unsmoothed labels."""
    plain, smoothed = Schedule(steps=1), Schedule(steps=1, label_smoothing=0.1)
    optimum = math.log(0.9 / 0.1)
    for logit, schedule, sign in (
        (optimum, smoothed, 0),
        (4.7, smoothed, 1),
        (optimum, plain, -1),
        (4.7, plain, -1),
    ):
        value = torch.tensor([logit], requires_grad=True)
        pair_loss(value, torch.tensor([1.0]), schedule).backward()
        assert value.grad is not None
        gradient = value.grad.item()
        assert (gradient == pytest.approx(0.0, abs=1e-6)) if sign == 0 else (gradient * sign > 1e-3), (
            logit,
            gradient,
        )
    ranked = Schedule(steps=1, label_smoothing=0.1, ranking_weight=1.0, ranking_margin=1.0)
    logits, targets = torch.tensor([4.7, 4.7]), torch.tensor([1.0, 0.0])
    extra = pair_loss(logits, targets, ranked) - pair_loss(logits, targets, smoothed)
    assert extra.item() == pytest.approx(1.0)  # one positive level with one negative: the whole margin


def test_listwise_loss_is_the_softmax_cross_entropy_of_each_mixed_group_s_paraphrases() -> None:
    logits = torch.tensor([2.0, 0.0, 1.0, 5.0, 3.0, 4.0])
    targets = torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0, 0.0])
    groups = torch.tensor([0, 0, 0, 1, -1, 2])  # group 1 holds only a paraphrase, group 2 only a negative
    expected = -math.log(math.exp(2.0) / (math.exp(2.0) + math.exp(0.0) + math.exp(1.0)))
    assert listwise_loss(logits, targets, groups).item() == pytest.approx(expected)
    ranked_first = listwise_loss(torch.tensor([9.0, 0.0, 1.0]), targets[:3], groups[:3]).item()
    assert ranked_first < 0.01 < expected  # a paraphrase far above its query's negatives costs nearly nothing
    assert listwise_loss(logits[3:], targets[3:], groups[3:]).item() == 0.0


def test_query_groups_join_the_candidates_of_one_query_once_each() -> None:
    examples = [
        Example("stored 1", "query", 1.0), Example("stored 2", "query", 0.0),
        Example("stored 1", "query", 1.0), Example("alone", "other query", 0.0),
    ]  # fmt: skip
    grouped = query_groups(examples, first_id=7)
    assert sorted((ex.a, ex.group) for ex in grouped) == [("alone", -1), ("stored 1", 7), ("stored 2", 7)]


def test_grouped_batches_keep_every_group_whole_and_depend_only_on_the_seed() -> None:
    examples = query_groups(
        [Example(f"stored {n}", f"query {n % 5}", float(n % 3 == 0)) for n in range(30)]
        + [Example(f"lone {n}", f"lone query {n}", 0.0) for n in range(12)]
    )
    first = grouped_batches(examples, 8, 12, random.Random(1))
    assert first == grouped_batches(examples, 8, 12, random.Random(1))
    assert first != grouped_batches(examples, 8, 12, random.Random(2))
    assert len(first) == 12 and all(len(batch) >= 8 for batch in first)
    sizes = {group: sum(ex.group == group for ex in examples) for group in range(5)}
    for batch in first:
        for group in {ex.group for ex in batch} - {-1}:
            assert sum(ex.group == group for ex in batch) % sizes[group] == 0  # never split across batches
