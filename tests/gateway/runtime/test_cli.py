"""The `kvgate` commands an operator runs against labelled pairs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from evaluation.pair_sets import ADVERSARIAL_FILE
from gateway.cli import app
from tests.pair_fixtures import ENGLISH_PAIRS, as_development_set


@pytest.mark.slow
def test_eval_pairs_prints_the_six_figures_as_its_last_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The English pairs written for the tests, named as the adversarial set so that `--part test` splits
    # them as it splits that set (their test part holds 54 pairs, both labels).
    pairs = as_development_set(ENGLISH_PAIRS, ADVERSARIAL_FILE, tmp_path / "sets")
    monkeypatch.setenv("KVGATE_DATA_DIR", str(tmp_path))
    monkeypatch.delenv("KVGATE_REDIS_URL", raising=False)
    result = CliRunner().invoke(app, ["eval-pairs", str(pairs), "--part", "test", "--limit", "40"])
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


# Rewordings the verifier judges (neither near-duplicates nor vetoed by a guard).
VERIFIED_REWORDINGS = [
    ("How do I bake sourdough bread?", "What's the process for baking sourdough bread?"),
    ("How can I learn to play guitar?", "What is the best way to learn guitar?"),
    ("How do I change a flat tire?", "What are the steps to change a flat tyre?"),
    ("What causes rainbows?", "Why do rainbows form?"),
    ("How do I make my laptop battery last longer?", "How can I extend my laptop's battery life?"),
    ("How do I remove a red wine stain from carpet?", "What's the best way to get red wine out of a carpet?"),
    ("What is the capital of Australia?", "Which city is Australia's capital?"),
    ("How do I stop my dog from barking at night?", "How can I get my dog to stop barking at night?"),
    ("What are good exercises for lower back pain?", "Which exercises help with lower back pain?"),
    ("How do I improve my credit score?", "What can I do to raise my credit score?"),
    ("How do I brew cold brew coffee?", "What's the method for making cold brew coffee?"),
    ("Why is the sky blue?", "What makes the sky blue?"),
]


@pytest.mark.slow
def test_calibrate_refuses_every_pair_reported_wrong(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from evaluation.probes import default_embedder
    from semantic.rule.calibration_fit import CALIBRATION_TARGETS
    from semantic.rule.loading import load_rule
    from semantic.rule.profiles import ENGLISH

    # The pairs of the test above, and rewordings the verifier scores: hits a loose enough threshold serves.
    rows = [
        (f"How do I plant {kind} seeds in pots?", f"how do I plant {kind} seeds in pots", 1)
        for kind in range(40)
    ]
    rows += [(f"Is {n} a prime number?", f"Is {n + 1} a prime number?", 0) for n in range(40)]
    rows += [(stored, asked, 1) for stored, asked in VERIFIED_REWORDINGS]
    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text("".join(json.dumps({"a": a, "b": b, "label": label}) + "\n" for a, b, label in rows))
    stored, asked = "Where is the Eiffel Tower?", "Where is the Eiffel Tower located?"  # a hit reported wrong
    reported = {"a": stored, "b": asked, "label": 0, "kind": "feedback", "tenant": "alpha"}
    (tmp_path / "feedback.jsonl").write_text(json.dumps(reported) + "\n")
    monkeypatch.setenv("KVGATE_DATA_DIR", str(tmp_path))
    embedder = default_embedder()
    cosine = float((embedder.embed([stored]) * embedder.embed([asked])).sum())
    verifier = ENGLISH.verifier()

    def verdicts() -> list[bool]:
        """The served rule's verdict on the pair reported wrong, at every target the calibration fits."""
        return [
            load_rule(tmp_path, target, verifier).judge(asked, stored, cosine).hit
            for target in CALIBRATION_TARGETS
        ]

    left_out = CliRunner().invoke(app, ["calibrate", str(pairs), "--no-feedback"])
    assert left_out.exit_code == 0, left_out.output
    assert "feedback" not in json.loads((tmp_path / "calibration.json").read_text())["fitted_on"]
    assert any(verdicts())  # fitted on these pairs alone, the rule serves the pair

    result = CliRunner().invoke(app, ["calibrate", str(pairs)])  # the data dir's feedback.jsonl, by default
    assert result.exit_code == 0, result.output
    written = json.loads((tmp_path / "calibration.json").read_text())
    assert written["fitted_on"]["feedback"] == {"file": "feedback.jsonl", "pairs": 1, "wrong": 1}
    assert written["points"] and not any(verdicts())  # refused at every target
