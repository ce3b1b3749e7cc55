"""The development sets' parts: leak-free across parts and files, the same on every run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from semantic.pair_sets import (
    ADVERSARIAL_FILE,
    QQP_FILE,
    REVIEWED_FILE,
    LabelledPair,
    file_part,
    held_out_texts,
    split_pairs,
    text_groups,
)

DATA_DIR = Path(__file__).resolve().parents[3] / "shared" / "data"


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


@pytest.mark.skipif(not (DATA_DIR / REVIEWED_FILE).is_file(), reason="no ../shared/data")
def test_the_development_sets_parts_share_no_text() -> None:
    for name in (REVIEWED_FILE, ADVERSARIAL_FILE):
        parts = {part: texts(file_part(DATA_DIR / name, part)) for part in ("train", "calibration", "test")}
        assert not parts["train"] & parts["calibration"] and not parts["train"] & parts["test"]
        assert not parts["calibration"] & parts["test"]
        # Each part large enough to place a 2% target (tens of hits) and to show it.
        assert min(len(file_part(DATA_DIR / name, part)) for part in parts) > 150
    held_out = held_out_texts(DATA_DIR)
    assert not held_out & texts(file_part(DATA_DIR / REVIEWED_FILE, "train"))
    assert texts(file_part(DATA_DIR / ADVERSARIAL_FILE, "test")) <= held_out
