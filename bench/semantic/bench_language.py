"""The language gate (`semantic/guards/language.py`): which prompts the English calibration may judge, per set.

    .venv/bin/python bench/semantic/bench_language.py

Text only, no model, a few seconds. On the English sets, an English prompt read as another language loses
its semantic hits (cost, per set); on `multilingual_dev.jsonl`, a prompt of another language read as English
would be judged by a rule that cannot read it (the wrong hits issue 31 found): per language, prompts read as
English and as their own language. Pairs: positive pairs of each English set that the gate refuses, and pairs
of `multilingual_dev.jsonl` the shipped rule would still judge (both sides read as English). Last: the
identifier's cost per text, uncached.
"""

from __future__ import annotations

import sys
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from evaluation.pair_sets import load_pairs
from semantic.guards.language import language_of, pair_refusal, warm
from semantic.rule.calibration import Calibration
from semantic.rule.profiles import SHIPPED_CALIBRATION

DATA_DIR = Path(__file__).resolve().parents[3] / "shared" / "data"
ENGLISH_SETS = ("adversarial_dev.jsonl", "qqp_dev_reviewed_6k.jsonl", "chatbot_dev.jsonl", "mrpc_train.jsonl")
MULTILINGUAL = "multilingual_dev.jsonl"


def main(argv: list[str] | None = None) -> int:
    warm()
    judged = Calibration.load(SHIPPED_CALIBRATION).languages
    print(f"shipped calibration judges: {', '.join(judged)}\n")
    print("| English set | prompts | read as another language | positive pairs | positives refused |")
    print("|---|---|---|---|---|")
    for name in ENGLISH_SETS:
        pairs = load_pairs(DATA_DIR / name)
        texts = {text for pair in pairs for text in (pair.a, pair.b)}
        other = Counter(language_of(text) for text in texts if language_of(text) != "en")
        positives = [pair for pair in pairs if pair.label == 1]
        refused = sum(pair_refusal(pair.b, pair.a, judged) is not None for pair in positives)
        top = ", ".join(f"{code} {count}" for code, count in other.most_common(4))
        print(
            f"| {name} | {len(texts)} | {sum(other.values())} ({sum(other.values()) / len(texts):.4f}; {top}) "
            f"| {len(positives)} | {refused} ({refused / max(len(positives), 1):.4f}) |"
        )
    pairs = load_pairs(DATA_DIR / MULTILINGUAL)
    by_language: dict[str, set[str]] = {}
    for pair in pairs:
        first, _, second = (pair.lang or "").partition("-")
        by_language.setdefault(first, set()).add(pair.a)
        by_language.setdefault(second or first, set()).add(pair.b)
    print(f"\n| {MULTILINGUAL} language | prompts | read as English | read as itself |")
    print("|---|---|---|---|")
    for code, texts in sorted(by_language.items()):
        as_english = sum(language_of(text) == "en" for text in texts)
        as_itself = sum(language_of(text) == code for text in texts)
        print(f"| {code} | {len(texts)} | {as_english} | {as_itself} |")
    still_judged = [pair for pair in pairs if pair_refusal(pair.b, pair.a, judged) is None]
    kinds = Counter(f"{pair.lang}/{pair.label}" for pair in still_judged)
    print(
        f"\npairs of {MULTILINGUAL} still judged by the shipped rule: {len(still_judged)} of {len(pairs)} {dict(kinds)}"
    )
    texts = [f"How do I reverse a list in Python? ({index})" for index in range(2000)]
    started = time.perf_counter()
    for text in texts:
        language_of.__wrapped__(text)
    print(f"identifier: {(time.perf_counter() - started) / len(texts) * 1e6:.1f} us a text (uncached)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
