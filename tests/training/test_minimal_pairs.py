"""The verifier's made-up training pairs: each maker changes what it says it changes, reproducibly."""

from __future__ import annotations

import random

from training.minimal_pairs import OTHER_ANSWER, SAME_ANSWER, minimal_pairs, task_pairs


def make(kind: str, text: str, seed: int = 0) -> str | None:
    """What the first maker of `kind` that applies makes of `text`."""
    makers = [maker for name, maker in SAME_ANSWER + OTHER_ANSWER if name == kind]
    assert makers, kind
    return next((made for maker in makers if (made := maker(text, random.Random(seed))) is not None), None)


def test_answer_changing_edits() -> None:
    assert make("direction", "How do I move files from Windows to Linux?") == (
        "How do I move files from Linux to Windows?"
    )
    assert make("unit", "How many calories do I burn walking 5 km?") in {
        f"How many calories do I burn walking 5 {unit}?" for unit in ("miles", "meters", "feet")
    }
    assert make("entity", "What is the best time to visit Japan?") != "What is the best time to visit Japan?"
    assert make("entity", "Is it safe to go out?") is None  # "go" is a word here, not the language
    assert make("comparative", "Which is the largest planet?") == "Which is the smallest planet?"
    assert make("negation", "Why can I see stars at night?") == "Why can't I see stars at night?"


def test_answer_keeping_edits() -> None:
    assert make("reorder", "How do I centre a div in CSS?") == "In CSS, how do I centre a div?"
    assert make("rephrase", "How do I bake bread?") in {
        "How can I bake bread?", "Tell me how to bake bread.", "Could you explain how to bake bread?",
        "What is the way to bake bread?", "How should I bake bread?",
    }  # fmt: skip
    assert make("abbreviation", "How do I set up a virtual private network at home?") == (
        "How do I set up a VPN at home?"
    )
    typo = make("typo", "Where should I travel in December?", seed=3)
    assert typo is not None and typo != "Where should I travel in December?"


def test_pairs_are_reproducible_and_both_labels_come_out() -> None:
    texts = ["How do I learn Python in 30 days?", "What is the capital of France?", "Why is the sky blue?"]
    first = minimal_pairs(texts, random.Random(7))
    assert first == minimal_pairs(texts, random.Random(7))
    assert {pair.label for pair in first} == {0, 1}
    tasks = task_pairs(random.Random(1), 40)
    assert len(tasks) == 40 and sum(pair.label for pair in tasks) == 20
    assert all(pair.a != pair.b for pair in first + tasks)
