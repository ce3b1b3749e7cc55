"""The pairs written for the verifiers' training (multilingual and English): well formed, and none of their
texts one that judges the rule in the repository (the pairs written for the tests, the new-subjects check,
the English held-out subjects). Against the development sets' calibration and test parts, which live outside
the repository (../shared/data): bench/semantic/check_data_leaks.py."""

from __future__ import annotations

import json
from pathlib import Path

from evaluation.pair_sets import load_pairs
from tests.pair_fixtures import ENGLISH_PAIRS, MULTILINGUAL_PAIRS, fixture_texts
from training.multilingual_pairs import LANGUAGES, written_pairs
from training.train_verifier import WRITTEN_FILE as ENGLISH_WRITTEN_FILE

ROOT = Path(__file__).resolve().parents[2]
NEW_SUBJECTS = ROOT / "bench" / "semantic" / "data" / "multilingual_new_subjects.jsonl"
ML_CALIBRATION_DIR = ROOT / "bench" / "semantic" / "data" / "ml_extra"
ENGLISH_HOLDOUT = ROOT / "bench" / "semantic" / "data" / "english_new_subjects_holdout.jsonl"


def test_written_pairs_are_labelled_pairs_of_two_different_texts_in_each_language() -> None:
    pairs = written_pairs()
    assert {pair.lang for pair in pairs} == set(LANGUAGES)
    assert all(pair.label in (0, 1) and pair.kind and pair.a != pair.b for pair in pairs)
    for language in LANGUAGES:
        labels = [pair.label for pair in pairs if pair.lang == language]
        assert labels.count(1) >= 10 and labels.count(0) >= 10, language
    assert len({(pair.a, pair.b) for pair in pairs}) == len(pairs)


def test_no_written_text_is_one_that_judges_the_rule() -> None:
    judged = fixture_texts(MULTILINGUAL_PAIRS, NEW_SUBJECTS)
    written = {text.strip() for pair in written_pairs() for text in (pair.a, pair.b)}
    assert not written & judged


def test_english_written_pairs_are_labelled_pairs_of_two_different_texts() -> None:
    pairs = load_pairs(ENGLISH_WRITTEN_FILE)
    labels = [pair.label for pair in pairs]
    assert labels.count(1) >= 500 and labels.count(0) >= 500
    assert all(pair.kind and pair.a != pair.b for pair in pairs)
    assert len({frozenset((pair.a, pair.b)) for pair in pairs}) == len(pairs)


def test_no_english_written_text_is_one_that_judges_the_rule() -> None:
    judged = {text.casefold() for text in fixture_texts(ENGLISH_PAIRS, MULTILINGUAL_PAIRS, ENGLISH_HOLDOUT)}
    written = {
        text.strip().casefold() for pair in load_pairs(ENGLISH_WRITTEN_FILE) for text in (pair.a, pair.b)
    }
    assert not written & judged


def test_multilingual_calibration_pairs_are_in_every_language_and_judge_nothing_they_calibrate() -> None:
    pairs = [pair for path in sorted(ML_CALIBRATION_DIR.glob("*.jsonl")) for pair in load_pairs(path)]
    assert {pair.lang for pair in pairs} == set(LANGUAGES)
    for language in LANGUAGES:
        labels = [pair.label for pair in pairs if pair.lang == language]
        assert labels.count(1) >= 90 and labels.count(0) >= 90, language
    judged = fixture_texts(NEW_SUBJECTS, MULTILINGUAL_PAIRS)
    assert not {text.strip() for pair in pairs for text in (pair.a, pair.b)} & judged


def test_the_english_held_out_subjects_are_not_trained_on() -> None:
    from training.hold_out_written import held_out_subject

    held = load_pairs(ENGLISH_HOLDOUT)
    assert len(held) >= 200
    with ENGLISH_HOLDOUT.open(encoding="utf-8") as lines:
        assert all(held_out_subject(json.loads(line)["domain"]) for line in lines if line.strip())
    with ENGLISH_WRITTEN_FILE.open(encoding="utf-8") as lines:
        assert not any(held_out_subject(json.loads(line)["domain"]) for line in lines if line.strip())
    trained = {
        text.strip().casefold() for pair in load_pairs(ENGLISH_WRITTEN_FILE) for text in (pair.a, pair.b)
    }
    assert not {text.strip().casefold() for pair in held for text in (pair.a, pair.b)} & trained
