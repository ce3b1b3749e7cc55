"""The `kvgate` commands an operator runs against labelled pairs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from gateway.cli import app

PAIRS = Path(__file__).resolve().parents[3] / "shared" / "data" / "qqp_dev.jsonl"


@pytest.mark.slow
def test_eval_pairs_prints_the_five_figures_as_its_last_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    if not PAIRS.exists():
        pytest.skip(f"{PAIRS} is not here")
    monkeypatch.setenv("KVGATE_DATA_DIR", str(tmp_path))
    monkeypatch.delenv("KVGATE_REDIS_URL", raising=False)
    result = CliRunner().invoke(
        app, ["eval-pairs", str(PAIRS), "--limit", "40", "--target-false-hit-rate", "0.2"]
    )
    assert result.exit_code == 0, result.output
    summary = json.loads(result.output.strip().splitlines()[-1])
    assert set(summary) == {
        "precision",
        "recall",
        "false_hit_rate",
        "auc",
        "baseline_recall_at_same_precision",
    }
    assert 0.0 <= summary["recall"] <= 1.0 and 0.0 <= summary["auc"] <= 1.0


def test_eval_pairs_refuses_a_missing_file(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["eval-pairs", str(tmp_path / "nope.jsonl")])
    assert result.exit_code == 2
