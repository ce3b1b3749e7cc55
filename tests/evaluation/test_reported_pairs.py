"""Pairs reported through /admin/feedback in calibration: every fitted threshold raised above the pairs reported
wrong, a point that cannot then be met dropped (scores given directly: no model runs here)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from evaluation.reported_pairs import refuse_reported, reported_pairs
from semantic.rule.calibration import Calibration, CalibrationPoint

# The identity combiner: a verified pair's combined score is its verifier probability.
FITTED = Calibration(
    low_cosine=0.5,
    guards=(),
    points=(
        CalibrationPoint(0.005, 0.95, 0.0, 0.2, 30),
        CalibrationPoint(0.02, 0.5, 0.0, 0.8, 40),
        CalibrationPoint(0.2, 0.3, 0.02, 1.0, 51),
    ),
    verifier_sha256="0" * 64,
)


def rows(
    probabilities: list[float], labels: list[int], wrong: list[int], near: tuple[int, ...] = ()
) -> dict[str, np.ndarray]:
    """Pairs all past the gate and the guards, with these verifier probabilities; `wrong` rows reported."""
    count = len(probabilities)
    reported = np.zeros(count, dtype=bool)
    reported[wrong] = True
    near_duplicates = np.zeros(count, dtype=bool)
    near_duplicates[list(near)] = True
    return {
        "similarities": np.full(count, 0.9, dtype=np.float32),
        "probabilities": np.array(probabilities, dtype=np.float32),
        "judged": np.ones(count, dtype=bool),
        "near_duplicates": near_duplicates,
        "labels": np.array(labels),
        "reported_wrong": reported,
    }


def test_thresholds_below_a_pair_reported_wrong_are_raised_above_it() -> None:
    # 40 right hits at 0.9, one pair reported wrong at 0.6, ten wrong pairs at 0.2 nobody reported.
    given = rows([0.9] * 40 + [0.6] + [0.2] * 10, [1] * 40 + [0] * 11, wrong=[40])
    refused = refuse_reported(FITTED, **given)
    score = FITTED.combine(0.9, float(np.float32(0.6)))
    assert refused.points[0] == FITTED.points[0]  # above it already: as fitted
    for point in refused.points[1:]:
        assert point.threshold > score and point.threshold == pytest.approx(score)
        assert (point.hits, point.false_hit_rate, point.recall) == (40, 0.0, 1.0)
    assert [point.target for point in refused.points] == [0.005, 0.02, 0.2]
    assert all(refused.threshold_for(target) > score for target in (0.005, 0.01, 0.02, 0.1, 0.2, 0.5))


def test_a_point_that_cannot_then_be_met_is_dropped() -> None:
    # Only 20 right hits score above the pair reported wrong: fewer than a point may rest on.
    given = rows([0.9] * 20 + [0.6] + [0.4] * 30, [1] * 20 + [0] + [1] * 30, wrong=[20])
    refused = refuse_reported(FITTED, **given)
    assert refused.points == FITTED.points[:1]
    with pytest.raises(ValueError, match="no target"):
        refuse_reported(Calibration(0.5, (), FITTED.points[1:], "0" * 64), **given)


def test_pairs_the_rule_never_judges_change_nothing() -> None:
    given = rows([0.9] * 40 + [0.99], [1] * 40 + [0], wrong=[40])
    given["judged"][40] = False  # below the gate, or vetoed by a guard: refused already
    assert refuse_reported(FITTED, **given) == FITTED


def test_a_near_duplicate_reported_wrong_cannot_be_refused_by_a_threshold() -> None:
    given = rows([0.9] * 40 + [0.6], [1] * 40 + [0], wrong=[40], near=(40,))
    with pytest.raises(ValueError, match="near-duplicates"):
        refuse_reported(FITTED, **given)


def test_a_feedback_file_is_read_once_per_pair(tmp_path: Path) -> None:
    lines = [
        {"a": "stored", "b": "asked", "label": 0, "kind": "feedback", "tenant": "alpha", "request_id": "r1"},
        {"a": "stored", "b": "asked", "label": 0, "kind": "feedback", "tenant": "beta", "request_id": "r2"},
        {"a": "stored", "b": "asked", "label": 1, "kind": "feedback", "tenant": "gamma", "request_id": "r3"},
    ]
    path = tmp_path / "feedback.jsonl"
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    assert [(pair.a, pair.b, pair.label, pair.kind) for pair in reported_pairs(path)] == [
        ("stored", "asked", 0, "feedback"),
        ("stored", "asked", 1, "feedback"),
    ]
