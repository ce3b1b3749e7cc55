"""Leak checks on the development sets, which live beside the repository (`../shared/data`), not in it.

    .venv/bin/python bench/semantic/check_data_leaks.py [--data-dir ../shared/data]

The test suite checks the same properties on what the repository holds (tests/semantic/test_pair_sets.py,
tests/training/test_written_pairs.py), so that it checks the same thing on every checkout; this script checks
them on the sets themselves:

- the parts of the reviewed Quora sample and of the adversarial set share no text, each holds more than 150
  pairs (enough to place a 2% target with tens of hits, and to show it), no held-out text (a calibration or
  test part of any set) is in the reviewed sample's train part, and the adversarial test part is held out;
- no text of the written training pairs (training/data/) judges the rule: the multilingual ones are in no
  calibration or test part of `multilingual_dev.jsonl`, the English ones (case-folded) in no held-out part;
- no multilingual calibration pair (bench/semantic/data/ml_extra/) has a text of `multilingual_dev.jsonl`'s
  test part;
- no text of the pairs written for the tests (tests/data/) is a text of a development set.

Exits 0 when every check passes, 1 naming each leak, 2 when the data dir is missing (nothing was checked).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Iterable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from evaluation.pair_sets import (  # noqa: E402
    ADVERSARIAL_FILE,
    CHATBOT_FILE,
    MULTILINGUAL_FILE,
    REVIEWED_FILE,
    SPLITS_BY_FILE,
    LabelledPair,
    file_part,
    held_out_texts,
)

DATA_DIR = ROOT.parent / "shared" / "data"
REQUIRED = (REVIEWED_FILE, ADVERSARIAL_FILE, CHATBOT_FILE, MULTILINGUAL_FILE)
PARTS = ("train", "calibration", "test")
MIN_PART_PAIRS = 150
WRITTEN_DIR = ROOT / "training" / "data"
ML_CALIBRATION_DIR = ROOT / "bench" / "semantic" / "data" / "ml_extra"
TEST_PAIRS_DIR = ROOT / "tests" / "data"
SHOWN = 5  # leaked texts named per check

Check = Callable[[Path], list[str]]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", type=Path, default=DATA_DIR, help="where the development sets are")
    args = parser.parse_args(argv)
    missing = [name for name in REQUIRED if not (args.data_dir / name).is_file()]
    if missing:
        print(
            f"check_data_leaks: {args.data_dir} lacks {', '.join(missing)}: nothing was checked",
            file=sys.stderr,
        )
        return 2
    failed = 0
    for check in CHECKS:
        problems = check(args.data_dir)
        name = (check.__doc__ or check.__name__).strip()
        print(f"{'ok  ' if not problems else 'LEAK'} {name}")
        for problem in problems:
            print(f"     {problem}")
        failed += bool(problems)
    print(f"{len(CHECKS) - failed} of {len(CHECKS)} checks passed" + ("" if not failed else ": leaks above"))
    return 1 if failed else 0


def parts_share_no_text(data_dir: Path) -> list[str]:
    """The reviewed and adversarial sets' parts share no text, and each holds more than 150 pairs."""
    problems = []
    for name in (REVIEWED_FILE, ADVERSARIAL_FILE):
        parts = {part: file_part(data_dir / name, part) for part in PARTS}
        for index, first in enumerate(PARTS):
            for second in PARTS[index + 1 :]:
                problems += _shared(
                    f"{name}: {first} and {second}", texts(parts[first]), texts(parts[second])
                )
        problems += [
            f"{name}: {part} holds {len(pairs)} pairs, not more than {MIN_PART_PAIRS}"
            for part, pairs in parts.items()
            if len(pairs) <= MIN_PART_PAIRS
        ]
    return problems


def held_out_is_not_trained_on(data_dir: Path) -> list[str]:
    """No held-out text is in the reviewed train part; the adversarial test part is held out."""
    held_out = held_out_texts(data_dir)
    problems = _shared(
        f"held-out texts and {REVIEWED_FILE} train",
        held_out,
        texts(file_part(data_dir / REVIEWED_FILE, "train")),
    )
    not_held = texts(file_part(data_dir / ADVERSARIAL_FILE, "test")) - held_out
    if not_held:
        problems.append(
            f"{len(not_held)} texts of {ADVERSARIAL_FILE} test are not held out: {_some(not_held)}"
        )
    return problems


def written_pairs_judge_nothing(data_dir: Path) -> list[str]:
    """No written training text is in a calibration or test part (multilingual as written, English case-folded)."""
    judged = {
        text.strip()
        for part in ("calibration", "test")
        for text in texts(file_part(data_dir / MULTILINGUAL_FILE, part))
    }
    problems = _shared(
        f"{WRITTEN_DIR.name}/multilingual_written.jsonl and {MULTILINGUAL_FILE} calibration and test",
        judged,
        jsonl_texts([WRITTEN_DIR / "multilingual_written.jsonl"]),
    )
    english = {text.casefold() for text in jsonl_texts([WRITTEN_DIR / "english_written.jsonl"])}
    problems += _shared(
        f"{WRITTEN_DIR.name}/english_written.jsonl and the held-out parts",
        {text.strip().casefold() for text in held_out_texts(data_dir)},
        english,
    )
    return problems


def calibration_pairs_judge_nothing(data_dir: Path) -> list[str]:
    """No multilingual calibration pair (ml_extra) has a text of the multilingual test part."""
    tested = {text.strip() for text in texts(file_part(data_dir / MULTILINGUAL_FILE, "test"))}
    return _shared(
        f"{ML_CALIBRATION_DIR.name}/ and {MULTILINGUAL_FILE} test",
        tested,
        jsonl_texts(sorted(ML_CALIBRATION_DIR.glob("*.jsonl"))),
    )


def fixtures_are_not_development_texts(data_dir: Path) -> list[str]:
    """No text of the pairs written for the tests (tests/data/) is a text of a development set (case-folded)."""
    written = {text.casefold() for text in jsonl_texts(sorted(TEST_PAIRS_DIR.glob("*.jsonl")))}
    problems = []
    for name in SPLITS_BY_FILE:
        if (data_dir / name).is_file():
            development = {text.casefold() for text in jsonl_texts([data_dir / name])}
            problems += _shared(f"tests/data/ and {name}", development, written)
    return problems


CHECKS: tuple[Check, ...] = (
    parts_share_no_text,
    held_out_is_not_trained_on,
    written_pairs_judge_nothing,
    calibration_pairs_judge_nothing,
    fixtures_are_not_development_texts,
)


def texts(pairs: Iterable[LabelledPair]) -> set[str]:
    return {text for pair in pairs for text in (pair.a, pair.b)}


def jsonl_texts(paths: Iterable[Path]) -> set[str]:
    """Every `a` and `b` of these pairs files, stripped."""
    found: set[str] = set()
    for path in paths:
        with path.open(encoding="utf-8") as lines:
            found |= {json.loads(line)[key].strip() for line in lines if line.strip() for key in ("a", "b")}
    return found


def _shared(what: str, first: set[str], second: set[str]) -> list[str]:
    both = first & second
    return [f"{what} share {len(both)} texts: {_some(both)}"] if both else []


def _some(found: set[str]) -> str:
    shown = sorted(found)[:SHOWN]
    return "; ".join(repr(text) for text in shown) + (" ..." if len(found) > SHOWN else "")


if __name__ == "__main__":
    raise SystemExit(main())
