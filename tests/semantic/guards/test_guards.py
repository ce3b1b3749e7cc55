"""Guards veto pairs that differ in numbers, negation, names, question word or one swapped word, and nothing else."""

from __future__ import annotations

import pytest

from semantic.guards.registry import ALL_GUARDS, first_veto
from semantic.guards.word_guards import (
    case_differs,
    entities_differ,
    negation_differs,
    numbers_differ,
    question_word_differs,
    word_swapped,
)


@pytest.mark.parametrize(
    ("query", "candidate"),
    [
        ("What is 2+2?", "What is 2+3?"),
        ("What is 2 + 2?", "What is 2*2?"),
        ("Is the iPhone 6 waterproof?", "Is the iPhone 7 waterproof?"),
        ("How to earn 1,000 dollars a day?", "How to earn 100 dollars a day?"),
        ("Best laptop under 500 dollars?", "Best laptop under five hundred dollars?"),
        ("What happened in 1947?", "What happened in India?"),
    ],
)
def test_numbers_differ(query: str, candidate: str) -> None:
    assert numbers_differ(query, candidate)
    assert numbers_differ(candidate, query)


@pytest.mark.parametrize(
    ("query", "candidate"),
    [
        ("What is 2+2?", "what is 2 + 2"),
        ("How to earn 1,000 dollars a day?", "How can I make 1000 dollars per day?"),
        ("What is love?", "What's love?"),
    ],
)
def test_numbers_agree(query: str, candidate: str) -> None:
    assert not numbers_differ(query, candidate)


def test_negation_parity() -> None:
    assert negation_differs("Why do people vote?", "Why don't people vote?")
    assert negation_differs("Can I not pay taxes?", "Can I pay taxes?")
    assert not negation_differs("Why can't I sleep?", "Why cannot I sleep at night?")
    assert not negation_differs("Why do people vote?", "What makes people vote?")


def test_entities_compare_names_case_insensitively() -> None:
    assert entities_differ("How do I get a visa for Canada?", "How do I get a visa for Australia?")
    assert not entities_differ("How do I learn Python?", "how do i learn python fast")
    # The first word is capitalised by grammar, not because it is a name.
    assert not entities_differ("Tips for learning to cook?", "Any advice for learning to cook?")


def test_question_word_only_when_both_ask() -> None:
    assert question_word_differs("Why is the sky blue?", "How is the sky blue?")
    assert not question_word_differs("Why is the sky blue?", "Why the sky is blue?")
    assert not question_word_differs("Why is the sky blue?", "Is the sky blue because of scattering?")


@pytest.mark.parametrize(
    ("query", "candidate"),
    [
        ("Good gifts to bring to a home in Iceland?", "Good gifts to bring to a home in Canada?"),
        ("What are must-read books for a boy?", "What are must-read books for a girl?"),
        ("Why is the cross an Apache symbol?", "Why is the crow an Apache symbol?"),
        ("Best phones gadgets nobody knows about?", "Best home gadgets nobody knows about?"),
    ],
)
def test_one_content_word_swapped(query: str, candidate: str) -> None:
    assert word_swapped(query, candidate) and word_swapped(candidate, query)


@pytest.mark.parametrize(
    ("query", "candidate"),
    [
        ("Which is the best phone?", "What is the best phone?"),  # function words
        ("How can we learn French?", "How should I learn French?"),
        ("What is my greatest achievement?", "What are my greatest achievements?"),  # inflection
        ("Who loves derick rose?", "Who loves derrick rose?"),  # typo
        ("How do I bake bread?", "How do I bake bread at home quickly?"),  # words added, none swapped
        ("What is a good laptop for students?", "Which tablet should a student buy for note taking?"),
        ("Why is the sky blue?", "Why is the sky blue?"),
    ],
)
def test_not_a_swap(query: str, candidate: str) -> None:
    assert not word_swapped(query, candidate)


def test_first_veto_names_the_reason() -> None:
    assert first_veto("What is 2+2?", "What is 2+3?", ALL_GUARDS) == "numbers differ"
    assert first_veto("How do I bake bread?", "How can I bake bread?", ALL_GUARDS) is None
    assert first_veto("What is 2+2?", "What is 2+3?", ()) is None


def test_case_differs_only_where_a_text_uses_case_to_tell_words_apart() -> None:
    cross = "What fraction of offspring are homozygous recessive in an Aa x {} cross?"
    assert case_differs(cross.format("Aa"), cross.format("aa"))
    assert case_differs("Is Co the same as CO here?", "Is CO the same as Co here?")
    # Case as noise: a name lower-cased, a capital opening a sentence, shouting.
    assert not case_differs("How do I install python?", "How do I install Python?")
    assert not case_differs(
        "Continuous delivery vs continuous deployment", "continuous delivery vs continuous deployment"
    )
    assert not case_differs("HOW DO I RESET MY PASSWORD", "how do i reset my password")
    # Other words differ: the verifier's call, not this guard's.
    assert not case_differs(cross.format("Aa"), "In an Aa x aa cross, what share is homozygous recessive?")
