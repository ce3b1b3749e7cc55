"""The feedback file: one whole JSON line per report, none lost or interleaved when reports arrive together."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from evaluation.pair_sets import load_pairs
from gateway.observability.feedback_log import FeedbackLog


async def test_concurrent_reports_each_leave_one_whole_line(tmp_path: Path) -> None:
    log = FeedbackLog(tmp_path / "data" / "feedback.jsonl")
    # Lines far larger than a pipe's atomic write: each report opens the file on its own (as another worker
    # process would), so only the lock keeps them apart.
    reports = [
        log.append(
            stored=f"stored {index} " + "x" * 200_000,
            asked=f"asked {index} ✓",
            verdict="wrong" if index % 3 else "right",
            tenant="alpha",
            request_id=f"r{index}",
            entry_id=f"e{index}",
        )
        for index in range(48)
    ]
    await asyncio.gather(*reports)

    lines = [json.loads(line) for line in log.path.read_text(encoding="utf-8").splitlines()]
    assert sorted(line["request_id"] for line in lines) == sorted(f"r{index}" for index in range(48))
    by_id = {line["request_id"]: line for line in lines}
    assert by_id["r4"]["b"] == "asked 4 ✓" and by_id["r4"]["label"] == 0 and by_id["r3"]["label"] == 1
    assert {line["kind"] for line in lines} == {"feedback"}
    assert len(load_pairs(log.path)) == 48  # what `kvgate calibrate` reads
