"""`kvgate eval-pairs`: run every pair of a labelled pairs file through the cache and score the verdicts.

A pairs file has one `{"a": ..., "b": ..., "label": 0|1}` per line. Each `a` is stored in a scope of its own
and its `b` looked up there (`evaluation/probes.py`), under the served rule (`semantic/rule/loading.py`: a
user calibration in the data dir first); the verdicts are scored against the labels (`evaluation/scoring.py`).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

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

from evaluation.pair_sets import file_part
from evaluation.probes import PairOutcome, ProbeFactory, rule_probe
from evaluation.scoring import EvalReport, score_outcomes
from semantic.rule.calibration import DEFAULT_TARGET_FALSE_HIT_RATE
from semantic.rule.loading import load_served_rule


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
