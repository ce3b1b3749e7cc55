"""The plainest `HitRule`: a hit when the cosine similarity reaches a threshold.

The baseline the calibrated rule in `semantic/rule/calibrated_rule.py` is measured against, and the rule the cache's
own tests use (their subject is the cache, not the decision). Knows only the `HitRule` protocol.
"""

from __future__ import annotations

from dataclasses import dataclass

from semantic.rule.verdict import PairByPair, Verdict


@dataclass(frozen=True, slots=True)
class CosineThresholdRule(PairByPair):
    """Hit when similarity >= threshold; strictness s moves the threshold to t + (1 - t) * s."""

    threshold: float = 0.9
    name: str = "cosine-threshold"

    def __post_init__(self) -> None:
        if not -1.0 <= self.threshold <= 1.0:
            raise ValueError("threshold must be a cosine, in [-1, 1]")

    def language_refusal(self, text: str) -> str | None:
        """None: a baseline that compares cosines in any language (it was never calibrated in one)."""
        return None

    def judge(self, query: str, candidate: str, similarity: float, strictness: float = 0.0) -> Verdict:
        strictness = min(max(strictness, 0.0), 1.0)
        threshold = self.threshold + (1.0 - self.threshold) * strictness
        score = min(max((similarity + 1.0) / 2.0, 0.0), 1.0)
        if similarity >= threshold:
            return Verdict(hit=True, score=score, reason="at or above threshold")
        return Verdict(hit=False, score=score, reason="below threshold")

    def quick_verdict(
        self, query: str, candidate: str, similarity: float, strictness: float = 0.0
    ) -> Verdict | None:
        """A comparison of two floats: always quick."""
        return self.judge(query, candidate, similarity, strictness)
