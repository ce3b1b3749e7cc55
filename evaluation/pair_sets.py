"""Labelled pairs files: reading them and splitting kvgate's development sets leak-free.

A pairs file has one `{"a": ..., "b": ..., "label": 0|1}` per line (`kind` optional). The development sets
in `../shared/data` are split into parts by a hash of each text group (texts joined by pairs, transitively),
so that no text is in two parts and anyone re-running the split gets the same parts:

- `train`: what `training/train_verifier.py` may learn from;
- `calibration`: what `kvgate calibrate` fits the shipped thresholds on;
- `test`: what the figures in `docs/benchmarks.md` are measured on. Nothing is fitted or trained on it.

The reviewed Quora sample is drawn from `qqp_dev.jsonl`, so its groups are formed over both files: a
reviewed test pair's texts, and every text Quora joins to them, stay out of training.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

# Raw Quora labels: the old development split, kept for figures measured against Quora's own labels.
QQP_SPLIT = {"train": 0.70, "calibration": 0.15, "test": 0.15}
MRPC_SPLIT = {"train": 0.50, "test": 0.50}
# Reviewed Quora sample and the hand-written minimal pairs: labels aligned with the cache's rubric, so the
# calibration and test parts are large enough to place a 2% target with tens of hits.
DEV_SPLIT = {"train": 0.50, "calibration": 0.25, "test": 0.25}

QQP_FILE = "qqp_dev.jsonl"
REVIEWED_FILE = "qqp_dev_reviewed_6k.jsonl"
ADVERSARIAL_FILE = "adversarial_dev.jsonl"
MRPC_FILE = "mrpc_train.jsonl"
# Hand-written to the rubric: chatbot rewordings and hard negatives (English), and six languages.
CHATBOT_FILE = "chatbot_dev.jsonl"
MULTILINGUAL_FILE = "multilingual_dev.jsonl"
# The English rule's calibration reads these sets' `calibration` parts (bench/semantic/bench_rule.py, and the
# device trainer's checkpoint choice, training/export_device_bundle.py), named as their figures are.
CALIBRATION_SETS = (("reviewed", REVIEWED_FILE), ("adversarial", ADVERSARIAL_FILE), ("chatbot", CHATBOT_FILE))
# The sets whose populated scopes the calibration also fits on. Not the reviewed Quora sample: it holds many
# unlabelled duplicates of one question, so its lookups' nearest "wrong" candidates are mostly paraphrases
# no pair names (read off the highest-scored ones), which would count as wrong hits.
LOOKUP_CALIBRATION_SETS = ("adversarial", "chatbot")
SPLITS_BY_FILE = {
    QQP_FILE: QQP_SPLIT,
    REVIEWED_FILE: DEV_SPLIT,
    ADVERSARIAL_FILE: DEV_SPLIT,
    MRPC_FILE: MRPC_SPLIT,
    CHATBOT_FILE: DEV_SPLIT,
    MULTILINGUAL_FILE: DEV_SPLIT,
}


@dataclass(frozen=True, slots=True)
class LabelledPair:
    """One line of a pairs file: `label` is 1 when `b` may be answered with `a`'s response."""

    a: str
    b: str
    label: int
    kind: str | None = None  # what the pair tests ("direction", "typo", ...), when the file says
    lang: str | None = None  # the language ("zh"), or the two ("en-fr"), when the file says


def load_pairs(path: Path, limit: int | None = None) -> list[LabelledPair]:
    """Read a JSON Lines pairs file (`{"a": ..., "b": ..., "label": 0|1}` per line)."""
    pairs = []
    with path.open(encoding="utf-8") as lines:
        for number, line in enumerate(lines, start=1):
            if not line.strip():
                continue
            row = json.loads(line)
            if (
                row.get("label") not in (0, 1)
                or not isinstance(row.get("a"), str)
                or not isinstance(row.get("b"), str)
            ):
                raise ValueError(f"{path}:{number}: expected a, b (strings) and label (0 or 1)")
            kind, lang = row.get("kind"), row.get("lang")
            pairs.append(
                LabelledPair(
                    row["a"],
                    row["b"],
                    int(row["label"]),
                    kind if isinstance(kind, str) else None,
                    lang if isinstance(lang, str) else None,
                )
            )
            if limit is not None and len(pairs) >= limit:
                break
    return pairs


def text_groups(pairs: Iterable[LabelledPair]) -> dict[str, str]:
    """Each text of `pairs` -> the smallest text of its group (texts joined by pairs, transitively)."""
    parent: dict[str, str] = {}

    def root(text: str) -> str:
        parent.setdefault(text, text)
        while parent[text] != text:
            parent[text] = parent[parent[text]]
            text = parent[text]
        return text

    for pair in pairs:
        first, second = root(pair.a), root(pair.b)
        if first != second:
            parent[max(first, second)] = min(first, second)  # a root is always its group's smallest text
    return {text: root(text) for text in parent}


def split_pairs(
    pairs: Iterable[LabelledPair], fractions: dict[str, float], groups: dict[str, str] | None = None
) -> dict[str, list[LabelledPair]]:
    """Split pairs so that no text appears in two parts (pairs sharing a text form one group).

    A group goes to a part by a hash of its smallest text, so the split does not depend on the order
    of the file or on a random seed. `groups` (text -> group), when given, are wider groups formed over
    more pairs than these (a sample split like the file it was drawn from).
    """
    pairs = list(pairs)
    groups = groups if groups is not None else text_groups(pairs)
    names = list(fractions)
    bounds = []
    total = 0.0
    for name in names:
        total += fractions[name]
        bounds.append(total / sum(fractions.values()))
    parts: dict[str, list[LabelledPair]] = {name: [] for name in names}
    for pair in pairs:
        position = _unit_hash(groups[pair.a])
        part = next((name for name, bound in zip(names, bounds, strict=True) if position < bound), names[-1])
        parts[part].append(pair)
    return parts


def reviewed_parts(data_dir: Path) -> dict[str, list[LabelledPair]]:
    """The reviewed Quora sample split by groups formed over it and the whole Quora file it came from."""
    reviewed = load_pairs(data_dir / REVIEWED_FILE)
    quora = data_dir / QQP_FILE
    joined = reviewed + (load_pairs(quora) if quora.is_file() else [])
    return split_pairs(reviewed, DEV_SPLIT, groups=text_groups(joined))


def file_part(path: Path, part: str, limit: int | None = None) -> list[LabelledPair]:
    """`part` of a development pairs file (by its name), or the whole file for `part="all"`."""
    if part == "all":
        return load_pairs(path, limit)
    fractions = SPLITS_BY_FILE.get(path.name)
    if fractions is None:
        raise ValueError(
            f"{path.name} is not one of kvgate's development sets ({', '.join(SPLITS_BY_FILE)}): "
            "only those have parts; use --part all"
        )
    if part not in fractions:
        raise ValueError(f"{path.name} has parts {', '.join(fractions)}, not {part!r}")
    if path.name == REVIEWED_FILE:
        parts = reviewed_parts(path.parent)
    else:
        parts = split_pairs(load_pairs(path), fractions)
    return parts[part][:limit] if limit is not None else parts[part]


def held_out_texts(data_dir: Path) -> set[str]:
    """Every text in a calibration or test part of the development sets: training must not see them."""
    texts: set[str] = set()
    for name, fractions in SPLITS_BY_FILE.items():
        if name == QQP_FILE or not (data_dir / name).is_file():
            continue
        for part in fractions:
            if part != "train":
                texts.update(text for pair in file_part(data_dir / name, part) for text in (pair.a, pair.b))
    return texts


def _unit_hash(text: str) -> float:
    digest = hashlib.blake2b(text.encode("utf-8"), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2**64
