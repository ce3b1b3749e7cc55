"""eval-pairs: the split, the metrics, and the rule on held-out pairs (real verifier, real cache)."""

from __future__ import annotations

import json
import random
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import numpy.typing as npt
import pytest
from rich.console import Console

from evaluation.eval_pairs import kind_table
from evaluation.pair_sets import LabelledPair, load_pairs, split_pairs
from evaluation.probes import PairOutcome, RuleProbe, cache_probe, default_embedder
from evaluation.scoring import (
    EvalReport,
    KindFigures,
    precision_at_recall,
    recall_at_precision,
    roc_auc,
    score_outcomes,
)
from semantic.rule.calibrated_rule import CalibratedRule
from semantic.rule.loading import load_rule
from semantic.rule.verdict import Verdict
from tests.pair_fixtures import ENGLISH_PAIRS


def make_pairs(count: int, seed: int = 0) -> list[LabelledPair]:
    generator = random.Random(seed)
    texts = [f"question {index}" for index in range(count)]
    return [
        LabelledPair(generator.choice(texts), generator.choice(texts), generator.randint(0, 1))
        for _ in range(count)
    ]


def test_split_keeps_every_text_in_one_part_and_ignores_file_order() -> None:
    pairs = make_pairs(600)
    parts = split_pairs(pairs, {"train": 0.6, "test": 0.4})
    assert sum(len(part) for part in parts.values()) == len(pairs)
    train_texts = {text for pair in parts["train"] for text in (pair.a, pair.b)}
    assert not train_texts & {text for pair in parts["test"] for text in (pair.a, pair.b)}
    shuffled = pairs[:]
    random.Random(1).shuffle(shuffled)
    assert {name: set(part) for name, part in split_pairs(shuffled, {"train": 0.6, "test": 0.4}).items()} == {
        name: set(part) for name, part in parts.items()
    }


def test_roc_auc_matches_counting_pairs_with_ties() -> None:
    generator = np.random.default_rng(3)
    scores = generator.integers(0, 5, 200).astype(np.float64)
    labels = generator.integers(0, 2, 200)
    positives, negatives = scores[labels == 1], scores[labels == 0]
    expected = (
        (positives[:, None] > negatives[None, :]).sum()
        + 0.5 * (positives[:, None] == negatives[None, :]).sum()
    ) / (len(positives) * len(negatives))
    assert roc_auc(scores, labels) == pytest.approx(expected)


def test_recall_at_precision_only_cuts_between_distinct_values() -> None:
    similarities = np.array([0.99, 0.98, 0.9, 0.9, 0.5])
    labels = np.array([1, 1, 1, 0, 1])
    assert recall_at_precision(similarities, labels, 1.0) == pytest.approx(0.5)
    # Splitting the tied 0.9s would give 3/3 correct; a threshold can only take both (3/4) or neither.
    assert recall_at_precision(similarities, labels, 0.85) == pytest.approx(0.5)
    assert recall_at_precision(similarities, labels, 0.8) == pytest.approx(1.0)
    assert recall_at_precision(similarities, labels, 0.0) == pytest.approx(1.0)


def test_precision_at_recall_takes_the_first_threshold_that_reaches_it() -> None:
    similarities = np.array([0.99, 0.98, 0.9, 0.8, 0.5])
    labels = np.array([1, 0, 1, 0, 1])
    assert precision_at_recall(similarities, labels, 1 / 3) == pytest.approx(1.0)
    assert precision_at_recall(similarities, labels, 2 / 3) == pytest.approx(2 / 3)
    assert precision_at_recall(similarities, labels, 1.0) == pytest.approx(3 / 5)
    assert precision_at_recall(similarities, labels, 0.0) == 1.0


def test_report_summary_has_exactly_the_six_keys() -> None:
    pairs = [LabelledPair("a", "b", 1), LabelledPair("c", "d", 0), LabelledPair("e", "f", 1)]
    outcomes = [
        PairOutcome(0.9, Verdict(True, 0.9, "verified")),
        PairOutcome(0.95, Verdict(True, 0.8, "verified")),
        PairOutcome(0.7, Verdict(False, 0.1, "verifier refused")),
    ]
    report = score_outcomes(pairs, outcomes, 0.02)
    assert list(report.summary()) == [
        "precision",
        "recall",
        "false_hit_rate",
        "auc",
        "baseline_recall_at_same_precision",
        "baseline_precision_at_same_recall",
    ]
    assert (report.precision, report.recall, report.false_hit_rate) == (0.5, 0.5, 0.5)
    json.dumps(report.summary())


def test_a_file_with_kinds_gets_figures_per_kind(tmp_path: Path) -> None:
    path = tmp_path / "pairs.jsonl"
    rows = [
        {"a": "from A to B", "b": "from B to A", "label": 0, "kind": "direction"},
        {"a": "to X from Y", "b": "to Y from X", "label": 0, "kind": "direction"},
        {"a": "hello there", "b": "helo there", "label": 1, "kind": "typo"},
        {"a": "plain", "b": "pairs", "label": 1},
    ]
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    pairs = load_pairs(path)
    assert [pair.kind for pair in pairs] == ["direction", "direction", "typo", None]
    verdicts = [
        Verdict(True, 0.9, "verified"),
        Verdict(False, 0.1, "x"),
        Verdict(True, 1.0, "y"),
        Verdict(True, 1.0, "z"),
    ]
    report = score_outcomes(pairs, [PairOutcome(0.9, verdict) for verdict in verdicts], 0.02)
    assert report.by_kind == {"direction": KindFigures(2, 0, 1, 1), "typo": KindFigures(1, 1, 1, 0)}
    assert report.by_kind["typo"].recall == 1.0 and report.by_kind["direction"].recall is None
    rendered = Console(width=100, record=True)
    rendered.print(kind_table(report))
    text = rendered.export_text()
    assert "direction" in text and "1.00" in text


def test_load_pairs_refuses_a_bad_label(tmp_path: Path) -> None:
    path = tmp_path / "pairs.jsonl"
    path.write_text('{"a": "x", "b": "y", "label": 1}\n{"a": "x", "b": "y", "label": 2}\n')
    with pytest.raises(ValueError, match=":2:"):
        load_pairs(path)


class MemoVerifier:
    """The real verifier, remembered per pair: several targets are judged on one set of scores."""

    def __init__(self, rule: CalibratedRule) -> None:
        self.inner = rule.verifier
        self.name = self.inner.name
        self.memo: dict[tuple[str, str], float] = {}

    def probabilities(
        self, pairs: Sequence[tuple[str, str]], batch_size: int = 64
    ) -> npt.NDArray[np.float32]:
        missing = [pair for pair in dict.fromkeys(pairs) if pair not in self.memo]
        self.memo.update(zip(missing, self.inner.probabilities(missing).tolist(), strict=True))
        return np.array([self.memo[pair] for pair in pairs], dtype=np.float32)


@pytest.fixture(scope="module")
def held_out() -> list[LabelledPair]:
    """The English pairs written for the tests (360, half positive, the negatives hard): the verifier was never
    trained on them nor the calibration fitted on them, so every one is held out."""
    return load_pairs(ENGLISH_PAIRS)


@pytest.fixture(scope="module")
def held_out_reports(held_out: list[LabelledPair]) -> dict[float, EvalReport]:
    import asyncio

    embedder = default_embedder()
    shared = MemoVerifier(load_rule())
    reports = {}
    for target in (0.01, 0.02, 0.05, 0.15):
        rule = load_rule(target_false_hit_rate=target, verifier=shared)
        outcomes = asyncio.run(RuleProbe(embedder, rule)(held_out))
        reports[target] = score_outcomes(held_out, outcomes, target)
    return reports


@pytest.mark.slow
def test_targets_order_recall_and_bound_the_false_hit_rate(held_out_reports: dict[float, EvalReport]) -> None:
    recalls = [held_out_reports[target].recall for target in (0.01, 0.02, 0.05, 0.15)]
    assert recalls == sorted(recalls) and recalls[0] < recalls[-1]
    for target, report in held_out_reports.items():
        # 180 positives: a few tens of hits at the low targets, so allow sampling noise over the target.
        assert report.false_hit_rate <= target + 0.05, (target, report)
    loose = held_out_reports[0.15]
    assert loose.recall > loose.baseline_recall_at_same_precision


@pytest.mark.slow
def test_the_served_rule_refuses_arithmetic_that_differs() -> None:
    rule = load_rule(target_false_hit_rate=0.2)
    assert not rule.judge("What is 2+2?", "What is 2+3?", 0.98).hit
    assert rule.judge("How do I reset my password?", "How can I reset my password?", 0.97).hit


@pytest.mark.slow
@pytest.mark.redis
async def test_the_real_cache_gives_the_rule_verdicts(held_out: list[LabelledPair]) -> None:
    import redis.asyncio as aioredis

    from tests.semantic.builders import REDIS_URL

    client = aioredis.Redis.from_url(REDIS_URL)
    try:
        await client.ping()
    except (aioredis.ConnectionError, OSError):
        await client.aclose()
        pytest.skip(f"no Redis at {REDIS_URL}")
    embedder = default_embedder()
    rule = load_rule(verifier=MemoVerifier(load_rule()))
    pairs = held_out[:40]
    try:
        async with cache_probe(client, embedder)(rule) as probe:
            through_cache = await probe(pairs)
        assert not [key async for key in client.scan_iter(match="kvgate:eval:*")]
    finally:
        await client.aclose()
    direct = await RuleProbe(embedder, rule)(pairs)
    assert [outcome.verdict.hit for outcome in through_cache] == [outcome.verdict.hit for outcome in direct]
    assert [outcome.similarity for outcome in through_cache] == pytest.approx(
        [o.similarity for o in direct], abs=1e-4
    )
