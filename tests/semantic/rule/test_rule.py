"""The calibrated rule's policy, with a scripted verifier: gate, guards, thresholds, strictness, fitting."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import numpy.typing as npt
import pytest

from semantic.rule.calibrated_rule import CalibratedRule
from semantic.rule.calibration import Calibration, CalibrationPoint
from semantic.rule.calibration_fit import fit_calibration
from semantic.rule.loading import calibration_path
from semantic.rule.verdict import HitRule


class ScriptedVerifier:
    """Answers a fixed probability per candidate text (default 0.5) and counts the pairs it was asked."""

    name = "scripted"

    def __init__(self, answers: dict[str, float]) -> None:
        self.answers = answers
        self.asked = 0

    def probabilities(
        self, pairs: Sequence[tuple[str, str]], batch_size: int = 64
    ) -> npt.NDArray[np.float32]:
        self.asked += len(pairs)
        return np.array([self.answers.get(candidate, 0.5) for _, candidate in pairs], dtype=np.float32)


def make_calibration(low_cosine: float = 0.5, guards: tuple[str, ...] = ("numbers",)) -> Calibration:
    points = (
        CalibrationPoint(0.01, 0.95, 0.01, 0.3, 300),
        CalibrationPoint(0.02, 0.90, 0.02, 0.45, 450),
        CalibrationPoint(0.05, 0.70, 0.05, 0.6, 600),
    )
    return Calibration(low_cosine, guards, points, verifier_sha256="0" * 64)


def make_rule(answers: dict[str, float], target: float = 0.02, **calibration: object) -> CalibratedRule:
    return CalibratedRule(ScriptedVerifier(answers), make_calibration(**calibration), target)  # type: ignore[arg-type]


def test_satisfies_the_hit_rule_protocol() -> None:
    rule: HitRule = make_rule({})
    assert rule.name == "calibrated-verifier"


def test_below_the_cosine_gate_is_a_miss_without_the_verifier() -> None:
    rule = make_rule({"stored": 0.99})
    verdict = rule.judge("new", "stored", similarity=0.3)
    assert not verdict.hit and verdict.reason == "below cosine gate"
    assert verdict.score < 0.01
    assert rule.verifier.asked == 0  # type: ignore[attr-defined]


def test_guard_vetoes_before_the_verifier() -> None:
    rule = make_rule({"What is 2+3?": 0.999})
    verdict = rule.judge("What is 2+2?", "What is 2+3?", similarity=0.97)
    assert (verdict.hit, verdict.reason) == (False, "numbers differ")
    assert rule.verifier.asked == 0  # type: ignore[attr-defined]


def test_verifier_decides_against_the_target_threshold() -> None:
    answers = {"sure": 0.97, "likely": 0.92, "maybe": 0.8}
    rule = make_rule(answers, target=0.02)
    assert [rule.judge("q", text, 0.9).hit for text in ("sure", "likely", "maybe")] == [True, True, False]
    loose = make_rule(answers, target=0.05)
    assert loose.judge("q", "maybe", 0.9).hit
    strict = make_rule(answers, target=0.01)
    assert [strict.judge("q", text, 0.9).hit for text in ("sure", "likely")] == [True, False]


def test_strictness_only_makes_hits_rarer() -> None:
    rule = make_rule({"likely": 0.92, "sure": 0.999})
    assert rule.judge("q", "likely", 0.9, strictness=0.0).hit
    assert not rule.judge("q", "likely", 0.9, strictness=0.6).hit
    assert not rule.judge("q", "sure", 0.9, strictness=1.0).hit


def test_same_text_up_to_case_and_punctuation_is_a_hit() -> None:
    rule = make_rule({"how do i reset my password": 0.0})
    assert rule.judge("How do I reset my password?", "how do i reset my password", 0.99).hit


def test_judge_many_matches_judge() -> None:
    rule = make_rule({"a": 0.97, "b": 0.1, "What is 2+3?": 0.99})
    pairs = [("q", "a"), ("q", "b"), ("What is 2+2?", "What is 2+3?"), ("q", "a")]
    similarities = [0.9, 0.9, 0.95, 0.2]
    assert rule.judge_many(pairs, similarities) == [
        rule.judge(query, candidate, similarity)
        for (query, candidate), similarity in zip(pairs, similarities, strict=True)
    ]


def test_quick_verdict_settles_what_needs_no_verifier_and_defers_the_rest() -> None:
    rule = make_rule({"likely": 0.92})
    assert rule.quick_verdict("new", "stored", 0.3).reason == "below cosine gate"  # type: ignore[union-attr]
    assert rule.quick_verdict("What is 2+2?", "What is 2+3?", 0.97).reason == "numbers differ"  # type: ignore[union-attr]
    assert rule.quick_verdict("Reset it?", "reset it", 0.99).hit  # type: ignore[union-attr]
    assert rule.quick_verdict("q", "likely", 0.9) is None  # the verifier must say
    below_every_target = make_rule({"likely": 0.999}, target=0.005)
    verdict = below_every_target.quick_verdict("q", "likely", 0.9)
    assert (
        verdict is not None and not verdict.hit and verdict.reason == "no calibrated threshold at this target"
    )
    assert rule.verifier.asked == below_every_target.verifier.asked == 0  # type: ignore[attr-defined]
    # Evaluation still scores such pairs (they rank in ROC-AUC), with the same decision.
    scored = below_every_target.judge("q", "likely", 0.9)
    assert not scored.hit and scored.score > 0.5 and below_every_target.verifier.asked == 1  # type: ignore[attr-defined]


def test_thresholds_rise_as_the_target_falls() -> None:
    calibration = make_calibration()
    targets = [0.0, 0.001, 0.005, 0.01, 0.015, 0.02, 0.05, 0.2]
    thresholds = [calibration.threshold_for(target) for target in targets]
    assert thresholds == sorted(thresholds, reverse=True)
    assert thresholds[0] > 1.0  # target 0: nothing can hit
    assert calibration.threshold_for(0.015) == pytest.approx(0.925)


def test_calibration_round_trips_through_json(tmp_path: Path) -> None:
    calibration = make_calibration(guards=("numbers", "negation"))
    path = calibration.save(tmp_path / "calibration.json")
    assert Calibration.load(path) == calibration


def test_calibration_refuses_unknown_guards(tmp_path: Path) -> None:
    path = make_calibration(guards=("numbers",)).save(tmp_path / "calibration.json")
    path.write_text(path.read_text().replace('"numbers"', '"astrology"'))
    with pytest.raises(ValueError, match="unknown guards"):
        Calibration.load(path)


def test_user_calibration_is_preferred(tmp_path: Path) -> None:
    assert calibration_path(tmp_path).name == "calibration.json"
    assert calibration_path(tmp_path).parent != tmp_path
    make_calibration().save(tmp_path / "calibration.json")
    assert calibration_path(tmp_path) == tmp_path / "calibration.json"


def test_fit_meets_each_target_on_the_pairs_it_was_fitted_on() -> None:
    generator = np.random.default_rng(7)
    labels = generator.integers(0, 2, 4000)
    # A noisy verifier: positives score higher on average.
    probabilities = 1 / (1 + np.exp(-(3.0 * (labels * 2 - 1) + generator.normal(0, 2.0, len(labels)))))
    similarities = np.full(len(labels), 0.9)
    vetoed = np.zeros(len(labels), dtype=bool)
    calibration = fit_calibration(
        similarities, probabilities, vetoed, labels,
        low_cosine=0.5, guards=(), verifier_sha256="x", fitted_on={},
        targets=(0.01, 0.02, 0.05),
    )  # fmt: skip
    assert [point.target for point in calibration.points] == [0.01, 0.02, 0.05]
    recalls = [point.recall for point in calibration.points]
    assert recalls == sorted(recalls) and recalls[0] < recalls[-1]
    for point in calibration.points:
        hits = probabilities >= point.threshold
        assert (labels[hits] == 0).mean() <= point.target + 1e-9


def test_fit_never_cuts_between_pairs_of_one_score() -> None:
    # 60 right pairs at 0.99, then 60 at one score, 0.9, the right half listed first: a cut inside the tied
    # block would claim 90 right of 100 (10%), but a 0.9 threshold serves all 120 (25% wrong). A 20% target
    # is met only above the tie; at 25% the whole block joins.
    labels = np.concatenate([np.ones(90, dtype=int), np.zeros(30, dtype=int)])
    probabilities = np.concatenate([np.full(60, 0.99), np.full(60, 0.9)])
    calibration = fit_calibration(
        np.full(120, 0.9), probabilities, np.zeros(120, dtype=bool), labels,
        low_cosine=0.5, guards=(), verifier_sha256="x", fitted_on={}, targets=(0.2, 0.25),
    )  # fmt: skip
    strict, loose = calibration.points
    assert (strict.hits, strict.false_hit_rate) == (60, 0.0)
    assert calibration.combine(0.9, 0.9) < strict.threshold
    assert (loose.hits, loose.false_hit_rate) == (120, 0.25)
    for point in calibration.points:
        served = np.array([calibration.combine(0.9, p) >= point.threshold for p in probabilities])
        assert served.sum() == point.hits and (labels[served] == 0).mean() == point.false_hit_rate


def test_fit_stays_finite_on_an_overconfident_verifier() -> None:
    # Probabilities pinned near 0 and 1, with 10% of labels flipped: a plain Newton step diverged here.
    generator = np.random.default_rng(3)
    labels = generator.integers(0, 2, 3000)
    noisy = np.where(generator.random(len(labels)) < 0.1, 1 - labels, labels)
    probabilities = np.where(noisy == 1, 0.9999, 0.0001) + generator.normal(0, 1e-5, len(labels))
    similarities = generator.uniform(0.5, 1.0, len(labels))
    calibration = fit_calibration(
        similarities, np.clip(probabilities, 0, 1), np.zeros(len(labels), dtype=bool), labels,
        low_cosine=0.5, guards=(), verifier_sha256="x", fitted_on={}, targets=(0.1, 0.2),
    )  # fmt: skip
    assert all(abs(weight) < 100 for weight in calibration.combiner), calibration.combiner
    assert 0.0 < calibration.combine(0.9, 0.9999) < 1.0


def test_no_threshold_below_the_smallest_fitted_target() -> None:
    calibration = make_calibration()
    smallest = calibration.points[0].target
    assert calibration.threshold_for(smallest / 2) == float("inf")
    assert calibration.threshold_for(smallest) == calibration.points[0].threshold


def test_near_duplicates_count_as_hits_at_every_fitted_target() -> None:
    # 40 near-duplicates (all right, though the verifier scores them low) and 200 verified pairs, all wrong:
    # the near-duplicates alone meet a 1% target, so it is fitted, with the threshold above every score.
    generator = np.random.default_rng(5)
    labels = np.concatenate([np.ones(40, dtype=int), np.zeros(200, dtype=int)])
    near = np.arange(len(labels)) < 40
    probabilities = np.concatenate([np.full(40, 0.01), generator.uniform(0.2, 0.99, 200)])
    calibration = fit_calibration(
        np.full(len(labels), 0.9), probabilities, np.zeros(len(labels), dtype=bool), labels,
        near_duplicates=near, low_cosine=0.5, guards=(), verifier_sha256="x", fitted_on={}, targets=(0.01,),
    )  # fmt: skip
    (point,) = calibration.points
    assert point.hits == 40 and point.false_hit_rate == 0.0
    assert point.threshold == 1.0


def test_of_a_lookups_candidates_only_the_best_scored_competes() -> None:
    # 60 lookups of 3 candidates: the right one scores 0.9, a wrong one 0.95 (served instead), one 0.1.
    # As pairs, 60 of 120 hits above 0.5 are right; as lookups, every lookup serves a wrong answer, so no
    # target can be met from the lookups alone, and adding 200 right lone pairs scored 0.99 sets the
    # threshold above the wrong candidates' 0.95.
    lookups = np.repeat(np.arange(60), 3)
    labels = np.tile([1, 0, 0], 60)
    probabilities = np.tile([0.9, 0.95, 0.1], 60) + np.random.default_rng(2).uniform(-0.01, 0.01, 180)
    lone = 200
    calibration = fit_calibration(
        np.full(180 + lone, 0.9),
        np.concatenate([probabilities, np.full(lone, 0.99) + np.random.default_rng(3).uniform(-0.001, 0.001, lone)]),
        np.zeros(180 + lone, dtype=bool),
        np.concatenate([labels, np.ones(lone, dtype=int)]),
        low_cosine=0.5, guards=(), verifier_sha256="x", fitted_on={}, targets=(0.01, 0.2),
        lookups=np.concatenate([lookups, np.full(lone, -1)]),
    )  # fmt: skip
    first, second = calibration.points
    # As lone pairs the right candidates (0.9) would be hits at 20%: 60 wrong of 320. As lookups they never
    # compete (each lookup serves its 0.95 wrong candidate), so at most 50 wrong lookups join the 200.
    assert second.hits <= lone + 50 and second.recall == round(lone / (lone + 60), 5)
    # The 200 right pairs, and at most 2 wrong lookups (2 of 202 is within 1%).
    assert lone <= first.hits <= lone + 2 and first.false_hit_rate <= 0.01
    assert calibration.combine(0.9, 0.94) < first.threshold <= calibration.combine(0.9, 0.99)
    assert first.recall == round(lone / (lone + 60), 5)  # each lookup with a right candidate counts once


def test_a_combiner_chosen_for_the_target_serves_more_right_hits_there() -> None:
    # The cosine separates the bulk (so a logistic fit leans on it), but only the verifier is sure of the
    # 600 pairs it scores highest: at a 1% target the verifier alone serves them all.
    generator = np.random.default_rng(11)
    labels = generator.integers(0, 2, 4000)
    similarities = np.clip(0.75 + 0.05 * (labels * 2 - 1) + generator.normal(0, 0.1, len(labels)), 0.5, 1.0)
    logits = generator.normal(0, 1.5, len(labels)) + (labels * 2 - 1) * 0.3
    sure = np.flatnonzero(labels == 1)[:600]
    logits[sure] = 6.0 + generator.uniform(0, 1, len(sure))
    probabilities = 1 / (1 + np.exp(-logits))
    options = dict(low_cosine=0.5, guards=(), verifier_sha256="x", fitted_on={}, targets=(0.01,))
    vetoed = np.zeros(len(labels), dtype=bool)
    plain = fit_calibration(similarities, probabilities, vetoed, labels, **options)
    chosen = fit_calibration(similarities, probabilities, vetoed, labels, combiner_target=0.01, **options)
    assert chosen.points[0].false_hit_rate <= 0.01
    assert chosen.points[0].recall > plain.points[0].recall + 0.05, (plain.points, chosen.points)
    assert chosen.combiner != plain.combiner


def combined_calibration(logit_range: tuple[float, float]) -> Calibration:
    """A fitted-looking combiner (cosine weighs most) whose logits were seen within `logit_range`."""
    points = (CalibrationPoint(0.02, 0.9, 0.02, 0.3, 100),)
    return Calibration(
        0.5, (), points, verifier_sha256="0" * 64, combiner=(6.8, 0.25, -5.5), logit_range=logit_range
    )


def test_the_combiner_reads_logits_within_the_range_it_was_fitted_on() -> None:
    calibration = combined_calibration((-7.0, 7.0))
    sure = 1 / (1 + np.exp(-12.0))  # logit 12, beyond the fitted range
    assert calibration.combine(0.9, sure) == pytest.approx(calibration.combine(0.9, 1 / (1 + np.exp(-7.0))))
    assert calibration.best_combined(0.9) == pytest.approx(calibration.combine(0.9, sure))
    assert calibration.combine(0.9, 0.5) < calibration.best_combined(0.9)


def test_a_cosine_too_low_for_any_verifier_answer_is_a_miss_without_the_verifier() -> None:
    calibration = combined_calibration((-7.0, 7.0))
    # Hit needs 6.8 c + 0.25 * 7 - 5.5 >= logit(0.9) = 2.197 at best: c >= 0.8716.
    rule = CalibratedRule(ScriptedVerifier({"stored": 0.9999}), calibration)
    low = rule.quick_verdict("a new question", "stored", similarity=0.86)
    assert low is not None and not low.hit
    assert low.reason == "cosine too low for the verifier to reach the threshold"
    assert rule.verifier.asked == 0  # type: ignore[attr-defined]
    # The same decision as scoring the pair: the gate only skips work.
    assert not rule.judge("a new question", "stored", similarity=0.86).hit
    assert rule.quick_verdict("a new question", "stored", similarity=0.88) is None
    assert rule.judge("a new question", "stored", similarity=0.88).hit


def test_the_gate_follows_the_target_and_strictness() -> None:
    points = (CalibrationPoint(0.02, 0.9, 0.02, 0.3, 100), CalibrationPoint(0.2, 0.5, 0.2, 0.6, 300))
    calibration = Calibration(
        0.5, (), points, verifier_sha256="0" * 64, combiner=(6.8, 0.25, -5.5), logit_range=(-7.0, 7.0)
    )
    loose = CalibratedRule(ScriptedVerifier({}), calibration, target_false_hit_rate=0.2)
    assert loose.quick_verdict("a new question", "stored", similarity=0.6) is None  # 0.5 is reachable
    assert loose.quick_verdict("a new question", "stored", similarity=0.6, strictness=0.9) is not None


def test_fitting_records_the_logit_range_and_old_files_read_the_widest(tmp_path: Path) -> None:
    generator = np.random.default_rng(11)
    labels = generator.integers(0, 2, 400)
    logits = np.where(labels == 1, 2.0, -2.0) + generator.normal(0, 1.5, len(labels))
    calibration = fit_calibration(
        generator.uniform(0.6, 1.0, len(labels)), 1 / (1 + np.exp(-logits)), np.zeros(len(labels), dtype=bool),
        labels, low_cosine=0.5, guards=(), verifier_sha256="x", fitted_on={}, targets=(0.2,),
    )  # fmt: skip
    low, high = calibration.logit_range
    assert low <= logits.min() + 1e-4 and high >= logits.max() - 1e-4 and high - low < 20
    path = calibration.save(tmp_path / "calibration.json")
    assert Calibration.load(path).logit_range == calibration.logit_range
    payload = path.read_text().replace('"logit_range"', '"unused"')
    path.write_text(payload)
    widest = Calibration.load(path).logit_range
    assert widest[0] < -13 and widest[1] > 13


def test_fit_holds_each_sets_bound_separately() -> None:
    # Two sets ranked together. "strict" (bound 0.5 x target) has 3 wrong of 100 at 0.95; "loose" (2.5 x)
    # 5 of 100 at 0.7. Pooled, 8 wrong of 200 meets a 4% target with every pair served; per set, the strict
    # set's 2% keeps the threshold above 0.95.
    strict_labels = np.concatenate([np.ones(50, dtype=int), np.zeros(3, dtype=int), np.ones(47, dtype=int)])
    strict_scores = np.concatenate([np.full(50, 0.99), np.full(3, 0.95), np.full(47, 0.9)])
    loose_labels = np.concatenate([np.ones(95, dtype=int), np.zeros(5, dtype=int)])
    loose_scores = np.concatenate([np.full(95, 0.98), np.full(5, 0.7)])
    labels = np.concatenate([strict_labels, loose_labels])
    probabilities = np.concatenate([strict_scores, loose_scores])
    sets = np.array(["strict"] * 100 + ["loose"] * 100)
    options = dict(
        low_cosine=0.5, guards=(), verifier_sha256="x", fitted_on={}, targets=(0.04,),
    )  # fmt: skip
    similarities, vetoed = np.full(200, 0.9), np.zeros(200, dtype=bool)
    pooled = fit_calibration(similarities, probabilities, vetoed, labels, **options)  # type: ignore[arg-type]
    per_set = fit_calibration(
        similarities, probabilities, vetoed, labels, sets=sets,
        set_bounds={"strict": 0.5, "loose": 2.5}, **options,  # type: ignore[arg-type]
    )  # fmt: skip
    assert pooled.points[0].hits > per_set.points[0].hits
    threshold = per_set.points[0].threshold
    for name, multiple in (("strict", 0.5), ("loose", 2.5)):
        member = sets == name
        served = np.array([per_set.combine(0.9, p) >= threshold for p in probabilities]) & member
        assert (labels[served] == 0).sum() <= 0.04 * multiple * served.sum()
    assert per_set.combine(0.9, 0.95) < threshold
