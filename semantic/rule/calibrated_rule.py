"""The decision rule, one for every language profile: may the stored answer of `candidate` be served for `query`?

A cosine threshold alone is either unsafe or useless on hard negatives, so the rule layers its checks, each
from the rule's profile (`semantic/rule/profiles.py`) and calibration (`semantic/rule/calibration.py`):

0. only text in a language the calibration measured is judged (`semantic/guards/language.py`); a prompt in
   another language, or two prompts in different languages, get exact hits only;
1. the embedder cosine gates: below the calibration's `low_cosine` it is a miss and nothing else runs;
2. the guards the calibration names veto pairs whose numbers, negation or task differ, and a pair that asks
   the same thing in the same words is served without the verifier (`semantic/guards/registry.py`);
3. the verifier (`semantic/verifier/pair_verifier.py`, a cross-encoder) scores the rest; the calibration
   turns its probability (with the cosine, for the English combiner) into the score a pair is served on, and
   a pair is a hit when that score reaches the threshold fitted for the target false-hit rate in its language.

Where the calibration shows no verifier answer can reach the threshold at this cosine, `quick_verdict` refuses
without running the verifier: the same decision, without the cross-encoder's pass. This module knows
thresholds and policy, not Redis or FAISS.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Protocol

import numpy as np
import numpy.typing as npt

from semantic.guards import language
from semantic.rule.calibration import DEFAULT_TARGET_FALSE_HIT_RATE, RuleCalibration, clamp
from semantic.rule.profiles import ENGLISH, LanguageProfile
from semantic.rule.verdict import ByBatch, Verdict


class PairScorer(Protocol):
    """What the rule needs of a verifier: P(same meaning) per pair, batched."""

    @property
    def name(self) -> str: ...

    def probabilities(
        self, pairs: Sequence[tuple[str, str]], batch_size: int = 64
    ) -> npt.NDArray[np.float32]: ...


class CalibratedRule(ByBatch):
    """The `HitRule` kvgate serves with: language, cosine gate, guards, then the verifier against a threshold."""

    def __init__(
        self,
        verifier: PairScorer,
        calibration: RuleCalibration,
        target_false_hit_rate: float = DEFAULT_TARGET_FALSE_HIT_RATE,
        *,
        profile: LanguageProfile = ENGLISH,
    ) -> None:
        # 1.0 serves whatever the verifier accepts at its lowest fitted threshold (bench_multilingual scores so).
        if not 0.0 < target_false_hit_rate <= 1.0:
            raise ValueError(f"target false-hit rate must be in (0, 1], got {target_false_hit_rate}")
        self.name = profile.rule_name
        self.profile = profile
        self.verifier = verifier
        self.calibration = calibration
        self.target_false_hit_rate = target_false_hit_rate
        self.guards = profile.guard_set(calibration)
        self._judged = calibration.judged_languages(target_false_hit_rate)
        self._languages = frozenset(self._judged)

    @property
    def languages(self) -> tuple[str, ...]:
        """The languages this rule judges at its target; every other prompt gets exact hits only."""
        return self._judged

    def language_refusal(self, text: str) -> str | None:
        """Why `text` may get exact hits only (its language was not measured), or None when it is judged."""
        return language.refusal(text, self._languages)

    def judge_many(
        self, pairs: Sequence[tuple[str, str]], similarities: Sequence[float], strictness: float = 0.0
    ) -> list[Verdict]:
        """Decide many (query, candidate) pairs at once: the verifier runs once over those that reach it.

        Unlike `quick_verdict`, pairs past the guards are scored even where no threshold can be met, so that
        evaluation ranks them (ROC-AUC); the decisions are the same.
        """
        if len(pairs) != len(similarities):
            raise ValueError("one similarity per pair")
        verdicts: list[Verdict | None] = [
            self._unverified(query, candidate, similarity)
            for (query, candidate), similarity in zip(pairs, similarities, strict=True)
        ]
        to_verify = [index for index, verdict in enumerate(verdicts) if verdict is None]
        probabilities = self.verifier.probabilities([pairs[index] for index in to_verify])
        for index, probability in zip(to_verify, probabilities.tolist(), strict=True):
            score = self.calibration.combine(similarities[index], probability)
            hit = score >= self._threshold(pairs[index][0], strictness)
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
        threshold = self._threshold(query, strictness)
        refused = self.calibration.unverified_score(similarity, 1.0)
        if math.isinf(threshold):
            return Verdict(False, refused, "no calibrated threshold at this target")
        if self.calibration.best_combined(similarity) < threshold:
            return Verdict(False, refused, "cosine too low for the verifier to reach the threshold")
        return None

    def _unverified(self, query: str, candidate: str, similarity: float) -> Verdict | None:
        calibration = self.calibration
        if (reason := language.pair_refusal(query, candidate, self._languages)) is not None:
            return Verdict(False, calibration.unverified_score(similarity, 1.0), reason)
        if similarity < calibration.low_cosine:
            return Verdict(False, calibration.unverified_score(similarity, 0.5), "below cosine gate")
        if (reason := self.guards.veto(query, candidate)) is not None:
            return Verdict(False, calibration.unverified_score(similarity, 1.0), reason)
        if (reason := self.guards.same(query, candidate)) is not None:
            return Verdict(True, 1.0, reason)
        return None

    def _threshold(self, query: str, strictness: float) -> float:
        target = self.target_false_hit_rate * (1.0 - clamp(strictness))
        return self.calibration.threshold(language.language_of(query), target)
