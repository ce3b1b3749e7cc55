"""Guards for another language and for a task's form, format, tone or length."""

from __future__ import annotations

import pytest

from semantic.guards.task_guards import languages_differ, task_slots_differ


@pytest.mark.parametrize(
    ("first", "second", "differs"),
    [
        ('Translate "good morning" into French.', 'Translate "good morning" into German.', True),
        ("How do I read a CSV file in Python?", "How do I read a CSV file in Java?", True),
        ("Which is better, Python or Java?", "Java or Python: which is better?", False),
        ("How do I say thank you in Japanese?", "How do you say thanks?", False),  # one side: context
    ],
)
def test_languages(first: str, second: str, differs: bool) -> None:
    assert languages_differ(first, second) is differs
    assert languages_differ(second, first) is differs


@pytest.mark.parametrize(
    ("first", "second", "differs"),
    [
        ("Write a poem about the sea.", "Write a short story about the sea.", True),
        (
            "Write an email to my landlord about the leak.",
            "Write a formal email to my landlord about the leak.",
            True,
        ),
        ("Summarize the report as a table.", "Summarize the report as bullet points.", True),
        (
            "Write a funny toast for my brother's wedding.",
            "Write a humorous toast for my brother's wedding.",
            False,
        ),
        ("Give me a brief overview of the war.", "Give me a detailed overview of the war.", True),
        ("Can you please write a haiku about rain?", "Write a haiku about rain.", False),
        ("What is a good poem to read at a funeral?", "Which poem should I read at a funeral?", False),
        # Not a task request, and only one side names a tone: left to the verifier.
        ("What is the formal way to greet someone in Japan?", "How do you greet someone in Japan?", False),
    ],
)
def test_task_slots(first: str, second: str, differs: bool) -> None:
    assert task_slots_differ(first, second) is differs
    assert task_slots_differ(second, first) is differs
