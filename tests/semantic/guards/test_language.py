"""The language gate: which prompts the rule judges, and that the cache gives the others exact hits only."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from semantic.cache import LookupKind, SemanticCache
from semantic.guards.language import MIXED, NO_LANGUAGE, language_of, pair_refusal
from semantic.guards.near_duplicate import near_duplicate_reason
from semantic.rule.calibration import Calibration
from semantic.rule.calibration_fit import measured_languages
from semantic.rule.loading import load_rule
from semantic.store.entries import RedisEntryStore
from tests.pair_fixtures import MULTILINGUAL_PAIRS
from tests.semantic.builders import make_scope
from tests.semantic.rule.test_rule import ScriptedVerifier, make_calibration

NEAREST = 3  # the candidates a lookup reads (`CacheConfig.candidates` is 4; the nearest is judged)


@pytest.mark.parametrize(
    ("text", "code"),
    [
        ("哪种动物寿命最长？", "zh"),
        ("Python里怎么把列表倒序排列？", "zh"),  # English words in a Chinese question
        ("東京タワーの高さは何メートルですか？", "ja"),
        ("Как сварить борщ?", "ru"),
        ("¿Cómo convierto kilómetros a millas?", "es"),
        ("Wie alt ist der Kölner Dom?", "de"),
        ("Quels pays exigent un visa pour les Français ?", "fr"),
        ("How do I reverse a list in Python?", "en"),
        ("AWS CLI v2 install on Linux", "en"),  # too short for the identifier to be sure of Estonian
        ("React props state 違い", MIXED),  # called English, but kana and kanji are no English
        ("2 + 2 = ?", NO_LANGUAGE),
    ],
)
def test_language_of(text: str, code: str) -> None:
    assert language_of(text) == code


def test_a_pair_is_judged_only_in_a_measured_language_and_the_same_one() -> None:
    english = ("en",)
    assert (
        pair_refusal("How tall is the Eiffel Tower?", "What is the Eiffel Tower's height?", english) is None
    )
    assert pair_refusal("What is 12 * 7?", "12*7", english) is None  # no letters: any language
    assert pair_refusal("哪种动物寿命最长？", "哪种动物寿命最短？", english) == (
        "language zh not calibrated: exact hits only"
    )
    assert pair_refusal("How tall is the Eiffel Tower?", "¿Qué altura tiene la Torre Eiffel?", english)
    both = ("en", "es")
    assert pair_refusal("How tall is the Eiffel Tower?", "¿Qué altura tiene la Torre Eiffel?", both) == (
        "languages differ"
    )


def test_the_rule_refuses_an_unmeasured_language_before_anything_runs() -> None:
    from semantic.rule.calibrated_rule import CalibratedRule

    verifier = ScriptedVerifier({"哪种动物寿命最短？": 0.999})
    rule = CalibratedRule(verifier, make_calibration(), 0.02)  # type: ignore[arg-type]
    assert rule.languages == ("en",)  # a calibration that names none was fitted on English
    verdict = rule.judge("哪种动物寿命最长？", "哪种动物寿命最短？", similarity=0.99)
    assert not verdict.hit and verdict.reason.startswith("language zh")
    assert rule.quick_verdict("哪种动物寿命最长？", "哪种动物寿命最短？", 0.99) == verdict
    assert verifier.asked == 0
    assert rule.language_refusal("Wie alt ist der Kölner Dom?") is not None
    assert rule.language_refusal("How old is Cologne Cathedral?") is None


def test_a_calibration_names_its_languages_and_refuses_none(tmp_path: Path) -> None:
    calibration = Calibration(0.5, ("numbers",), make_calibration().points, "0" * 64, languages=("en", "de"))
    loaded = Calibration.load(calibration.save(tmp_path / "calibration.json"))
    assert loaded.languages == ("en", "de")
    payload = json.loads((tmp_path / "calibration.json").read_text())
    payload["languages"] = []
    (tmp_path / "calibration.json").write_text(json.dumps(payload))
    with pytest.raises(ValueError, match="languages"):
        Calibration.load(tmp_path / "calibration.json")


def test_a_language_is_measured_only_with_enough_pairs_in_it() -> None:
    english = [
        (f"How do I reset router {index}?", f"Resetting router {index}: how?", 1) for index in range(60)
    ]
    english += [(f"How do I buy a car {index}?", f"How do I sell a car {index}?", 0) for index in range(60)]
    german = [("Wie alt ist der Kölner Dom?", "Wie alt ist der Dom in Köln?", 1)] * 50
    assert measured_languages(english + german) == ("en",)


def test_one_differing_chinese_character_is_another_word_not_a_typo() -> None:
    assert near_duplicate_reason("哪种动物寿命最长？", "哪种动物寿命最短？") is None
    assert near_duplicate_reason("How do I recieve a refund?", "How do I receive a refund?") is not None


@pytest.mark.redis
async def test_the_cache_gives_an_unmeasured_language_exact_hits_only(
    store: RedisEntryStore, embedder: Any
) -> None:
    rule = load_rule()
    cache = SemanticCache(store, embedder, rule)
    await cache.start()
    try:
        stored = make_scope("哪种动物寿命最长？")
        inserted = await cache.insert(stored, "answer")
        assert inserted is not None and not inserted.semantic
        assert inserted.reason.startswith("language zh")
        assert cache.sync.index.scope_size(stored.scope_id) == 0  # never anyone's candidate
        assert (await cache.lookup(make_scope("哪种动物寿命最长？"))).kind is LookupKind.EXACT_HIT
        other = await cache.lookup(make_scope("哪种动物寿命最短？"))
        assert other.kind is LookupKind.MISS and other.reason.startswith("language zh")
        english = make_scope("How do I reset my password?")
        await cache.insert(english, "answer")
        assert cache.sync.index.scope_size(english.scope_id) == 1
    finally:
        await cache.stop()


@pytest.mark.slow
def test_no_hit_between_different_questions_of_one_language(embedder: Any) -> None:
    """Each prompt of the multilingual pairs written for the tests (six languages, typos and one-character
    changes among them) against the nearest others of its language (by the embedder, as a lookup meets them):
    a hit may only pair prompts labelled the same question. Cross-language pairs never hit."""
    rows = [
        json.loads(line)
        for line in MULTILINGUAL_PAIRS.read_text(encoding="utf-8").splitlines()
        if line.strip()
    ]
    same = {frozenset((row["a"], row["b"])) for row in rows if row["label"] == 1}
    by_language: dict[str, set[str]] = {}
    for row in rows:
        if "-" not in row["lang"]:
            by_language.setdefault(row["lang"], set()).update((row["a"], row["b"]))
    rule = load_rule()
    pairs: list[tuple[str, str]] = []
    similarities: list[float] = []
    for texts in by_language.values():
        ordered = sorted(texts)
        vectors = embedder.embed(ordered)  # (N, D), unit rows
        cosines = vectors @ vectors.T  # (N, N)
        np.fill_diagonal(cosines, -1.0)
        for row, text in enumerate(ordered):
            for column in np.argsort(-cosines[row])[:NEAREST]:
                pairs.append((text, ordered[column]))
                similarities.append(float(cosines[row, column]))
    crosslang = [(row["b"], row["a"]) for row in rows if "-" in row["lang"]]
    stored, looked_up = embedder.embed([a for _, a in crosslang]), embedder.embed([b for b, _ in crosslang])
    pairs += crosslang
    similarities += (stored * looked_up).sum(axis=1).tolist()
    verdicts = rule.judge_many(pairs, similarities)
    wrong = [
        pair
        for pair, verdict in zip(pairs, verdicts, strict=True)
        if verdict.hit and frozenset(pair) not in same
    ]
    assert wrong == []
    assert not any(verdict.hit for verdict in verdicts[len(pairs) - len(crosslang) :])
