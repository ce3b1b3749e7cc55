"""The seam between the cache and its decision rule: what a rule is asked, and what it answers.

The cache finds the nearest stored prompt in the request's scope; the rule decides whether that stored
answer may be served for this prompt. The served rule is `semantic/rule/calibrated_rule.py` (one per language
profile, routed by `semantic/rule/language_routed_rule.py`); the cache depends only on this.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True, slots=True)
class Verdict:
    """A rule's decision for one (query, candidate) pair.

    `score` is the rule's confidence that the two texts mean the same thing, in [0, 1], comparable
    across pairs (it is what ROC-AUC and the similarity histograms are computed on). `reason` says in a
    few words why a pair was refused (`"numbers differ"`, `"below threshold"`), for logs and reports.
    """

    hit: bool
    score: float
    reason: str


class HitRule(Protocol):
    """Decides whether a stored prompt is close enough to a new prompt for its answer to be reused."""

    @property
    def name(self) -> str:
        """Identifies the rule in logs and reports."""
        ...

    def language_refusal(self, text: str) -> str | None:
        """Why `text` gets exact hits only (the rule was not measured in its language), or None."""
        ...

    def judge(self, query: str, candidate: str, similarity: float, strictness: float = 0.0) -> Verdict:
        """`similarity` is the embedder cosine; `strictness` in [0, 1] can only make hits rarer."""
        ...

    def judge_many(
        self, pairs: Sequence[tuple[str, str]], similarities: Sequence[float], strictness: float = 0.0
    ) -> list[Verdict]:
        """`judge` over many pairs at once (a model, if any, runs once over the batch)."""
        ...

    def quick_verdict(
        self, query: str, candidate: str, similarity: float, strictness: float = 0.0
    ) -> Verdict | None:
        """The verdict when it needs no model (cheap checks settle it, on the event loop), else None."""
        ...


class PairByPair:
    """`judge_many` for a rule with no model to batch: `judge` pair by pair (mixed into such rules)."""

    __slots__ = ()

    def judge(self, query: str, candidate: str, similarity: float, strictness: float = 0.0) -> Verdict:
        raise NotImplementedError

    def judge_many(
        self, pairs: Sequence[tuple[str, str]], similarities: Sequence[float], strictness: float = 0.0
    ) -> list[Verdict]:
        if len(pairs) != len(similarities):
            raise ValueError("one similarity per pair")
        return [
            self.judge(query, candidate, similarity, strictness)
            for (query, candidate), similarity in zip(pairs, similarities, strict=True)
        ]


class ByBatch:
    """`judge` for a rule whose work is batched: `judge_many` of one pair (mixed into such rules)."""

    __slots__ = ()

    def judge_many(
        self, pairs: Sequence[tuple[str, str]], similarities: Sequence[float], strictness: float = 0.0
    ) -> list[Verdict]:
        raise NotImplementedError

    def judge(self, query: str, candidate: str, similarity: float, strictness: float = 0.0) -> Verdict:
        """Decide one pair; `strictness` in [0, 1] scales the allowed false-hit rate down to zero."""
        return self.judge_many([(query, candidate)], [similarity], strictness)[0]
