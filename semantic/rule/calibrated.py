"""The decision rule: may the stored answer of `candidate` be served for `query`?

A cosine threshold alone is either unsafe or useless on hard negatives, so the rule layers three signals:

0. only text in a language the calibration was measured on is judged (`semantic/rule/language.py`); a prompt in
   another language, or two prompts in different languages, get exact hits only;
1. the embedder cosine gates: below `low_cosine` it is a miss and nothing else runs (most lookups);
2. guards (`semantic/rule/guards.py`) veto pairs whose numbers, negation or names differ;
3. the verifier (`semantic/rule/verifier.py`, a cross-encoder) scores the rest; its logit and the cosine are
   combined by a logistic regression fitted at calibration, and a pair is a hit when that combined
   probability reaches the threshold fitted for the target false-hit rate.

The combiner reads the verifier's logit within the range it was fitted on (`logit_range`), so at a given
target a pair whose cosine is too low for even the highest logit to reach the threshold is a miss without
running the verifier (`quick_verdict`): the same decision, without the cross-encoder's pass.

Calibration maps a target false-hit rate (wrong hits / hits) to that threshold. It is fitted on labelled
pairs held out from the verifier's training (`kvgate calibrate`) and stored as a small JSON file tied to
the verifier weights it was fitted with. This module knows thresholds and policy, not Redis or FAISS.
"""

from __future__ import annotations

import functools
import hashlib
import itertools
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

from semantic.rule import language, near_duplicate
from semantic.rule.guards import GUARDS_BY_NAME, Guard, first_veto
from semantic.rule.language import NO_LANGUAGE, language_of
from semantic.rule.near_duplicate import near_duplicate_reason
from semantic.rule.verdict import Verdict

DEFAULT_TARGET_FALSE_HIT_RATE = 0.02
SHIPPED_CALIBRATION = Path(__file__).parent / "calibration.json"
USER_CALIBRATION_NAME = "calibration.json"
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
DEFAULT_SET_BOUNDS: dict[str, float] = {"chatbot": 0.5, "adversarial": 1.0, "reviewed": 1.0}
CALIBRATION_TARGETS = (0.005, 0.01, 0.015, 0.02, 0.03, 0.04, 0.05, 0.075, 0.10, 0.15, 0.20)
# A target is only fitted where at least this many calibration pairs are hits: fewer makes the measured
# false-hit rate too noisy to bound anything.
MIN_CALIBRATION_HITS = 30
# Calibrations written before `languages` was recorded were fitted on English pairs only.
_LANGUAGES_BEFORE_RECORDED = ("en",)
# A language is measured by a calibration when its pairs (both texts in that language) hold at least this
# many positives and as many negatives: the bar a target's hits must clear (fewer cannot show what a
# threshold does in that language).
MIN_LANGUAGE_PAIRS = 30
# Scores of pairs the verifier never saw stay below this, so they rank under almost every verified pair.
_UNVERIFIED_SCORE_CEILING = 0.01
# Near-duplicates rank above every verified pair when the calibration orders pairs by score.
_DECIDED_SCORE = 2.0
# `_logit` clips probabilities to [1e-6, 1 - 1e-6]: the widest logit range a combiner can read (and the one
# read from calibration files written before `logit_range` was fitted).
_CLIPPED_LOGIT = math.log((1 - 1e-6) / 1e-6)
_WIDEST_LOGIT_RANGE = (-_CLIPPED_LOGIT, _CLIPPED_LOGIT)


class PairScorer(Protocol):
    """What the rule needs of a verifier: P(same meaning) per pair, batched."""

    name: str

    def probabilities(
        self, pairs: Sequence[tuple[str, str]], batch_size: int = 64
    ) -> npt.NDArray[np.float32]: ...


@dataclass(frozen=True, slots=True)
class CalibrationPoint:
    """At `target`, hit when the verifier says >= `threshold`; what that gave on the calibration pairs."""

    target: float
    threshold: float
    false_hit_rate: float
    recall: float
    hits: int


@dataclass(frozen=True, slots=True)
class Calibration:
    """The fitted rule: gates, guards and target -> verifier threshold, plus what it was fitted on."""

    low_cosine: float
    guards: tuple[str, ...]
    points: tuple[CalibrationPoint, ...]
    verifier_sha256: str
    fitted_on: dict[str, object] = field(default_factory=dict)
    combiner: tuple[float, float, float] = (0.0, 1.0, 0.0)  # cosine weight, verifier-logit weight, bias
    # The verifier logits the combiner was fitted on span this range; it reads any logit clamped into it
    # (beyond it the fitted line is an extrapolation nothing measured).
    logit_range: tuple[float, float] = _WIDEST_LOGIT_RANGE
    # The languages (ISO 639-1) of the pairs it was fitted on: the only ones it judges (`semantic/rule/language.py`).
    languages: tuple[str, ...] = _LANGUAGES_BEFORE_RECORDED

    def combine(self, similarity: float, probability: float) -> float:
        """P(same meaning) from the cosine and the verifier's probability (identity by default)."""
        return self._combine_logit(similarity, _logit(probability))

    def best_combined(self, similarity: float) -> float:
        """The highest combined score any verifier answer can give a pair at this cosine."""
        low, high = self.logit_range
        return self._combine_logit(similarity, high if self.combiner[1] >= 0 else low)

    def _combine_logit(self, similarity: float, logit: float) -> float:
        cosine_weight, logit_weight, bias = self.combiner
        low, high = self.logit_range
        clamped = min(max(logit, low), high)
        return _sigmoid(cosine_weight * similarity + logit_weight * clamped + bias)

    def threshold_for(self, target: float) -> float:
        """The verifier threshold for a target false-hit rate.

        Between fitted targets the threshold is interpolated; above the largest it stays at the largest's.
        Below the smallest there is none: the calibration pairs could not show that any threshold keeps
        wrong hits that rare, so only identical texts hit (the rule never promises what it did not measure).
        """
        targets = [point.target for point in self.points]
        thresholds = [point.threshold for point in self.points]
        if target < targets[0]:
            return math.inf
        return float(np.interp(target, targets, thresholds))

    def save(self, path: Path) -> Path:
        path.parent.mkdir(parents=True, exist_ok=True)
        payload = asdict(self)
        path.write_text(json.dumps(payload, indent=1) + "\n", encoding="utf-8")
        return path

    @classmethod
    def load(cls, path: Path) -> Calibration:
        payload = json.loads(path.read_text(encoding="utf-8"))
        points = tuple(CalibrationPoint(**point) for point in payload["points"])
        if not points or any(b.target <= a.target for a, b in itertools.pairwise(points)):
            raise ValueError(f"{path}: calibration points must be non-empty and in increasing target order")
        unknown = set(payload["guards"]) - GUARDS_BY_NAME.keys()
        if unknown:
            raise ValueError(f"{path}: unknown guards {sorted(unknown)}")
        return cls(
            float(payload["low_cosine"]),
            tuple(payload["guards"]),
            points,
            str(payload["verifier_sha256"]),
            dict(payload.get("fitted_on", {})),
            _combiner(payload.get("combiner", (0.0, 1.0, 0.0))),
            _logit_range(payload.get("logit_range", _WIDEST_LOGIT_RANGE)),
            _languages(payload.get("languages", _LANGUAGES_BEFORE_RECORDED)),
        )


class CalibratedRule:
    """The `HitRule` kvgate serves with: cosine gate, guards, then the verifier against a calibrated threshold."""

    name = "calibrated-verifier"

    def __init__(
        self,
        verifier: PairScorer,
        calibration: Calibration,
        target_false_hit_rate: float = DEFAULT_TARGET_FALSE_HIT_RATE,
    ) -> None:
        if not 0.0 < target_false_hit_rate < 1.0:
            raise ValueError(f"target false-hit rate must be in (0, 1), got {target_false_hit_rate}")
        self.verifier = verifier
        self.calibration = calibration
        self.target_false_hit_rate = target_false_hit_rate
        self._guards: tuple[Guard, ...] = tuple(GUARDS_BY_NAME[name] for name in calibration.guards)
        self._languages = frozenset(calibration.languages)

    @property
    def languages(self) -> tuple[str, ...]:
        """The languages this rule judges (its calibration's); every other prompt gets exact hits only."""
        return self.calibration.languages

    def language_refusal(self, text: str) -> str | None:
        """Why `text` may get exact hits only (its language was not measured), or None when it is judged."""
        return language.refusal(text, self._languages)

    def judge(self, query: str, candidate: str, similarity: float, strictness: float = 0.0) -> Verdict:
        """Decide one pair; `strictness` in [0, 1] scales the allowed false-hit rate down to zero."""
        return self.judge_many([(query, candidate)], [similarity], strictness)[0]

    def judge_many(
        self, pairs: Sequence[tuple[str, str]], similarities: Sequence[float], strictness: float = 0.0
    ) -> list[Verdict]:
        """Decide many (query, candidate) pairs at once: the verifier runs once over those that reach it.

        Unlike `quick_verdict`, pairs past the guards are scored even where no threshold can be met, so that
        evaluation ranks them (ROC-AUC); the decisions are the same.
        """
        if len(pairs) != len(similarities):
            raise ValueError("one similarity per pair")
        threshold = self._threshold(strictness)
        verdicts: list[Verdict | None] = [
            self._unverified(query, candidate, similarity)
            for (query, candidate), similarity in zip(pairs, similarities, strict=True)
        ]
        to_verify = [index for index, verdict in enumerate(verdicts) if verdict is None]
        probabilities = self.verifier.probabilities([pairs[index] for index in to_verify])
        for index, probability in zip(to_verify, probabilities.tolist(), strict=True):
            score = self.calibration.combine(similarities[index], probability)
            hit = score >= threshold
            verdicts[index] = Verdict(hit, score, "verified" if hit else "verifier refused")
        return [verdict for verdict in verdicts if verdict is not None]

    def quick_verdict(
        self, query: str, candidate: str, similarity: float, strictness: float = 0.0
    ) -> Verdict | None:
        """The verdict when the verifier is not needed, else None: below the gate, a guard's veto, a
        near-duplicate, a target below every calibrated one (where only the same text may hit), or a cosine
        at which no verifier answer reaches the target's threshold."""
        verdict = self._unverified(query, candidate, similarity)
        if verdict is not None:
            return verdict
        threshold = self._threshold(strictness)
        if math.isinf(threshold):
            return Verdict(
                False, _unverified_score(similarity, 1.0), "no calibrated threshold at this target"
            )
        if self.calibration.best_combined(similarity) < threshold:
            return Verdict(
                False,
                _unverified_score(similarity, 1.0),
                "cosine too low for the verifier to reach the threshold",
            )
        return None

    def _unverified(self, query: str, candidate: str, similarity: float) -> Verdict | None:
        if (reason := language.pair_refusal(query, candidate, self._languages)) is not None:
            return Verdict(False, _unverified_score(similarity, 1.0), reason)
        if similarity < self.calibration.low_cosine:
            return Verdict(False, _unverified_score(similarity, 0.5), "below cosine gate")
        if (reason := first_veto(query, candidate, self._guards)) is not None:
            return Verdict(False, _unverified_score(similarity, 1.0), reason)
        if (reason := near_duplicate_reason(query, candidate)) is not None:
            return Verdict(True, 1.0, reason)
        return None

    def _threshold(self, strictness: float) -> float:
        return self.calibration.threshold_for(self.target_false_hit_rate * (1.0 - _clamp(strictness)))


def load_rule(
    data_dir: Path | None = None,
    target_false_hit_rate: float = DEFAULT_TARGET_FALSE_HIT_RATE,
    verifier: PairScorer | None = None,
    *,
    runtime: str = "auto",
    export_dir: Path | None = None,
    threads: int = 1,
) -> CalibratedRule:
    """The served rule: the user's calibration in `data_dir` if there is one, else the shipped one.

    A calibration fitted with other verifier weights is refused: its thresholds would mean nothing.
    `runtime`, `export_dir` and `threads` say how the shipped verifier runs (`PairVerifier`).
    """
    from semantic.rule.verifier import WEIGHTS_FILE

    path = calibration_path(data_dir)
    calibration = Calibration.load(path)
    if verifier is None:
        if calibration.verifier_sha256 != file_sha256(WEIGHTS_FILE):
            raise ValueError(f"{path} was fitted for other verifier weights; run `kvgate calibrate` again")
        verifier = _shipped_verifier(runtime, export_dir, threads)
    near_duplicate.warm()
    language.warm()
    return CalibratedRule(verifier, calibration, target_false_hit_rate)


def calibration_path(data_dir: Path | None) -> Path:
    """Where the rule's calibration is read from: the user's (`kvgate calibrate`) first, else the shipped one."""
    if data_dir is not None and (data_dir / USER_CALIBRATION_NAME).is_file():
        return data_dir / USER_CALIBRATION_NAME
    return SHIPPED_CALIBRATION


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
    languages: tuple[str, ...] = _LANGUAGES_BEFORE_RECORDED,
    lookups: npt.NDArray[np.int_] | None = None,
    combiner_target: float | None = None,
    sets: npt.NDArray[np.str_] | None = None,
    set_bounds: Mapping[str, float] | None = None,
) -> Calibration:
    """Fit the cosine/verifier combiner, then for each target the lowest threshold on the combined score
    whose hits on these pairs stay within the target.

    Only pairs that pass the cosine gate and the guards compete; recall counts against all positives.
    `near_duplicates` marks the pairs the rule serves without the verifier (`near_duplicate_reason`): they
    count as hits at every threshold, and the combiner is fitted on the others. A target whose best set of
    hits is smaller than MIN_CALIBRATION_HITS is left out. `languages` are those the pairs measured
    (`measured_languages`); pairs in any other come `vetoed`, as serving refuses them.

    `lookups` (one id per row, -1 for a lone pair) marks rows that are the candidates of one lookup in a
    populated scope (`semantic/scope_lookups.py`): the cache serves the candidate the rule scores highest,
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
    """
    decided = near_duplicates if near_duplicates is not None else np.zeros(len(labels), dtype=bool)
    groups = lookups if lookups is not None else np.full(len(labels), -1)
    eligible = (similarities >= low_cosine) & ~vetoed
    verified = eligible & ~decided
    logits = _logit_array(probabilities[verified])
    logit_range = (
        (math.floor(float(logits.min()) * 1e5) / 1e5, math.ceil(float(logits.max()) * 1e5) / 1e5)
        if len(logits)
        else _WIDEST_LOGIT_RANGE
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
        served_at = np.where(ranked_scores >= _DECIDED_SCORE, np.inf, np.minimum(ranked_scores, 1.0))
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
        low_cosine, guards, tuple(points), verifier_sha256, fitted_on, combiner, logit_range, languages
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
        _DECIDED_SCORE if near else calibration.combine(float(cosine), float(probability))
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


@functools.lru_cache(maxsize=4)
def _shipped_verifier(runtime: str, export_dir: Path | None, threads: int) -> PairScorer:
    """The shipped verifier, loaded once per process and shared by every rule built on it (it keeps no
    state between calls): apps started in one process (tests, an embedding program) load it once."""
    from semantic.rule.verifier import PairVerifier

    return PairVerifier(runtime=runtime, export_dir=export_dir, threads=threads)


def file_sha256(path: Path) -> str:
    """The file's sha256, read once per (path, size, modification time) in a process."""
    stat = path.stat()
    return _sha256(path, stat.st_size, stat.st_mtime_ns)


@functools.lru_cache(maxsize=16)
def _sha256(path: Path, size: int, mtime_ns: int) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


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
    features = np.column_stack([similarities, _logit_array(probabilities)])  # (N, 2)
    model = LogisticRegression(C=10.0, max_iter=1000).fit(features, labels)
    cosine_weight, logit_weight = (float(value) for value in model.coef_[0])
    return (round(cosine_weight, 5), round(logit_weight, 5), round(float(model.intercept_[0]), 5))


def _combiner(values: object) -> tuple[float, float, float]:
    if not isinstance(values, list | tuple) or len(values) != 3:
        raise ValueError("calibration combiner must be [cosine weight, logit weight, bias]")
    return (float(values[0]), float(values[1]), float(values[2]))


def _logit_range(values: object) -> tuple[float, float]:
    if not isinstance(values, list | tuple) or len(values) != 2 or float(values[0]) > float(values[1]):
        raise ValueError("calibration logit_range must be [lowest, highest]")
    return (float(values[0]), float(values[1]))


def _languages(values: object) -> tuple[str, ...]:
    if (
        not isinstance(values, list | tuple)
        or not values
        or not all(isinstance(code, str) for code in values)
    ):
        raise ValueError("calibration languages must be a non-empty list of language codes")
    return tuple(str(code) for code in values)


def _logit(probability: float) -> float:
    clipped = min(max(probability, 1e-6), 1 - 1e-6)
    return math.log(clipped / (1 - clipped))


def _logit_array(probabilities: npt.NDArray[np.float32]) -> npt.NDArray[np.float64]:
    clipped = np.clip(probabilities.astype(np.float64), 1e-6, 1 - 1e-6)
    return np.asarray(np.log(clipped / (1 - clipped)), dtype=np.float64)


def _sigmoid(value: float) -> float:
    return 1.0 / (1.0 + math.exp(-max(min(value, 50.0), -50.0)))


def _unverified_score(similarity: float, weight: float) -> float:
    return _UNVERIFIED_SCORE_CEILING * weight * _clamp(similarity)


def _clamp(value: float) -> float:
    return min(max(value, 0.0), 1.0)
