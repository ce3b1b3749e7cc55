"""Minimal-edit guards: swapped direction, an opposite word, another unit or period; and what they let pass."""

from __future__ import annotations

import pytest

from semantic.guards.edit_guards import (
    conversion_reversed,
    direction_swapped,
    opposite_swapped,
    unit_or_period_differs,
)
from semantic.guards.registry import GUARDS_BY_NAME, first_veto
from semantic.rule.calibration import Calibration
from semantic.rule.calibration_fit import DEFAULT_GUARDS
from semantic.rule.profiles import SHIPPED_CALIBRATION


@pytest.mark.parametrize(
    ("query", "candidate"),
    [
        ("How do I redirect HTTP to HTTPS in nginx?", "How do I redirect HTTPS to HTTP in nginx?"),
        ("Convert a PDF into a Word file", "Convert a Word file into a PDF"),
        ("Is a cat faster than a dog?", "Is a dog faster than a cat?"),
        ("Flights from Paris to Rome in May", "Flights from Rome to Paris in May"),
        # roles exchanged around words that are not relations: who does what to whom
        ("What can a tenant do if the landlord breaks the lease?", "What can a landlord do if the tenant breaks the lease?"),
        ("Can I replace a 2-prong outlet with a 3-prong outlet?", "Can I replace a 3-prong outlet with a 2-prong outlet?"),
        ("What do people in Denver think of Seattle?", "What do people in Seattle think of Denver?"),
        ("Does a dog bite a man?", "Does a man bite a dog?"),
    ],
)  # fmt: skip
def test_a_swapped_direction_is_caught(query: str, candidate: str) -> None:
    assert direction_swapped(query, candidate) and direction_swapped(candidate, query)


@pytest.mark.parametrize(
    ("query", "candidate"),
    [
        ("In Python, how do I sort a list?", "How do I sort a list in Python?"),  # a clause moved whole
        ("How do I redirect HTTP to HTTPS?", "how do I redirect http to https"),  # the same text
        ("How do I go from Paris to Rome?", "How can I get from Paris to Rome?"),  # other words
        (
            "Is it worth insulating the walls or the attic first?",
            "Is it worth insulating the attic or the walls first?",
        ),
        (
            "Can you trade with other players in Catan when it is not your turn?",
            "In Catan, can you trade with other players when it is not your turn?",
        ),
        # two clauses put in another order (runs longer than a role's name)
        (
            "For a freelance invoice, what payment terms should I use, net 15 or net 30?",
            "Net 15 or net 30: what payment terms should I use for a freelance invoice?",
        ),
    ],
)
def test_reordering_or_rewording_is_not_a_swap(query: str, candidate: str) -> None:
    assert not direction_swapped(query, candidate)


@pytest.mark.parametrize(
    ("query", "candidate"),
    [
        # a reversal in other words (a wrong hit of the shipped rule on pairs written in new subjects)
        ("How do I convert a String to an integer in Rust?", "In Rust, what's the way to turn an integer into a String?"),
        ("How do I move files from Dropbox to Google Drive?", "transfer my files from Google Drive into Dropbox"),
        ("Switch my careers from teaching to nursing", "How can I change careers from nursing to teaching?"),
    ],
)  # fmt: skip
def test_a_reworded_reversal_is_caught(query: str, candidate: str) -> None:
    assert conversion_reversed(query, candidate) and conversion_reversed(candidate, query)
    assert direction_swapped(query, candidate)


@pytest.mark.parametrize(
    ("query", "candidate"),
    [
        ("How do I convert a list to a tuple?", "How can I turn lists into tuples in Python?"),  # same way
        ("convert km to miles", "how many miles is a kilometre"),  # one side says no direction
        ("Convert JSON to YAML and back", "How do I convert YAML to JSON and JSON to YAML?"),  # both ways
    ],
)
def test_the_same_conversion_in_other_words_is_not_a_reversal(query: str, candidate: str) -> None:
    assert not conversion_reversed(query, candidate)


@pytest.mark.parametrize(
    ("query", "candidate"),
    [
        ("Which planet is closest to the Sun?", "Which planet is farthest from the Sun?"),
        ("What is the cheapest flight to Tokyo?", "What is the most expensive flight to Tokyo?"),
        ("How do I upload photos to Google Drive?", "How do I download photos from Google Drive?"),
        ("Should I stretch before running?", "Should I stretch after running?"),
    ],
)
def test_an_opposite_word_is_caught(query: str, candidate: str) -> None:
    assert opposite_swapped(query, candidate) and opposite_swapped(candidate, query)


def test_both_sides_named_is_not_an_opposite() -> None:
    assert not opposite_swapped("What are the pros and cons of solar power?", "Solar power: cons and pros?")
    assert not opposite_swapped("What is the best laptop?", "Which laptop is the best one?")


@pytest.mark.parametrize(
    ("query", "candidate"),
    [
        ("How many km is a marathon?", "How many miles is a marathon?"),
        ("How much should I save per month?", "How much should I save per year?"),
        ("Set an alarm for 5am", "Set an alarm for 5 pm"),
        ("Bake at 180°C for how long?", "Bake at 180°F for how long?"),
    ],
)
def test_another_unit_or_period_is_caught(query: str, candidate: str) -> None:
    assert unit_or_period_differs(query, candidate) and unit_or_period_differs(candidate, query)


@pytest.mark.parametrize(
    ("query", "candidate"),
    [
        ("How many kilometres is a marathon?", "How many km is a marathon?"),  # one unit, two spellings
        ("I've tried for weeks. How do I unclog a drain?", "How do I unclog a drain?"),  # context, one side
        ("Am I eligible for a refund?", "Can I get a refund?"),  # "am", "ml", "hr" are not units as words
        ("What does HR do?", "What does ML do?"),
    ],
)
def test_the_same_or_one_sided_units_pass(query: str, candidate: str) -> None:
    assert not unit_or_period_differs(query, candidate)


def test_the_new_guards_are_named_and_shipped_on() -> None:
    assert {"direction", "opposite", "units"} <= set(DEFAULT_GUARDS)
    assert Calibration.load(SHIPPED_CALIBRATION).guards == DEFAULT_GUARDS
    guards = tuple(GUARDS_BY_NAME[name] for name in DEFAULT_GUARDS)
    assert first_veto("Is tea healthier than coffee?", "Is coffee healthier than tea?", guards) == (
        "direction or roles swapped"
    )
