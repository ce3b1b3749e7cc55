"""The aspect guard: a query that keeps the stored prompt's words and asks for more is refused."""

from __future__ import annotations

import pytest

from semantic.guards.aspect_guards import aspect_differs, aspects_of, question_count


@pytest.mark.parametrize(
    ("stored", "asked"),
    [
        ("What is raman scattering?", "What is raman scattering used for?"),
        ("What is the cell membrane?", "What is the cell membrane? What are its functions?"),
        ("Where can I download Word Power Made Easy?", "Where can I download Word Power Made Easy for free?"),
        ("What are the symptoms of anemia?", "What are the symptoms and treatment of anemia?"),
        ("How do I renew a passport?", "How do I renew a passport and how much does it cost?"),
    ],
)
def test_an_added_aspect_or_question_is_vetoed(stored: str, asked: str) -> None:
    assert aspect_differs(asked, stored)


@pytest.mark.parametrize(
    ("stored", "asked"),
    [
        # The stored answer to the broader question covers the narrower one.
        ("What is the dark web? What happens there?", "What is the dark web?"),
        # The same aspect in other words.
        ("What does terraform plan do?", "Explain the purpose of the terraform plan command"),
        ("Why do we get goosebumps?", "What causes goosebumps on our skin?"),
        ("What are the uses of graphene?", "What is graphene used for?"),
        ("How do I reset my router?", "How can I reset my router?"),
        ("excel xlookup example", "Can you show me an example of how to use XLOOKUP in Excel?"),
    ],
)
def test_a_rewording_or_a_narrower_query_passes(stored: str, asked: str) -> None:
    assert not aspect_differs(asked, stored)


def test_aspects_and_questions_are_read_from_general_words() -> None:
    assert aspects_of("What are the pros and cons of Rust?") == {"benefit", "drawback"}
    assert aspects_of("Why is the sky blue?") == {"cause"}
    assert question_count("Hi? How do I bake bread?") == 1
    assert question_count("What is X? What are its uses?") == 2
