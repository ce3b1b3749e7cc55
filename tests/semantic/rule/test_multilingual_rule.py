"""The multilingual rule: one threshold that holds the target in every language, cheap checks that need no
model, and the routing that sends each pair to the rule of its language."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import numpy.typing as npt
import pytest

from semantic.rule.calibrated_rule import CalibratedRule
from semantic.rule.language_routed_rule import LanguageRoutedRule
from semantic.rule.language_thresholds import LanguageThresholds, fit_shared_threshold
from semantic.rule.profiles import MULTILINGUAL
from semantic.rule.verdict import PairByPair, Verdict


class TableScorer:
    """P(same) from a table of pairs (0.5 for any other); counts the pairs it was asked."""

    def __init__(self, table: dict[tuple[str, str], float]) -> None:
        self.table = table
        self.asked: list[tuple[str, str]] = []

    def probabilities(self, pairs: Sequence[tuple[str, str]]) -> npt.NDArray[np.float32]:
        self.asked.extend(pairs)
        return np.array([self.table.get(pair, 0.5) for pair in pairs], dtype=np.float32)


def thresholds(value: float = 0.9) -> LanguageThresholds:
    return LanguageThresholds(
        {"zh": {0.01: 0.99, 0.02: value}, "ja": {0.02: value}}, "sha", {"zh": 10, "ja": 10}
    )


def test_one_threshold_holds_the_target_in_every_language() -> None:
    # zh alone would be served from 0.5; ja has a negative at 0.8, so both need a threshold above it.
    scores = np.array([0.95, 0.9, 0.5, 0.4, 0.99, 0.8, 0.7, 0.1])
    labels = np.array([1, 1, 1, 0, 1, 0, 1, 0])
    languages = np.array(["zh", "zh", "zh", "zh", "ja", "ja", "ja", "ja"])
    assert fit_shared_threshold(scores, labels, languages, 0.02) == pytest.approx(0.9)
    # At a third, each language's one negative may pass once its paraphrases dilute it (ja: 1 of 3 hits
    # from 0.7 down; zh: 1 of 4 at 0.4).
    assert fit_shared_threshold(scores, labels, languages, 0.34) == pytest.approx(0.4)
    assert fit_shared_threshold(scores, labels, languages, 0.3) == pytest.approx(0.9)


def test_only_the_best_candidate_of_a_lookup_counts() -> None:
    # Lookup 0: its best candidate is the paraphrase (0.97); the negative at 0.96 is never what is served.
    scores = np.array([0.97, 0.96, 0.9])
    labels = np.array([1, 0, 1])
    languages = np.array(["zh", "zh", "zh"])
    lookups = np.array([0, 0, -1])
    assert fit_shared_threshold(scores, labels, languages, 0.02, lookups) == pytest.approx(0.9)
    assert fit_shared_threshold(scores, labels, languages, 0.02) == pytest.approx(0.97)


def test_no_threshold_when_the_top_score_is_wrong_everywhere() -> None:
    scores = np.array([0.99, 0.5])
    assert fit_shared_threshold(scores, np.array([0, 1]), np.array(["zh", "zh"]), 0.02) is None


def test_thresholds_serve_the_strictest_fitted_target_within_the_asked_one(tmp_path: Path) -> None:
    fitted = thresholds()
    assert fitted.threshold("zh", 0.02) == 0.9
    assert fitted.threshold("zh", 0.015) == 0.99
    assert math.isinf(fitted.threshold("zh", 0.005))  # stricter than anything fitted: exact hits only
    assert math.isinf(fitted.threshold("ru", 0.02))
    assert fitted.languages(0.02) == ("ja", "zh") and fitted.languages(0.01) == ("zh",)
    assert LanguageThresholds.load(fitted.save(tmp_path / "t.json")) == fitted


def test_the_rule_refuses_what_needs_no_model_and_asks_the_verifier_the_rest() -> None:
    scorer = TableScorer(
        {("哪种动物寿命最长？", "什么动物寿命最长？"): 0.95, ("日本の首都はどこ？", "日本の首都は？"): 0.85}
    )
    rule = CalibratedRule(scorer, thresholds(), profile=MULTILINGUAL)
    assert rule.languages == ("ja", "zh")
    cases = [
        (("哪种动物寿命最长？", "什么动物寿命最长？", 0.95), True, "verified"),
        (("日本の首都はどこ？", "日本の首都は？", 0.95), False, "verifier refused"),  # 0.85 < 0.9
        (("怎样才能不晕车？", "怎样才能不晕车", 0.99), True, "same words"),  # punctuation only
        (("100美元能换多少人民币？", "200美元能换多少人民币？", 0.99), False, "numbers differ"),
        (("怎样才能不晕车？", "車酔いしない方法は？", 0.95), False, "languages differ"),
        (("怎样才能不晕车？", "怎么做红烧肉才不腻？", 0.5), False, "below cosine gate"),
        (
            ("怎样才能不晕车？", "How do I avoid car sickness?", 0.95),
            False,
            "language en not calibrated: exact hits only",
        ),
    ]
    for (query, candidate, similarity), hit, reason in cases:
        verdict = rule.judge(query, candidate, similarity)
        assert (verdict.hit, verdict.reason) == (hit, reason), (query, candidate)
    assert scorer.asked == [
        ("哪种动物寿命最长？", "什么动物寿命最长？"),
        ("日本の首都はどこ？", "日本の首都は？"),
    ]
    # Strictness lowers the target below every fitted one for ja: no semantic hit without a model call.
    refused = rule.quick_verdict("日本の首都はどこ？", "日本の首都はどこですか", 0.95, strictness=0.9)
    assert refused is not None and not refused.hit


class Recording(PairByPair):
    """An English rule that hits everything and records what it judged."""

    name = "english"
    languages = ("en",)

    def __init__(self) -> None:
        self.judged: list[str] = []

    def language_refusal(self, text: str) -> str | None:
        return None if text.isascii() else "not English"

    def judge(self, query: str, candidate: str, similarity: float, strictness: float = 0.0) -> Verdict:
        self.judged.append(query)
        return Verdict(True, 0.7, "english")

    def quick_verdict(
        self, query: str, candidate: str, similarity: float, strictness: float = 0.0
    ) -> Verdict | None:
        return None


def test_pairs_go_to_the_rule_of_their_language_and_come_back_in_order() -> None:
    english = Recording()
    rule = LanguageRoutedRule(english, CalibratedRule(TableScorer({}), thresholds(0.4), profile=MULTILINGUAL))
    pairs = [
        ("How do I?", "How can I?"),
        ("怎样才能不晕车？", "如何不晕车？"),
        ("Why?", "Why so?"),
        ("Wie?", "Wieso?"),
    ]
    verdicts = rule.judge_many(pairs, [0.9, 0.9, 0.9, 0.9])
    assert [verdict.reason for verdict in verdicts] == ["english", "verified", "english", "english"]
    assert english.judged == ["How do I?", "Why?", "Wie?"]
    assert rule.languages == ("en", "ja", "zh")
    assert rule.language_refusal("怎样才能不晕车？") is None
    assert rule.language_refusal("Как не укачиваться в машине?") == "not English"
