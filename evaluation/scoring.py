"""Scoring `kvgate eval-pairs`: precision, recall, false-hit rate and ROC-AUC of the verdicts against the
labels, figures per kind of pair, and what a plain cosine threshold does at the same precision and recall.
Knows numbers only.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from evaluation.pair_sets import LabelledPair
from evaluation.probes import PairOutcome


@dataclass(frozen=True, slots=True)
class KindFigures:
    """One `kind` of pair in a file that has them: how many, how many may hit, what the rule did."""

    pairs: int
    positives: int
    hits: int
    wrong_hits: int

    @property
    def recall(self) -> float | None:
        return (self.hits - self.wrong_hits) / self.positives if self.positives else None


@dataclass(frozen=True, slots=True)
class EvalReport:
    """The figures `kvgate eval-pairs` prints; `summary()` is its last line, exactly these five keys."""

    precision: float
    recall: float
    false_hit_rate: float
    auc: float
    baseline_recall_at_same_precision: float
    baseline_precision_at_same_recall: float
    pairs: int
    positives: int
    hits: int
    target_false_hit_rate: float
    cosine_auc: float
    reasons: dict[str, int]
    by_kind: dict[str, KindFigures] = field(default_factory=dict)

    def summary(self) -> dict[str, float]:
        return {
            "precision": round(self.precision, 4),
            "recall": round(self.recall, 4),
            "false_hit_rate": round(self.false_hit_rate, 4),
            "auc": round(self.auc, 4),
            "baseline_recall_at_same_precision": round(self.baseline_recall_at_same_precision, 4),
            "baseline_precision_at_same_recall": round(self.baseline_precision_at_same_recall, 4),
        }


def score_outcomes(
    pairs: Sequence[LabelledPair], outcomes: Sequence[PairOutcome], target: float
) -> EvalReport:
    """Precision, recall and AUC of the verdicts, and what a plain cosine threshold does at that precision."""
    labels = np.array([pair.label for pair in pairs], dtype=np.int64)
    hits = np.array([outcome.verdict.hit for outcome in outcomes], dtype=bool)
    scores = np.array([outcome.verdict.score for outcome in outcomes], dtype=np.float64)
    similarities = np.array([outcome.similarity for outcome in outcomes], dtype=np.float64)
    positives = int(labels.sum())
    correct = int((hits & (labels == 1)).sum())
    # No hits at all: no wrong hit was served, so precision is vacuously 1.
    precision = correct / int(hits.sum()) if hits.any() else 1.0
    reasons: dict[str, int] = {}
    for outcome in outcomes:
        reasons[outcome.verdict.reason] = reasons.get(outcome.verdict.reason, 0) + 1
    return EvalReport(
        precision=precision,
        recall=correct / max(positives, 1),
        false_hit_rate=1.0 - precision,
        auc=roc_auc(scores, labels),
        baseline_recall_at_same_precision=recall_at_precision(similarities, labels, precision),
        baseline_precision_at_same_recall=precision_at_recall(
            similarities, labels, correct / max(positives, 1)
        ),
        pairs=len(pairs),
        positives=positives,
        hits=int(hits.sum()),
        target_false_hit_rate=target,
        cosine_auc=roc_auc(similarities, labels),
        reasons=reasons,
        by_kind=figures_by_kind(pairs, hits),
    )


def figures_by_kind(pairs: Sequence[LabelledPair], hits: npt.NDArray[np.bool_]) -> dict[str, KindFigures]:
    """Per `kind` (pairs without one are left out), in name order."""
    counts: dict[str, list[int]] = {}
    for pair, hit in zip(pairs, hits.tolist(), strict=True):
        if pair.kind is None:
            continue
        row = counts.setdefault(pair.kind, [0, 0, 0, 0])
        row[0] += 1
        row[1] += pair.label
        row[2] += int(hit)
        row[3] += int(hit and pair.label == 0)
    return {kind: KindFigures(*counts[kind]) for kind in sorted(counts)}


def roc_auc(scores: npt.NDArray[np.float64], labels: npt.NDArray[np.int64]) -> float:
    """Area under the ROC curve: P(a random positive outscores a random negative), ties counting half."""
    positives, negatives = int((labels == 1).sum()), int((labels == 0).sum())
    if positives == 0 or negatives == 0:
        return 0.5
    order = np.argsort(scores, kind="stable")
    ranks = np.empty(len(scores), dtype=np.float64)
    ranks[order] = np.arange(1, len(scores) + 1)
    # Tied scores share the mean of their ranks.
    unique, inverse, counts = np.unique(scores, return_inverse=True, return_counts=True)
    rank_sums = np.bincount(inverse, weights=ranks, minlength=len(unique))
    ranks = (rank_sums / counts)[inverse]
    return float((ranks[labels == 1].sum() - positives * (positives + 1) / 2) / (positives * negatives))


def recall_at_precision(
    similarities: npt.NDArray[np.float64], labels: npt.NDArray[np.int64], precision: float
) -> float:
    """The best recall of any plain threshold on `similarities` whose hits are at least `precision` correct."""
    positives = int(labels.sum())
    if positives == 0:
        return 0.0
    order = np.argsort(-similarities, kind="stable")
    ranked, ranked_labels = similarities[order], labels[order]
    true_hits = np.cumsum(ranked_labels)
    counts = np.arange(1, len(ranked) + 1)
    # Only cut between distinct values: a threshold cannot split tied similarities.
    cuts = np.append(ranked[1:] != ranked[:-1], True)
    meets = cuts & (true_hits / counts >= precision - 1e-12)
    return float(true_hits[meets].max() / positives) if meets.any() else 0.0


def precision_at_recall(
    similarities: npt.NDArray[np.float64], labels: npt.NDArray[np.int64], recall: float
) -> float:
    """Precision of the plain threshold on `similarities` that first reaches `recall` (1.0 for recall 0)."""
    if recall <= 0.0:
        return 1.0
    order = np.argsort(-similarities, kind="stable")
    true_hits = np.cumsum(labels[order])
    reached = np.flatnonzero(true_hits >= recall * labels.sum() - 1e-9)
    return float(true_hits[reached[0]] / (reached[0] + 1)) if len(reached) else 0.0
