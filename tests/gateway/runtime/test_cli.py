"""The `kvgate` commands an operator runs against labelled pairs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from gateway.cli import app

DATA_DIR = Path(__file__).resolve().parents[4] / "shared" / "data"


@pytest.mark.slow
def test_eval_pairs_prints_the_six_figures_as_its_last_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    if not (DATA_DIR / "adversarial_dev.jsonl").exists():
        pytest.skip(f"{DATA_DIR} is not here")
    monkeypatch.setenv("KVGATE_DATA_DIR", str(tmp_path))
    monkeypatch.delenv("KVGATE_REDIS_URL", raising=False)
    result = CliRunner().invoke(
        app, ["eval-pairs", str(DATA_DIR / "adversarial_dev.jsonl"), "--part", "test", "--limit", "40"]
    )
    assert result.exit_code == 0, result.output
    summary = json.loads(result.output.strip().splitlines()[-1])
    assert set(summary) == {
        "precision",
        "recall",
        "false_hit_rate",
        "auc",
        "baseline_recall_at_same_precision",
        "baseline_precision_at_same_recall",
    }
    assert 0.0 <= summary["recall"] <= 1.0 and 0.0 <= summary["auc"] <= 1.0


def test_eval_pairs_refuses_a_missing_file(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["eval-pairs", str(tmp_path / "nope.jsonl")])
    assert result.exit_code == 2


def test_eval_pairs_refuses_a_part_of_a_file_that_has_none(tmp_path: Path) -> None:
    mine = tmp_path / "mine.jsonl"
    mine.write_text(json.dumps({"a": "x", "b": "y", "label": 1}) + "\n")
    result = CliRunner().invoke(app, ["eval-pairs", str(mine), "--part", "test"])
    assert result.exit_code == 2
    assert "not a development set" in result.output


@pytest.mark.slow
def test_calibrate_fits_the_files_given_and_serve_would_use_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # 40 near-duplicates (served without the verifier) and 40 pairs whose numbers differ (vetoed): a 2%
    # target is placed on the near-duplicates alone.
    rows = [
        (f"How do I plant {kind} seeds in pots?", f"how do I plant {kind} seeds in pots", 1)
        for kind in range(40)
    ]
    rows += [(f"Is {n} a prime number?", f"Is {n + 1} a prime number?", 0) for n in range(40)]
    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text("".join(json.dumps({"a": a, "b": b, "label": label}) + "\n" for a, b, label in rows))
    monkeypatch.setenv("KVGATE_DATA_DIR", str(tmp_path))
    result = CliRunner().invoke(app, ["calibrate", str(pairs)])
    assert result.exit_code == 0, result.output
    written = json.loads((tmp_path / "calibration.json").read_text())
    assert written["fitted_on"] == {"files": ["pairs.jsonl"], "part": "all", "pairs": 80}
    assert 0.02 in [point["target"] for point in written["points"]]
