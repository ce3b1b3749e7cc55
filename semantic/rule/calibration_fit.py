"""Fitting the English profile's calibration on labelled pairs: the combiner, then a threshold per target.

`fit_calibration` is what `kvgate calibrate` (`evaluation/calibrate.py`), the shipped calibration
(`bench/semantic/bench_rule.py --write-calibration`) and the device trainer's checkpoint choice (`training/`)
run: pairs scored by the embedder and the verifier, the guards' vetoes and the near-duplicates marked, a
`Calibration` out. Knows numbers only: the models ran before.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from semantic.guards.language import NO_LANGUAGE, language_of
from semantic.rule.calibration import (
    LANGUAGES_BEFORE_RECORDED,
    WIDEST_LOGIT_RANGE,
    Calibration,
    CalibrationPoint,
    logit_array,
)

# Measured in bench/semantic/bench_rule.py and bench/semantic/bench_guards.py: the entity guard vetoes most MRPC paraphrases and
# the question-word guard a sixth of Quora's; numbers and negation cost little recall and stop the classic
# wrong hits; direction, opposite, units, languages and task slots veto at most 0.2% of the reviewed Quora
# paraphrases and catch most minimal edits of their kind (docs/benchmarks.md, "guards").
DEFAULT_GUARDS: tuple[str, ...] = (
    "numbers",
    "negation",
    "direction",
    "opposite",
    "units",
    "languages",
    "task",
    "case",
    "aspect",
)
# The default promise, per kind of traffic (`fit_calibration`'s `set_bounds`): wrong hits among hits at most
# the target times this, in each calibration set separately. At the default 2%: rewordings against related
# questions (chatbot) 1%, minimal edits (adversarial pairs, task requests) 2%, Quora-style open questions 5%.
DEFAULT_SET_BOUNDS: dict[str, float] = {"chatbot": 0.5, "adversarial": 1.0, "reviewed": 2.5}
CALIBRATION_TARGETS = (0.005, 0.01, 0.015, 0.02, 0.03, 0.04, 0.05, 0.075, 0.10, 0.15, 0.20)
# A target is only fitted where at least this many calibration pairs are hits: fewer makes the measured
# false-hit rate too noisy to bound anything.
MIN_CALIBRATION_HITS = 30
# A language is measured by a calibration when its pairs (both texts in that language) hold at least this
# many positives and as many negatives: the bar a target's hits must clear (fewer cannot show what a
# threshold does in that language).
MIN_LANGUAGE_PAIRS = 30
# Near-duplicates rank above every verified pair when the calibration orders pairs by score.
DECIDED_SCORE = 2.0


def fit_calibration(
    similarities: npt.NDArray[np.float32],
    probabilities: npt.NDArray[np.float32],
    vetoed: npt.NDArray[np.bool_],
    labels: npt.NDArray[np.int_],
    *,
    near_duplicates: npt.NDArray[np.bool_] | None = None,
    low_cosine: float,
    guards: tuple[str, ...],
    verifier_sha256: str,
    fitted_on: dict[str, object],
    targets: Sequence[float] = CALIBRATION_TARGETS,
    languages: tuple[str, ...] = LANGUAGES_BEFORE_RECORDED,
    lookups: npt.NDArray[np.int_] | None = None,
    combiner_target: float | None = None,
    sets: npt.NDArray[np.str_] | None = None,
    set_bounds: Mapping[str, float] | None = None,
    second_opinion: dict[str, object] | None = None,
) -> Calibration:
    """Fit the cosine/verifier combiner, then for each target the lowest threshold on the combined score
    whose hits on these pairs stay within the target.

    Only pairs that pass the cosine gate and the guards compete; recall counts against all positives.
    `near_duplicates` marks the pairs the rule serves without the verifier (`near_duplicate_reason`): they
    count as hits at every threshold, and the combiner is fitted on the others. A target whose best set of
    hits is smaller than MIN_CALIBRATION_HITS is left out. `languages` are those the pairs measured
    (`measured_languages`); pairs in any other come `vetoed`, as serving refuses them.

    `lookups` (one id per row, -1 for a lone pair) marks rows that are the candidates of one lookup in a
    populated scope (`evaluation/scope_lookups.py`): the cache serves the candidate the rule scores highest,
    so of each lookup only that row competes for a threshold (a lookup is one hit or none, right or wrong
    by what it serves); every row teaches the combiner.

    The combiner is a logistic regression of the label on (cosine, verifier logit): it fits the whole range
    of scores, not the few highest where a strict target's threshold falls. With `combiner_target`, a few
    fixed weightings (`_COMBINER_GRID`) compete with it, and the one whose fitted point for that target
    serves the most right hits on these pairs is kept (one ratio chosen on thousands of pairs).

    `sets` (one name per row) and `set_bounds` (a name -> a multiple of the target) make each target a bound
    per kind of traffic: a threshold is fitted for target t only where, in every named set separately, at
    most t times its multiple of that set's hits are wrong (`DEFAULT_SET_BOUNDS`: rewordings against related
    questions at half the target, minimal edits at the target, Quora-style open questions at 2.5 times it).
    Without them one bound holds over all the rows together.

    `second_opinion` (`SecondOpinionSettings.to_json()`) is recorded when `probabilities` are a
    `SecondOpinion`'s blend, so that serving builds the same scorer (`semantic/rule/loading.py`).
    """
    decided = near_duplicates if near_duplicates is not None else np.zeros(len(labels), dtype=bool)
    groups = lookups if lookups is not None else np.full(len(labels), -1)
    eligible = (similarities >= low_cosine) & ~vetoed
    verified = eligible & ~decided
    logits = logit_array(probabilities[verified])
    logit_range = (
        (math.floor(float(logits.min()) * 1e5) / 1e5, math.ceil(float(logits.max()) * 1e5) / 1e5)
        if len(logits)
        else WIDEST_LOGIT_RANGE
    )
    lone = groups < 0
    positives = max(int(labels[lone].sum()) + len(np.unique(groups[~lone & (labels == 1)])), 1)

    def points_for(combiner: tuple[float, float, float]) -> list[CalibrationPoint]:
        probe = Calibration(low_cosine, guards, (), verifier_sha256, fitted_on, combiner, logit_range)
        scores = combined_scores(probe, similarities, probabilities, eligible, decided)
        competing = eligible & _best_of_each_lookup(scores, groups)
        combined = scores[competing]
        order = np.argsort(-combined, kind="stable")
        ranked_scores = combined[order]
        ranked_labels = labels[competing][order]
        hits = np.arange(1, len(ranked_labels) + 1)
        false_hit_rates = np.cumsum(ranked_labels == 0) / hits
        # The rule serves every pair at or above the threshold (near-duplicates at any): a cut may only fall
        # where the next pair scores strictly below it, else the tied pairs past the cut would be served too
        # and the hits and wrong hits counted here would not be what the threshold gives. Combined scores
        # saturate at 1.0 for a confident verifier, so ties are common at the top.
        served_at = np.where(ranked_scores >= DECIDED_SCORE, np.inf, np.minimum(ranked_scores, 1.0))
        cut = np.append(np.minimum(served_at[:-1], 1.0) > served_at[1:], True)
        ranked_sets = None if sets is None else np.asarray(sets)[competing][order]
        points = []
        for target in sorted(targets):
            holds = false_hit_rates <= target
            if ranked_sets is not None and set_bounds is not None:
                holds = _each_set_within(ranked_sets, ranked_labels, set_bounds, target)
            within = np.flatnonzero(cut & holds & (hits >= MIN_CALIBRATION_HITS))
            if len(within) == 0:
                continue
            count = int(within[-1]) + 1
            points.append(
                CalibrationPoint(
                    target=float(target),
                    threshold=min(float(ranked_scores[count - 1]), 1.0),
                    false_hit_rate=round(float(false_hit_rates[count - 1]), 5),
                    recall=round(float(ranked_labels[:count].sum()) / positives, 5),
                    hits=count,
                )
            )
        return points

    fitted = _fit_logistic(similarities[verified], probabilities[verified], labels[verified])
    candidates = [fitted] if combiner_target is None else [fitted, *_COMBINER_GRID]
    best = max(
        ((combiner, points_for(combiner)) for combiner in candidates),
        key=lambda found: _recall_at(found[1], combiner_target),
    )
    combiner, points = best
    if not points:
        raise ValueError("no target could be met on these pairs: too few, or too few positives")
    return Calibration(
        low_cosine,
        guards,
        tuple(points),
        verifier_sha256,
        fitted_on,
        combiner,
        logit_range,
        languages,
        second_opinion,
    )


# Combiners tried beside the logistic fit when one is chosen for a target (`fit_calibration`): the verifier
# logit's weight 1 and the cosine's from 0 (the verifier alone) to 32 (the cosine decides). Only the ratio
# orders pairs; the bias keeps the combined score of a typical pair near the middle of (0, 1).
_COMBINER_GRID = tuple((weight, 1.0, -0.75 * weight) for weight in (0.0, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0))


def _each_set_within(
    ranked_sets: npt.NDArray[np.str_],
    ranked_labels: npt.NDArray[np.int_],
    set_bounds: Mapping[str, float],
    target: float,
) -> npt.NDArray[np.bool_]:
    """Per cut (the first k ranked rows served): whether every bounded set's wrong hits stay within its bound
    (`target` times its multiple) of that set's hits. A set with no hit yet holds; unnamed sets are free."""
    holds = np.ones(len(ranked_labels), dtype=bool)
    for name, multiple in set_bounds.items():
        member = ranked_sets == name
        hits = np.cumsum(member)
        wrong = np.cumsum(member & (ranked_labels == 0))
        holds &= wrong <= target * multiple * hits + 1e-9
    return holds


def combined_scores(
    calibration: Calibration,
    similarities: npt.NDArray[np.floating[Any]],
    probabilities: npt.NDArray[np.floating[Any]],
    eligible: npt.NDArray[np.bool_],
    near_duplicates: npt.NDArray[np.bool_],
) -> npt.NDArray[np.float64]:
    """Per row, the score the rule serves on: combined for a verified pair, above every threshold for a
    near-duplicate (served at any), -inf for a row never judged (below the gate, vetoed)."""
    scores = np.full(len(similarities), -np.inf)
    scores[eligible] = [
        DECIDED_SCORE if near else calibration.combine(float(cosine), float(probability))
        for cosine, probability, near in zip(
            similarities[eligible], probabilities[eligible], near_duplicates[eligible], strict=True
        )
    ]
    return scores


def set_false_hit_rates(
    calibration: Calibration,
    similarities: npt.NDArray[np.float64],
    probabilities: npt.NDArray[np.float64],
    eligible: npt.NDArray[np.bool_],
    near_duplicates: npt.NDArray[np.bool_],
    labels: npt.NDArray[np.int_],
    sets: npt.NDArray[np.str_],
    lookups: npt.NDArray[np.int_],
    target: float,
) -> dict[str, tuple[int, int]]:
    """Per set at `target`: (hits, wrong hits) the fitted threshold gives on these rows (a lookup's best
    candidate only), to record what each bound measured."""
    threshold = calibration.threshold_for(target)
    scores = combined_scores(calibration, similarities, probabilities, eligible, near_duplicates)
    served = eligible & _best_of_each_lookup(scores, lookups) & (scores >= threshold)
    return {
        str(name): (
            int((served & (sets == name)).sum()),
            int((served & (sets == name) & (labels == 0)).sum()),
        )
        for name in sorted(set(sets.tolist()))
    }


def _recall_at(points: Sequence[CalibrationPoint], target: float | None) -> float:
    """The recall of the point fitted for `target` (0 when that target could not be met)."""
    return next((point.recall for point in points if point.target == target), 0.0)


def _best_of_each_lookup(
    scores: npt.NDArray[np.float64], groups: npt.NDArray[np.int_]
) -> npt.NDArray[np.bool_]:
    """True for lone rows (group -1) and, per lookup, for its highest-scoring row (the nearest on a tie)."""
    keep = groups < 0
    best: dict[int, int] = {}
    for row in (int(index) for index in np.flatnonzero(~keep)):
        group = int(groups[row])
        if group not in best or scores[row] > scores[best[group]]:
            best[group] = row
    keep[list(best.values())] = True
    return keep


def measured_languages(pairs: Sequence[tuple[str, str, int]]) -> tuple[str, ...]:
    """The languages whose (a, b, label) pairs, both texts in that language, are enough to calibrate for."""
    counts: dict[str, list[int]] = {}
    for first, second, label in pairs:
        code = language_of(first)
        if code == language_of(second) and code != NO_LANGUAGE:
            counts.setdefault(code, []).append(label)
    return tuple(
        sorted(
            code
            for code, labels in counts.items()
            if sum(labels) >= MIN_LANGUAGE_PAIRS and len(labels) - sum(labels) >= MIN_LANGUAGE_PAIRS
        )
    )


def _fit_logistic(
    similarities: npt.NDArray[np.float32],
    probabilities: npt.NDArray[np.float32],
    labels: npt.NDArray[np.int_],
) -> tuple[float, float, float]:
    """Logistic regression of the label on (cosine, verifier logit), L2-regularised (scikit-learn).

    A hand-written Newton iteration used here before diverged on an overconfident verifier (a logit
    weight of 2,679): lbfgs with a penalty converges whatever the scale of the inputs.
    """
    from sklearn.linear_model import LogisticRegression

    if len(labels) < 10 or labels.min() == labels.max():
        return (0.0, 1.0, 0.0)
    features = np.column_stack([similarities, logit_array(probabilities)])  # (N, 2)
    model = LogisticRegression(C=10.0, max_iter=1000).fit(features, labels)
    cosine_weight, logit_weight = (float(value) for value in model.coef_[0])
    return (round(cosine_weight, 5), round(logit_weight, 5), round(float(model.intercept_[0]), 5))
