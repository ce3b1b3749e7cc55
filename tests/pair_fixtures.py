"""The labelled pairs written for the tests (`tests/data/`, described in its README): what a test that needs
labelled pairs reads, so that it checks the same thing on every checkout. The development sets in
`../shared/data` live outside the repository and are read only by the measurement scripts (`bench/`); their
own properties (parts that share no text, no leak into training) are checked by
`bench/semantic/check_data_leaks.py`."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

FIXTURE_DIR = Path(__file__).resolve().parent / "data"
# English, 30 subjects no pair set of the project has: 60 questions, each with three rewordings (label 1) and
# three hard negatives (label 0: one change that changes the answer, or the same topic and another question).
ENGLISH_PAIRS = FIXTURE_DIR / "english_pairs.jsonl"
# zh, ja, ru, es, de, fr: 13 questions a language, each with three rewordings and two hard negatives, and 24
# pairs of one question in two languages (always 0), `lang` like the development set's.
MULTILINGUAL_PAIRS = FIXTURE_DIR / "multilingual_pairs.jsonl"


def as_development_set(fixture: Path, name: str, directory: Path) -> Path:
    """A copy of `fixture` named as a development set (`evaluation.pair_sets.SPLITS_BY_FILE`), so that
    `file_part` and `--part` split it as they split that set."""
    directory.mkdir(parents=True, exist_ok=True)
    return Path(shutil.copyfile(fixture, directory / name))


def fixture_texts(*paths: Path) -> set[str]:
    """Every `a` and `b` of these pairs files, stripped."""
    texts: set[str] = set()
    for path in paths:
        with path.open(encoding="utf-8") as lines:
            texts |= {json.loads(line)[key].strip() for line in lines if line.strip() for key in ("a", "b")}
    return texts
