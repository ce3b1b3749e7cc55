"""The second opinion (semantic/rule/second_opinion.py): asked only where the first verifier is unsure; served
as the shipped calibration says."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import numpy.typing as npt
import pytest

from semantic.rule.calibration import Calibration, CalibrationPoint, file_sha256
from semantic.rule.loading import load_rule, load_served_rule
from semantic.rule.profiles import ENGLISH, MULTILINGUAL, SHIPPED_CALIBRATION
from semantic.rule.second_opinion import SecondOpinion, SecondOpinionSettings
from semantic.rule.verifier_on_first_pair import LoadsOnFirstPair


def sigmoid(value: float) -> float:
    return 1.0 / (1.0 + math.exp(-value))


class FixedVerifier:
    """Answers each pair's first text's probability from a table; records what it was asked."""

    def __init__(self, name: str, table: dict[str, float]) -> None:
        self.name = name
        self.table = table
        self.asked: list[tuple[str, str]] = []

    def probabilities(
        self, pairs: Sequence[tuple[str, str]], batch_size: int = 64
    ) -> npt.NDArray[np.float32]:
        self.asked.extend(pairs)
        return np.array([self.table[query] for query, _ in pairs], dtype=np.float32)


SETTINGS = SecondOpinionSettings("0" * 64, sure_logit=6.0, floor_logit=2.0, logit_range=(-5.0, 4.0))


def test_the_second_verifier_is_asked_only_between_the_floor_and_the_sure_logit() -> None:
    first = FixedVerifier("first", {"sure": sigmoid(7.0), "unsure": sigmoid(3.0), "no": sigmoid(-1.0)})
    second = FixedVerifier("second", {"sure": 0.01, "unsure": sigmoid(3.5), "no": 0.99})
    scorer = SecondOpinion(first, second, SETTINGS)

    scores = scorer.probabilities([("sure", "x"), ("unsure", "y"), ("no", "z")])

    assert second.asked == [("unsure", "y")] and scorer.asked == 1
    # Skipped pairs read the second's answer at the end of its range the first points to.
    np.testing.assert_allclose(
        scores, [sigmoid((7.0 + 4.0) / 2), sigmoid((3.0 + 3.5) / 2), sigmoid((-1.0 - 5.0) / 2)], rtol=1e-5
    )
    assert scorer.name == "first+second"


def test_the_second_verifier_is_read_within_its_range_and_weighted() -> None:
    settings = SecondOpinionSettings("0" * 64, logit_range=(-5.0, 4.0), first_weight=0.75)
    first = FixedVerifier("first", {"q": sigmoid(4.0)})
    second = FixedVerifier("second", {"q": 1.0 - 1e-7})  # beyond the range: read as its top, 4.0
    score = SecondOpinion(first, second, settings).probability("q", "c")
    assert score == pytest.approx(sigmoid(0.75 * 4.0 + 0.25 * 4.0), rel=1e-5)


def test_a_floor_above_the_sure_logit_is_refused() -> None:
    with pytest.raises(ValueError):
        SecondOpinion(FixedVerifier("a", {}), FixedVerifier("b", {}), SecondOpinionSettings("0", 3.0, 4.0))


def test_a_calibration_keeps_its_second_opinion_and_older_files_have_none(tmp_path: Path) -> None:
    base = Calibration(0.5, ("numbers",), (CalibrationPoint(0.02, 0.99, 0.01, 0.4, 100),), "abc")
    with_opinion = Calibration(0.5, ("numbers",), base.points, "abc", second_opinion=SETTINGS.to_json())
    loaded = Calibration.load(with_opinion.save(tmp_path / "with.json"))
    assert loaded.second_opinion is not None
    assert SecondOpinionSettings.from_json(loaded.second_opinion) == SETTINGS
    assert Calibration.load(base.save(tmp_path / "without.json")).second_opinion is None


def test_a_calibration_fitted_with_other_second_weights_is_refused(tmp_path: Path) -> None:
    shipped = Calibration.load(SHIPPED_CALIBRATION)
    other = Calibration(
        shipped.low_cosine,
        shipped.guards,
        shipped.points,
        shipped.verifier_sha256,
        combiner=shipped.combiner,
        second_opinion=SecondOpinionSettings("f" * 64).to_json(),
    )
    other.save(tmp_path / "calibration.json")
    with pytest.raises(ValueError, match="multilingual verifier weights"):
        load_rule(tmp_path)


def test_the_served_english_rule_asks_the_multilingual_verifier_the_shipped_calibration_names() -> None:
    shipped = Calibration.load(SHIPPED_CALIBRATION)
    assert shipped.second_opinion is not None
    assert shipped.second_opinion["sha256"] == file_sha256(MULTILINGUAL.weights)
    rule = load_served_rule()
    scorer = rule.english.verifier
    # One multilingual verifier serves both rules, loaded the first time either needs it.
    assert isinstance(scorer, SecondOpinion) and scorer.second is rule.multilingual.verifier
    assert isinstance(scorer.second, LoadsOnFirstPair)
    assert scorer.first.name == ENGLISH.verifier_name
