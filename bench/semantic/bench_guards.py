"""What each guard saves and what it costs, on every pair set: text only, no model, a few seconds.

    .venv/bin/python bench/semantic/bench_guards.py

A guard vetoes a pair; it never makes a hit. On a label-0 pair a veto is a wrong hit prevented (saved); on a
label-1 pair it is a true paraphrase refused (cost). Per guard: on `adversarial_dev.jsonl`, vetoes by `kind`;
on the reviewed Quora pairs and MRPC, vetoes among positives and among negatives. The rule's default guards
(`semantic/rule/calibration_fit.py`) are the ones whose cost on real paraphrases stays small against what they save.
"""

from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from evaluation.pair_sets import LabelledPair, load_pairs
from semantic.guards.near_duplicate import near_duplicate_reason
from semantic.guards.registry import ALL_GUARDS, GUARDS_BY_NAME, Guard, first_veto
from semantic.rule.calibration_fit import DEFAULT_GUARDS

DATA_DIR = Path(__file__).resolve().parents[3] / "shared" / "data"
SETS = ("qqp_dev_reviewed_6k.jsonl", "mrpc_train.jsonl", "qqp_dev.jsonl")


def main(argv: list[str] | None = None) -> int:
    adversarial = load_pairs(DATA_DIR / "adversarial_dev.jsonl")
    kinds = sorted({pair.kind for pair in adversarial if pair.kind is not None})
    print("## vetoes by kind on adversarial_dev.jsonl (label-0 kinds: saved; label-1 kinds: cost)\n")
    print("| kind | label | pairs | " + " | ".join(guard.name for guard in ALL_GUARDS) + " |")
    print("|---|---|---|" + "---|" * len(ALL_GUARDS))
    for kind in kinds:
        rows = [pair for pair in adversarial if pair.kind == kind]
        label = rows[0].label
        cells = [str(sum(vetoes(guard, pair) for pair in rows)) for guard in ALL_GUARDS]
        print(f"| {kind} | {label} | {len(rows)} | " + " | ".join(cells) + " |")
    negatives = [pair for pair in adversarial if pair.label == 0]
    positives = [pair for pair in adversarial if pair.label == 1]
    print(
        "| **all** | | | "
        + " | ".join(f"{share(guard, negatives)} / {share(guard, positives)}" for guard in ALL_GUARDS)
        + " |"
    )
    print("\n(**all**: share of label-0 pairs vetoed / share of label-1 pairs vetoed)\n")
    print("## vetoes among positives (cost) / negatives (saved), other sets\n")
    print("| set | pairs | " + " | ".join(guard.name for guard in ALL_GUARDS) + " |")
    print("|---|---|" + "---|" * len(ALL_GUARDS))
    for name in SETS:
        pairs = load_pairs(DATA_DIR / name)
        positives = [pair for pair in pairs if pair.label == 1]
        negatives = [pair for pair in pairs if pair.label == 0]
        cells = [f"{share(guard, positives)} / {share(guard, negatives)}" for guard in ALL_GUARDS]
        print(f"| {name} | {len(pairs)} | " + " | ".join(cells) + " |")
    print("\n## near-duplicate path: hits without the verifier, after the default guards\n")
    print("| set | pairs | hits | wrong hits | precision | recall | by reason |")
    print("|---|---|---|---|---|---|---|")
    guards = tuple(GUARDS_BY_NAME[name] for name in DEFAULT_GUARDS)
    for name in ("adversarial_dev.jsonl", *SETS):
        pairs = load_pairs(DATA_DIR / name)
        reasons = [
            near_duplicate_reason(pair.b, pair.a) if first_veto(pair.b, pair.a, guards) is None else None
            for pair in pairs
        ]
        hits = [pair for pair, reason in zip(pairs, reasons, strict=True) if reason is not None]
        wrong = [pair for pair in hits if pair.label == 0]
        positives = sum(pair.label for pair in pairs)
        counted = Counter(reason for reason in reasons if reason is not None)
        precision = f"{1 - len(wrong) / len(hits):.4f}" if hits else "—"
        print(
            f"| {name} | {len(pairs)} | {len(hits)} | {len(wrong)} | {precision} | {(len(hits) - len(wrong)) / positives:.3f} | {dict(counted)} |"
        )
        for pair in wrong[:5]:
            print(f"|  wrong: | {pair.a!r} | {pair.b!r} | | | | |")
    return 0


def vetoes(guard: Guard, pair: LabelledPair) -> bool:
    """The cache stores `a` and is asked `b`: the rule calls guards with (query, candidate) = (b, a)."""
    return guard.differs(pair.b, pair.a)


def share(guard: Guard, pairs: list[LabelledPair]) -> str:
    if not pairs:
        return "—"
    return f"{sum(vetoes(guard, pair) for pair in pairs) / len(pairs):.3f}"


if __name__ == "__main__":
    sys.exit(main())
