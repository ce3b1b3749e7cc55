"""Labelled pairs: reading and splitting pairs files, `kvgate eval-pairs` and `kvgate calibrate`.

A pairs file has one `{"a": ..., "b": ..., "label": 0|1}` per line. `eval-pairs` stores each `a` in a
scope of its own, looks its `b` up there, and scores the verdicts against the labels; `calibrate` fits
the rule's target -> threshold map on such files (and on the hits reported through `/admin/feedback`,
every one reported wrong then refused: `semantic/reported_pairs.py`). The per-pair cache step is one
batched callable (`PairProbe`), so the same scoring runs over the rule alone or over the full cache.
"""

from __future__ import annotations

import asyncio
import json
import secrets
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt
from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.table import Table

from semantic.cache import CacheConfig, LookupKind, SemanticCache
from semantic.embedding.embedder import Embedder, SentenceEmbedder
from semantic.embedding.embedder_source import DEFAULT_EMBEDDER_NAME, resolve_embedder
from semantic.language_routing import served_embedder
from semantic.pair_sets import LabelledPair, file_part
from semantic.reported_pairs import refuse_reported, reported_pairs
from semantic.rule.calibrated import (
    DEFAULT_GUARDS,
    DEFAULT_TARGET_FALSE_HIT_RATE,
    MIN_LANGUAGE_PAIRS,
    SHIPPED_CALIBRATION,
    Calibration,
    file_sha256,
    fit_calibration,
    measured_languages,
)
from semantic.rule.guards import GUARDS_BY_NAME, first_veto
from semantic.rule.language import pair_refusal
from semantic.rule.multilingual_rule import load_served_rule, multilingual_languages
from semantic.rule.near_duplicate import near_duplicate_reason
from semantic.rule.verdict import HitRule, PairByPair, Verdict
from semantic.rule.verifier import WEIGHTS_FILE, PairVerifier
from semantic.store.changes import RedisClient
from semantic.store.entries import RedisEntryStore
from semantic.store.scope import build_scope

CACHE_CONCURRENCY = 32


# ---------------------------------------------------------------------------------------------------------
# `kvgate eval-pairs`: run each pair through the cache and score the verdicts.


@dataclass(frozen=True, slots=True)
class PairOutcome:
    """What one cache step gave for a pair: the cosine of the entry found for `b`, and the rule's verdict."""

    similarity: float
    verdict: Verdict


class PairProbe(Protocol):
    """The per-pair cache step, batched: store each `a` in a scope of its pair's own, look up its `b` there."""

    async def __call__(self, pairs: Sequence[LabelledPair]) -> list[PairOutcome]: ...


ProbeFactory = Callable[[HitRule], AbstractAsyncContextManager[PairProbe]]


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


class RuleProbe:
    """The rule over embedder cosines, with no store or index: what a scope holding only `a` would decide."""

    def __init__(self, embedder: Embedder, rule: HitRule) -> None:
        self.embedder = embedder
        self.rule = rule

    async def __call__(self, pairs: Sequence[LabelledPair]) -> list[PairOutcome]:
        stored = self.embedder.embed([pair.a for pair in pairs])  # (N, D), unit rows
        looked_up = self.embedder.embed([pair.b for pair in pairs])  # (N, D)
        similarities = (stored * looked_up).sum(axis=1).tolist()
        verdicts = self.rule.judge_many([(pair.b, pair.a) for pair in pairs], similarities)
        return [
            PairOutcome(similarity, verdict)
            for similarity, verdict in zip(similarities, verdicts, strict=True)
        ]


@asynccontextmanager
async def rule_probe(rule: HitRule) -> AsyncIterator[PairProbe]:
    """A `ProbeFactory` for `RuleProbe` over the default embedder (with the multilingual one behind it for
    the languages the rule judges with it)."""
    yield RuleProbe(served_embedder(default_embedder(), multilingual_languages(rule)), rule)


class CacheProbe:
    """The real cache: each `a` inserted into a scope of its pair's own, its `b` looked up there.

    Store, index, embedder batching and candidate checks all run as they do when serving. The cache's
    rule only records what it was asked; the verdicts then come from one `judge_many` over those
    questions: the served rule's decisions, with the verifier run once per batch instead of per pair.
    """

    def __init__(self, cache: SemanticCache, recorder: RecordingRule, rule: HitRule) -> None:
        self.cache = cache
        self.recorder = recorder
        self.rule = rule
        self._run = secrets.token_hex(4)
        self._seen = 0

    async def __call__(self, pairs: Sequence[LabelledPair]) -> list[PairOutcome]:
        tenants = [f"eval-{self._run}-{self._seen + index}" for index in range(len(pairs))]
        self._seen += len(pairs)
        name = self.cache.scope_embedder
        stored = [
            build_scope(_chat(pair.a), tenant=tenant, embedder=name)
            for pair, tenant in zip(pairs, tenants, strict=True)
        ]
        looked_up = [
            build_scope(_chat(pair.b), tenant=tenant, embedder=name)
            for pair, tenant in zip(pairs, tenants, strict=True)
        ]
        lookups = []
        # A few dozen requests in flight, as concurrent clients would be: enough for the embedder to
        # micro-batch, few enough for the Redis connection pool.
        for start in range(0, len(pairs), CACHE_CONCURRENCY):
            window = slice(start, start + CACHE_CONCURRENCY)
            await asyncio.gather(
                *(self.cache.insert(scope, f"answer {scope.tenant}") for scope in stored[window])
            )
            lookups.extend(await asyncio.gather(*(self.cache.lookup(scope) for scope in looked_up[window])))
        outcomes: list[PairOutcome | None] = [None] * len(pairs)
        questions, similarities, asked = [], [], []
        for index, lookup in enumerate(lookups):
            question = (looked_up[index].prompt, stored[index].prompt)
            similarity = self.recorder.asked.get(question)
            if lookup.kind is LookupKind.EXACT_HIT:
                outcomes[index] = PairOutcome(1.0, Verdict(True, 1.0, "exact match"))
            elif similarity is None:
                outcomes[index] = PairOutcome(-1.0, Verdict(False, 0.0, lookup.reason or "no candidate"))
            else:
                questions.append(question)
                similarities.append(similarity)
                asked.append(index)
        for index, similarity, verdict in zip(
            asked, similarities, self.rule.judge_many(questions, similarities), strict=True
        ):
            outcomes[index] = PairOutcome(similarity, verdict)
        self.recorder.asked.clear()
        return [outcome for outcome in outcomes if outcome is not None]


class RecordingRule(PairByPair):
    """A `HitRule` that refuses every pair and remembers what it was asked, keyed by (query, candidate)."""

    name = "recording"

    def __init__(self, served: HitRule) -> None:
        self.asked: dict[tuple[str, str], float] = {}
        self.served = served

    def language_refusal(self, text: str) -> str | None:
        """The served rule's: a prompt it will not judge is neither indexed nor looked up, as when serving."""
        return self.served.language_refusal(text)

    def judge(self, query: str, candidate: str, similarity: float, strictness: float = 0.0) -> Verdict:
        self.asked[(query, candidate)] = similarity
        return Verdict(False, 0.0, "deferred")

    def quick_verdict(
        self, query: str, candidate: str, similarity: float, strictness: float = 0.0
    ) -> Verdict | None:
        """None: every pair is recorded, to be decided later by the served rule in one batch."""
        return None


def cache_probe(client: RedisClient, embedder: Embedder | None = None) -> ProbeFactory:
    """A `ProbeFactory` over the real cache on `client`, under a key prefix of its own deleted afterwards."""

    @asynccontextmanager
    async def factory(rule: HitRule) -> AsyncIterator[PairProbe]:
        prefix = f"kvgate:eval:{secrets.token_hex(6)}"
        recorder = RecordingRule(rule)
        cache = SemanticCache(
            RedisEntryStore(client, prefix=prefix),
            served_embedder(
                embedder if embedder is not None else default_embedder(), multilingual_languages(rule)
            ),
            recorder,
            CacheConfig(default_ttl_s=3600.0, candidates=1, judged=1),
        )
        await cache.start()
        try:
            yield CacheProbe(cache, recorder, rule)
        finally:
            await cache.stop()
            keys = [key async for key in client.scan_iter(match=f"{prefix}:*", count=1000)]
            for start in range(0, len(keys), 500):
                await client.delete(*keys[start : start + 500])
            # The connections belong to this event loop, which ends with the evaluation.
            pool = getattr(client, "connection_pool", None)  # a cluster client has one per node
            if pool is not None:
                await pool.disconnect()

    return factory


def run_eval_pairs(
    path: Path,
    target: float = DEFAULT_TARGET_FALSE_HIT_RATE,
    *,
    part: str = "all",
    probe_factory: ProbeFactory | None = None,
    data_dir: Path | None = None,
    limit: int | None = None,
    batch_size: int = 256,
    on_progress: Callable[[int, int], None] | None = None,
) -> EvalReport:
    """Run every pair of a pairs file through the cache (`cache_probe`) and score it.

    `probe_factory` builds the per-pair step around the served rule: give `cache_probe(client)` for the
    real cache; the default `rule_probe` skips store and index. `data_dir` is where a user calibration
    (`kvgate calibrate`) is looked for; `part` picks a part of a development set (`file_part`);
    `on_progress(done, total)` is called after each batch.
    """
    pairs = file_part(path, part, limit)
    rule = load_served_rule(data_dir, target)
    factory = probe_factory if probe_factory is not None else rule_probe

    async def run() -> list[PairOutcome]:
        outcomes: list[PairOutcome] = []
        async with factory(rule) as probe:
            for start in range(0, len(pairs), batch_size):
                outcomes.extend(await probe(pairs[start : start + batch_size]))
                if on_progress is not None:
                    on_progress(len(outcomes), len(pairs))
        return outcomes

    return score_outcomes(pairs, asyncio.run(run()), target)


def run_eval_pairs_with_progress(path: Path, target: float, console: Console, **options: Any) -> EvalReport:
    """`run_eval_pairs` behind a rich progress bar; prints the summary JSON as the last line on stdout."""
    with Progress(
        TextColumn("[bold]eval-pairs"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
        console=console,
        transient=True,
    ) as progress:
        task = progress.add_task("pairs", total=None)
        report = run_eval_pairs(
            path,
            target,
            on_progress=lambda done, total: progress.update(task, completed=done, total=total),
            **options,
        )
    if report.by_kind:
        console.print(kind_table(report))
    console.print(
        f"{report.pairs} pairs ({report.positives} positive), {report.hits} hits at target "
        f"{report.target_false_hit_rate:.3f}; cosine AUC {report.cosine_auc:.4f}; {report.reasons}"
    )
    print(json.dumps(report.summary()), flush=True)
    return report


def calibrate(
    paths: Sequence[Path],
    out: Path,
    *,
    part: str = "all",
    low_cosine: float | None = None,
    guards: tuple[str, ...] = DEFAULT_GUARDS,
    limit: int | None = None,
    on_progress: Callable[[int, int], None] | None = None,
    feedback: Path | None = None,
) -> Path:
    """Fit the rule's target -> threshold map on labelled pairs files (`part` of each) and write it to `out`.

    The verifier scores every pair above a loose cosine floor, so the fit sees the whole uncertain band.
    `low_cosine` defaults to the shipped calibration's gate. `feedback` is a file of reported hits (the
    gateway's `feedback.jsonl`, read whole): its pairs join the fit, then every fitted threshold is raised
    above the pairs reported wrong, so that the calibration written refuses each of them (`refuse_reported`).
    """
    pairs = [pair for path in paths for pair in file_part(path, part, limit)]
    reported = reported_pairs(feedback) if feedback is not None else []
    reported_wrong = np.array([False] * len(pairs) + [pair.label == 0 for pair in reported], dtype=bool)
    pairs += reported
    gate = low_cosine if low_cosine is not None else Calibration.load(SHIPPED_CALIBRATION).low_cosine
    embedder = default_embedder()
    verifier = PairVerifier()
    similarities = np.zeros(len(pairs), dtype=np.float32)
    probabilities = np.zeros(len(pairs), dtype=np.float32)
    for start in range(0, len(pairs), 256):
        chunk = pairs[start : start + 256]
        stored, looked_up = (
            embedder.embed([pair.a for pair in chunk]),
            embedder.embed([pair.b for pair in chunk]),
        )
        cosines = (stored * looked_up).sum(axis=1)
        similarities[start : start + len(chunk)] = cosines
        reach = [index for index, cosine in enumerate(cosines) if cosine >= gate]
        scored = verifier.probabilities([(chunk[index].b, chunk[index].a) for index in reach])
        probabilities[[start + index for index in reach]] = scored
        if on_progress is not None:
            on_progress(start + len(chunk), len(pairs))
    chosen = tuple(GUARDS_BY_NAME[name] for name in guards)
    languages = measured_languages([(pair.a, pair.b, pair.label) for pair in pairs])
    if not languages:
        raise ValueError(
            f"no language has {MIN_LANGUAGE_PAIRS} positive and {MIN_LANGUAGE_PAIRS} negative pairs in these "
            "files: too few to calibrate"
        )
    # Pairs the served rule will refuse for their language compete for no threshold.
    vetoed = np.array(
        [
            pair_refusal(pair.b, pair.a, languages) is not None
            or first_veto(pair.b, pair.a, chosen) is not None
            for pair in pairs
        ]
    )
    near = np.array([near_duplicate_reason(pair.b, pair.a) is not None for pair in pairs])
    labels = np.array([pair.label for pair in pairs])
    fitted_on: dict[str, object] = {"files": [path.name for path in paths], "part": part, "pairs": len(pairs)}
    if feedback is not None:
        fitted_on["feedback"] = {
            "file": feedback.name,
            "pairs": len(reported),
            "wrong": int(reported_wrong.sum()),
        }
    calibration = fit_calibration(
        similarities,
        probabilities,
        vetoed,
        labels,
        near_duplicates=near,
        low_cosine=gate,
        guards=guards,
        verifier_sha256=file_sha256(WEIGHTS_FILE),
        fitted_on=fitted_on,
        languages=languages,
        combiner_target=DEFAULT_TARGET_FALSE_HIT_RATE,
    )
    judged = (similarities >= gate) & ~vetoed
    calibration = refuse_reported(
        calibration, similarities, probabilities, judged, near, labels, reported_wrong
    )
    return calibration.save(out)


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


def kind_table(report: EvalReport) -> Table:
    """The per-kind figures as a rich table: wrong hits for label-0 kinds, recall for label-1 ones."""
    table = Table(title=f"by kind, at target {report.target_false_hit_rate:.3f}")
    for column in ("kind", "pairs", "label 1", "hits", "wrong hits", "recall"):
        table.add_column(column, justify="left" if column == "kind" else "right")
    for kind, figures in report.by_kind.items():
        recall = figures.recall
        table.add_row(
            kind,
            str(figures.pairs),
            str(figures.positives),
            str(figures.hits),
            str(figures.wrong_hits),
            "—" if recall is None else f"{recall:.2f}",
        )
    return table


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


def _chat(text: str) -> dict[str, Any]:
    return {"model": "eval-pairs", "messages": [{"role": "user", "content": text}], "temperature": 0}


def default_embedder() -> SentenceEmbedder:
    return SentenceEmbedder(resolve_embedder(DEFAULT_EMBEDDER_NAME))
