"""The development sets' parts: leak-free across parts and files, the same on every run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from evaluation.pair_sets import (
    ADVERSARIAL_FILE,
    MULTILINGUAL_FILE,
    QQP_FILE,
    REVIEWED_FILE,
    LabelledPair,
    file_part,
    held_out_texts,
    load_pairs,
    split_pairs,
    text_groups,
)
from tests.pair_fixtures import ENGLISH_PAIRS, MULTILINGUAL_PAIRS, as_development_set


def write(path: Path, rows: list[tuple[str, str, int]]) -> Path:
    path.write_text("".join(json.dumps({"a": a, "b": b, "label": label}) + "\n" for a, b, label in rows))
    return path


def texts(pairs: list[LabelledPair]) -> set[str]:
    return {text for pair in pairs for text in (pair.a, pair.b)}


def test_wider_groups_keep_a_sample_with_the_texts_its_source_joins_to_them() -> None:
    # The sample holds (x, y) and (z, w); the source also joins y to z, so all four are one group.
    sample = [LabelledPair("x", "y", 1), LabelledPair("z", "w", 0)]
    source = [*sample, LabelledPair("y", "z", 1)]
    parts = split_pairs(sample, {"train": 0.5, "test": 0.5}, groups=text_groups(source))
    assert sorted(len(part) for part in parts.values()) == [0, 2]


def test_file_part_splits_the_reviewed_sample_by_the_quora_groups(tmp_path: Path) -> None:
    rows = [(f"q{index}", f"q{index + 1}", index % 2) for index in range(0, 400, 2)]
    write(tmp_path / REVIEWED_FILE, rows)
    # Quora chains every reviewed pair to the next: one group, so one part holds the whole sample.
    chained = rows + [(f"q{index + 1}", f"q{index + 2}", 0) for index in range(0, 398, 2)]
    write(tmp_path / QQP_FILE, chained)
    sizes = [len(file_part(tmp_path / REVIEWED_FILE, part)) for part in ("train", "calibration", "test")]
    assert sorted(sizes) == [0, 0, 200]


def test_file_part_refuses_a_file_that_has_no_parts(tmp_path: Path) -> None:
    path = write(tmp_path / "mine.jsonl", [("a", "b", 1)])
    assert len(file_part(path, "all")) == 1
    with pytest.raises(ValueError, match="not one of kvgate's development sets"):
        file_part(path, "test")
    with pytest.raises(ValueError, match="has parts"):
        file_part(write(tmp_path / ADVERSARIAL_FILE, [("a", "b", 1)]), "dev")


def test_the_development_sets_parts_share_no_text(tmp_path: Path) -> None:
    """The development sets' layout, built from the pairs written for the tests: half the English subjects as
    the reviewed Quora sample (with a Quora file that also joins each subject's two questions), the other half
    as the adversarial set, the multilingual pairs as the multilingual set. The sets themselves, in
    ../shared/data, are checked the same way (with parts of more than 150 pairs) by
    bench/semantic/check_data_leaks.py."""
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    english = ENGLISH_PAIRS.read_text(encoding="utf-8").splitlines(keepends=True)
    half = len(english) // 2  # the file lists subject by subject: 15 subjects each side
    (data_dir / REVIEWED_FILE).write_text("".join(english[:half]), encoding="utf-8")
    (data_dir / ADVERSARIAL_FILE).write_text("".join(english[half:]), encoding="utf-8")
    subjects: dict[str, dict[str, None]] = {}
    for line in english[:half]:
        row = json.loads(line)
        subjects.setdefault(row["domain"], {})[row["a"]] = None
    joined = [(first, second, 0) for first, second in (list(questions) for questions in subjects.values())]
    sample = load_pairs(data_dir / REVIEWED_FILE)
    write(data_dir / QQP_FILE, [(pair.a, pair.b, pair.label) for pair in sample] + joined)
    as_development_set(MULTILINGUAL_PAIRS, MULTILINGUAL_FILE, data_dir)
    for name in (REVIEWED_FILE, ADVERSARIAL_FILE, MULTILINGUAL_FILE):
        parts = {part: texts(file_part(data_dir / name, part)) for part in ("train", "calibration", "test")}
        assert not parts["train"] & parts["calibration"] and not parts["train"] & parts["test"]
        assert not parts["calibration"] & parts["test"]
        # Each part able to place a target and to show it: both labels in it.
        assert all({pair.label for pair in file_part(data_dir / name, part)} == {0, 1} for part in parts)
    held_out = held_out_texts(data_dir)
    assert not held_out & texts(file_part(data_dir / REVIEWED_FILE, "train"))
    assert texts(file_part(data_dir / ADVERSARIAL_FILE, "test")) <= held_out
    assert texts(file_part(data_dir / MULTILINGUAL_FILE, "calibration")) <= held_out
