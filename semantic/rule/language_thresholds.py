"""The multilingual profile's calibration: one verifier threshold per language and target false-hit rate.

Thresholds are fitted on the calibration part of the development set (`bench/semantic/bench_multilingual.py
--write-calibration`, `fit_shared_threshold`), at several targets, and stored in
`semantic/rule/multilingual_calibration.json`; a language with no threshold at the served target gets exact
hits only. The file names no gate and no guards: they are fixed here (`MIN_COSINE`, `MULTILINGUAL_GUARDS`).
Knows numbers and files; no model.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import numpy.typing as npt

# multilingual-e5's cosine between two questions of one language is rarely below 0.8 even when they are
# unrelated (every positive of the development set's train part is above 0.84): the gate only saves the
# verifier's pass on pairs that share nothing.
MIN_COSINE = 0.8
# Digits read the same in every script; a task request is not a question (`semantic/guards/request_guards.py`).
MULTILINGUAL_GUARDS: tuple[str, ...] = ("numbers", "task_request")


@dataclass(frozen=True, slots=True)
class LanguageThresholds:
    """Per language, the verifier probability at which at most `target` of hits were wrong, per target."""

    thresholds: Mapping[str, Mapping[float, float]]
    verifier_sha256: str
    fitted_on: Mapping[str, int]  # language -> calibration rows

    def languages(self, target: float) -> tuple[str, ...]:
        """The languages that get semantic hits at `target`."""
        return tuple(sorted(code for code in self.thresholds if not math.isinf(self.threshold(code, target))))

    def threshold(self, code: str, target: float) -> float:
        """The threshold of the largest fitted target not above `target` (inf: none is that strict)."""
        fitted = self.thresholds.get(code, {})
        eligible = [fitted_target for fitted_target in fitted if fitted_target <= target + 1e-12]
        return fitted[max(eligible)] if eligible else math.inf

    # What the rule reads (`RuleCalibration`); the gate and the guards are fixed here: the file names neither.

    @property
    def low_cosine(self) -> float:
        return MIN_COSINE

    @property
    def guards(self) -> tuple[str, ...]:
        return MULTILINGUAL_GUARDS

    def judged_languages(self, target: float) -> tuple[str, ...]:
        return self.languages(target)

    def combine(self, similarity: float, probability: float) -> float:
        """The verifier's probability itself: the thresholds were fitted on it."""
        return probability

    def best_combined(self, similarity: float) -> float:
        """Unbounded: the cosine rules no pair out before the verifier (every pair past the gate is scored)."""
        return math.inf

    def unverified_score(self, similarity: float, weight: float) -> float:
        """0: a pair refused before the verifier ranks under every verified one, whatever its cosine."""
        return 0.0

    def save(self, path: Path) -> Path:
        path.write_text(
            json.dumps(
                {
                    "verifier_sha256": self.verifier_sha256,
                    "fitted_on": dict(self.fitted_on),
                    "thresholds": {
                        code: {str(target): value for target, value in sorted(by_target.items())}
                        for code, by_target in sorted(self.thresholds.items())
                    },
                },
                indent=2,
            )
            + "\n"
        )
        return path

    @classmethod
    def load(cls, path: Path) -> LanguageThresholds:
        data = json.loads(path.read_text())
        return cls(
            {
                str(code): {float(target): float(value) for target, value in by_target.items()}
                for code, by_target in data["thresholds"].items()
            },
            str(data["verifier_sha256"]),
            {str(code): int(rows) for code, rows in data["fitted_on"].items()},
        )


def fit_shared_threshold(
    scores: npt.NDArray[np.float64],
    labels: npt.NDArray[np.int_],
    languages: npt.NDArray[np.str_],
    target: float,
    lookups: npt.NDArray[np.int_] | None = None,
) -> float | None:
    """The lowest score at which, in every language separately, at most `target` of the hits are wrong
    (cut only between distinct scores); None if no score holds it in every language.

    One threshold for all languages, checked in each: fitted per language on a few dozen pairs, a threshold
    sits just above that language's highest-scored negative and lets the next one through (measured in
    docs/benchmarks.md). `lookups`, when given, marks the candidates of one lookup (>= 0; -1 for a lone pair):
    only each lookup's best-scored candidate is what the cache would serve, so only it counts.
    """
    codes = sorted(set(languages.tolist()))
    rows = {code: np.flatnonzero(languages == code) for code in codes}
    if lookups is not None:
        rows = {code: _served_rows(members, scores, lookups) for code, members in rows.items()}
    candidates = np.unique(np.concatenate([scores[members] for members in rows.values()]))
    best: float | None = None
    for threshold in candidates[::-1]:
        if threshold <= 0:
            break
        holds = True
        for members in rows.values():
            hits = members[scores[members] >= threshold]
            if int((labels[hits] == 0).sum()) > target * len(hits):
                holds = False
                break
        if holds:
            best = float(threshold)
    return best


def _served_rows(
    rows: npt.NDArray[np.int_], scores: npt.NDArray[np.float64], lookups: npt.NDArray[np.int_]
) -> npt.NDArray[np.int_]:
    lone = [int(row) for row in rows if lookups[row] < 0]
    best: dict[int, int] = {}
    for row in rows:
        group = int(lookups[row])
        if group >= 0 and (group not in best or scores[row] > scores[best[group]]):
            best[group] = int(row)
    return np.array(sorted(lone + list(best.values())), dtype=np.int64)
