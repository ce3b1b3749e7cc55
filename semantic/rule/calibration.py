"""A rule's calibration: what turns the verifier's probability into a hit at a target false-hit rate.

The English profile's (`Calibration`, `calibration.json`): a cosine gate, the guards, a combiner of cosine and
verifier logit fitted by logistic regression, and per target false-hit rate (wrong hits / hits) the threshold
on the combined score (`semantic/rule/calibration_fit.py` fits it). The multilingual profile's is a threshold
per language and target (`semantic/rule/language_thresholds.py`). The rule reads either through
`RuleCalibration`. A calibration is tied to the verifier weights it was fitted with (`verifier_sha256`).
Knows numbers and files; no model, no Redis.
"""

from __future__ import annotations

import functools
import hashlib
import itertools
import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Protocol

import numpy as np
import numpy.typing as npt

from semantic.guards.registry import GUARDS_BY_NAME

DEFAULT_TARGET_FALSE_HIT_RATE = 0.02
# Calibrations written before `languages` was recorded were fitted on English pairs only.
LANGUAGES_BEFORE_RECORDED = ("en",)
# Scores of pairs the verifier never saw stay below this, so they rank under almost every verified pair.
_UNVERIFIED_SCORE_CEILING = 0.01
# `logit` clips probabilities to [1e-6, 1 - 1e-6]: the widest logit range a combiner can read (and the one
# read from calibration files written before `logit_range` was fitted).
_CLIPPED_LOGIT = math.log((1 - 1e-6) / 1e-6)
WIDEST_LOGIT_RANGE = (-_CLIPPED_LOGIT, _CLIPPED_LOGIT)


class RuleCalibration(Protocol):
    """What the rule (`semantic/rule/calibrated_rule.py`) reads of a profile's calibration."""

    @property
    def verifier_sha256(self) -> str:
        """The sha256 of the verifier weights it was fitted with."""
        ...

    @property
    def low_cosine(self) -> float:
        """Below this embedder cosine a pair is a miss and nothing else runs."""
        ...

    @property
    def guards(self) -> tuple[str, ...]:
        """The guards (`semantic/guards/registry.py`) the rule runs, in order, before its verifier."""
        ...

    def judged_languages(self, target: float) -> tuple[str, ...]:
        """The languages that get semantic hits at `target`; every other prompt gets exact hits only."""
        ...

    def threshold(self, language: str, target: float) -> float:
        """The score a pair whose query is in `language` must reach at `target` (inf: none is that strict)."""
        ...

    def combine(self, similarity: float, probability: float) -> float:
        """The score a verified pair is served on, from the cosine and the verifier's probability."""
        ...

    def best_combined(self, similarity: float) -> float:
        """The highest score any verifier answer can give a pair at this cosine."""
        ...

    def unverified_score(self, similarity: float, weight: float) -> float:
        """The score of a pair refused before the verifier (ranked under the verified ones in evaluation)."""
        ...


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
    """The fitted English rule: gates, guards and target -> threshold, plus what it was fitted on."""

    low_cosine: float
    guards: tuple[str, ...]
    points: tuple[CalibrationPoint, ...]
    verifier_sha256: str
    fitted_on: dict[str, object] = field(default_factory=dict)
    combiner: tuple[float, float, float] = (0.0, 1.0, 0.0)  # cosine weight, verifier-logit weight, bias
    # The verifier logits the combiner was fitted on span this range; it reads any logit clamped into it
    # (beyond it the fitted line is an extrapolation nothing measured).
    logit_range: tuple[float, float] = WIDEST_LOGIT_RANGE
    # The languages (ISO 639-1) of the pairs it was fitted on: the only ones it judges (`semantic/guards/language.py`).
    languages: tuple[str, ...] = LANGUAGES_BEFORE_RECORDED
    # With a second verifier (`semantic/rule/second_opinion.py`): its `SecondOpinionSettings` as JSON, the
    # probabilities fitted on being the blend it gives; None (files written before it): the verifier alone.
    second_opinion: dict[str, object] | None = None

    def combine(self, similarity: float, probability: float) -> float:
        """P(same meaning) from the cosine and the verifier's probability (identity by default)."""
        return self._combine_logit(similarity, logit(probability))

    def best_combined(self, similarity: float) -> float:
        """The highest combined score any verifier answer can give a pair at this cosine."""
        low, high = self.logit_range
        return self._combine_logit(similarity, high if self.combiner[1] >= 0 else low)

    def _combine_logit(self, similarity: float, logit_value: float) -> float:
        cosine_weight, logit_weight, bias = self.combiner
        low, high = self.logit_range
        clamped = min(max(logit_value, low), high)
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

    def threshold(self, language: str, target: float) -> float:
        """`threshold_for(target)`: one threshold serves every language this calibration measured."""
        return self.threshold_for(target)

    def judged_languages(self, target: float) -> tuple[str, ...]:
        """The languages it was fitted on, at every target (below the smallest, only identical texts hit)."""
        return self.languages

    def unverified_score(self, similarity: float, weight: float) -> float:
        """Under `_UNVERIFIED_SCORE_CEILING`, by cosine: below every verified pair, in cosine order."""
        return _UNVERIFIED_SCORE_CEILING * weight * clamp(similarity)

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
            _logit_range(payload.get("logit_range", WIDEST_LOGIT_RANGE)),
            _languages(payload.get("languages", LANGUAGES_BEFORE_RECORDED)),
            _second_opinion(payload.get("second_opinion")),
        )


def file_sha256(path: Path) -> str:
    """The file's sha256, read once per (path, size, modification time) in a process."""
    stat = path.stat()
    return _sha256(path, stat.st_size, stat.st_mtime_ns)


@functools.lru_cache(maxsize=16)
def _sha256(path: Path, size: int, mtime_ns: int) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def logit(probability: float) -> float:
    clipped = min(max(probability, 1e-6), 1 - 1e-6)
    return math.log(clipped / (1 - clipped))


def logit_array(probabilities: npt.NDArray[np.float32]) -> npt.NDArray[np.float64]:
    clipped = np.clip(probabilities.astype(np.float64), 1e-6, 1 - 1e-6)
    return np.asarray(np.log(clipped / (1 - clipped)), dtype=np.float64)


def clamp(value: float) -> float:
    return min(max(value, 0.0), 1.0)


def _sigmoid(value: float) -> float:
    return 1.0 / (1.0 + math.exp(-max(min(value, 50.0), -50.0)))


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


def _second_opinion(value: object) -> dict[str, object] | None:
    if value is None:
        return None
    if not isinstance(value, dict) or not isinstance(value.get("sha256"), str):
        raise ValueError("second_opinion must be an object with the second verifier's sha256")
    return dict(value)
