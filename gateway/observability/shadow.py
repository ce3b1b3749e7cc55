"""Shadow mode, for tuning the semantic rule on live traffic without serving a single semantic hit.

With it on, a semantic hit is counted and logged but the request is answered by the backend; when the
fresh answer is complete it is compared with the answer the cache would have served. The report then shows
how often a hit would have been served and how close the two answers were.
"""

from __future__ import annotations

import difflib
import logging
from dataclasses import dataclass, field
from typing import Any

logger = logging.getLogger("kvgate.shadow")


def answer_similarity(cached: str, fresh: str) -> float:
    """Word-level similarity of two answers in [0, 1] (difflib's ratio over word sequences)."""
    return difflib.SequenceMatcher(a=cached.split(), b=fresh.split(), autojunk=False).ratio()


@dataclass(slots=True)
class ShadowStats:
    """Would-be semantic hits, and how their cached answers compared with the fresh ones."""

    would_hit: int = 0
    compared: int = 0
    identical: int = 0
    similarity_sum: float = 0.0
    histogram: list[int] = field(default_factory=lambda: [0] * 10)

    def record_candidate(self) -> None:
        self.would_hit += 1

    def record_comparison(self, cached: str, fresh: str, request_id: str, entry_id: str) -> float:
        similarity = answer_similarity(cached, fresh)
        self.compared += 1
        self.identical += cached.strip() == fresh.strip()
        self.similarity_sum += similarity
        self.histogram[min(int(similarity * 10), 9)] += 1
        logger.info(
            "shadow semantic hit compared",
            extra={"request_id": request_id, "entry_id": entry_id, "answer_similarity": round(similarity, 4)},
        )
        return similarity

    def merge(self, other: ShadowStats) -> None:
        """Add another worker's counts."""
        self.would_hit += other.would_hit
        self.compared += other.compared
        self.identical += other.identical
        self.similarity_sum += other.similarity_sum
        self.histogram = [mine + theirs for mine, theirs in zip(self.histogram, other.histogram, strict=True)]

    def report(self) -> dict[str, Any]:
        return {
            "would_hit": self.would_hit,
            "compared": self.compared,
            "identical_answers": self.identical,
            "mean_answer_similarity": self.similarity_sum / self.compared if self.compared else None,
            "answer_similarity_histogram": {
                f"{bucket / 10:.1f}": count for bucket, count in enumerate(self.histogram)
            },
        }
