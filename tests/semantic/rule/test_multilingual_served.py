"""The shipped multilingual rule and embedder, as the cache serves them, on pairs nothing was trained or fitted
on: the multilingual pairs written for the tests (tests/data/) and the new-subjects check (bench/semantic/data/)."""

from __future__ import annotations

from pathlib import Path

import pytest

from evaluation.pair_sets import LabelledPair, load_pairs
from evaluation.scope_lookups import every_prompt_served
from semantic.embedding.e5_embedder import E5Embedder
from semantic.rule.calibrated_rule import CalibratedRule
from semantic.rule.calibration import DEFAULT_TARGET_FALSE_HIT_RATE, file_sha256
from semantic.rule.language_thresholds import LanguageThresholds
from semantic.rule.loading import load_rule
from semantic.rule.profiles import MULTILINGUAL, MULTILINGUAL_CALIBRATION, MULTILINGUAL_WEIGHTS
from tests.pair_fixtures import MULTILINGUAL_PAIRS

# Written for this check, in subjects the development set has not; never trained or calibrated on.
NEW_SUBJECTS = (
    Path(__file__).resolve().parents[3] / "bench" / "semantic" / "data" / "multilingual_new_subjects.jsonl"
)
LANGUAGES = ("de", "es", "fr", "ja", "ru", "zh")
JUDGED = 3  # CacheConfig.judged: the nearest candidates a lookup judges


@pytest.fixture(scope="module")
def rule() -> CalibratedRule:
    return load_rule(profile=MULTILINGUAL)


@pytest.fixture(scope="module")
def embedder() -> E5Embedder:
    return E5Embedder()


@pytest.fixture(scope="module")
def written_pairs() -> list[LabelledPair]:
    """13 questions a language, each with three rewordings and two hard negatives (78 prompts a language)."""
    return load_pairs(MULTILINGUAL_PAIRS)


def test_shipped_weights_are_small_and_the_thresholds_were_fitted_for_them(rule: CalibratedRule) -> None:
    assert MULTILINGUAL_WEIGHTS.stat().st_size < 25 * 2**20
    thresholds = LanguageThresholds.load(MULTILINGUAL_CALIBRATION)
    assert thresholds.verifier_sha256 == file_sha256(MULTILINGUAL_WEIGHTS)
    assert rule.languages == LANGUAGES


def test_a_chinese_rewording_hits_and_different_chinese_questions_do_not(
    rule: CalibratedRule, embedder: E5Embedder
) -> None:
    stored = "快递显示已签收但我没收到怎么办"
    asked = {
        "包裹显示签收了可是我根本没拿到，该怎么处理？": True,  # the same question (a rephrase)
        "怎么做红烧肉才不腻？": False,  # issue 31: served for "怎样才能不晕车？" by the English rule
        "快递显示已签收但我没收到怎么办？": True,  # punctuation only
        "快递显示未签收但我没收到怎么办": False,  # not signed for: another question
    }
    vectors = embedder.embed([stored, *asked])
    similarities = (vectors[1:] @ vectors[0]).tolist()
    verdicts = rule.judge_many([(query, stored) for query in asked], similarities)
    assert [verdict.hit for verdict in verdicts] == list(asked.values()), [v.reason for v in verdicts]


def test_every_prompt_against_every_other_of_its_language(
    rule: CalibratedRule, embedder: E5Embedder, written_pairs: list[LabelledPair]
) -> None:
    """Issue 31: each prompt of the pairs written for the tests looked up in a scope holding every other
    prompt of its language, its 3 nearest judged, the best accepted one served. A hit serving a prompt that
    no positive pair joins to it counts as wrong, even where the two would ask the same thing unlabelled: in
    every language at most the served target of lookups is wrong (78 lookups: one), and there is a hit in
    every language."""
    for language in LANGUAGES:
        looked, served = every_prompt_served(
            [pair for pair in written_pairs if pair.lang == language],
            embedder.embed,
            rule.judge_many,
            JUDGED,
        )
        wrong = [(hit.query, hit.served) for hit in served if not hit.paraphrase]
        assert len(wrong) <= DEFAULT_TARGET_FALSE_HIT_RATE * looked, (language, wrong, looked)
        assert len(served) > len(wrong), language


def test_pairs_in_new_subjects_get_no_wrong_hit_and_different_questions_never_meet(
    rule: CalibratedRule, embedder: E5Embedder
) -> None:
    """Pairs written in subjects the development set has not (health, cooking, travel, finance, phones): no
    negative is served, in any language, and among all of a language's prompts looked up against each other no
    hit serves a different question. Some rewordings hit (the figures: bench_multilingual.py)."""
    pairs = load_pairs(NEW_SUBJECTS)
    assert {pair.lang for pair in pairs} == set(LANGUAGES)
    stored, asked = embedder.embed([pair.a for pair in pairs]), embedder.embed([pair.b for pair in pairs])
    verdicts = rule.judge_many([(pair.b, pair.a) for pair in pairs], (stored * asked).sum(axis=1).tolist())
    wrong = [
        (pair.a, pair.b)
        for pair, verdict in zip(pairs, verdicts, strict=True)
        if verdict.hit and not pair.label
    ]
    assert wrong == []
    assert any(verdict.hit for pair, verdict in zip(pairs, verdicts, strict=True) if pair.label)
    for language in LANGUAGES:
        _, served = every_prompt_served(
            [pair for pair in pairs if pair.lang == language], embedder.embed, rule.judge_many, JUDGED
        )
        assert [(hit.query, hit.served) for hit in served if not hit.paraphrase] == [], language
