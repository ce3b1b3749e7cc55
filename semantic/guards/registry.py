"""The guards by name, and the guard set a rule runs before its verifier.

A `Guard` is a named check: `differs(query, candidate)` is True when the texts disagree on its feature (the
functions live by kind: `word_guards.py`, `edit_guards.py`, `task_guards.py`, `aspect_guards.py`,
`request_guards.py`). A calibration names the guards its rule applies (`GUARDS_BY_NAME`); a `GuardSet` is
those guards in order, then the profile's near-duplicate check: a pair no guard vetoes and that asks the same
thing in the same words is served without the verifier. Guards only veto; they know nothing of embeddings or
thresholds.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from semantic.guards.aspect_guards import aspect_differs
from semantic.guards.edit_guards import direction_swapped, opposite_swapped, unit_or_period_differs
from semantic.guards.request_guards import task_request_differs
from semantic.guards.task_guards import languages_differ, task_slots_differ
from semantic.guards.word_guards import (
    case_differs,
    entities_differ,
    negation_differs,
    numbers_differ,
    question_word_differs,
    word_swapped,
)

# Why a pair is the same question without a model (a few words, for logs), or None.
SameQuestion = Callable[[str, str], str | None]


@dataclass(frozen=True, slots=True)
class Guard:
    """A named check: `differs(query, candidate)` is True when the texts disagree on its feature."""

    name: str
    reason: str
    differs: Callable[[str, str], bool]


NUMBERS = Guard("numbers", "numbers differ", numbers_differ)
NEGATION = Guard("negation", "negation differs", negation_differs)
ENTITIES = Guard("entities", "names differ", entities_differ)
QUESTION_WORD = Guard("question_word", "question word differs", question_word_differs)
SWAP = Guard("swap", "one word swapped for another", word_swapped)
DIRECTION = Guard("direction", "direction or roles swapped", direction_swapped)
OPPOSITE = Guard("opposite", "a word swapped for its opposite", opposite_swapped)
UNITS = Guard("units", "units or periods differ", unit_or_period_differs)
LANGUAGES = Guard("languages", "another language", languages_differ)
TASK = Guard("task", "another form, format, tone or length of output", task_slots_differ)
CASE = Guard("case", "a word in another case, where case tells words apart", case_differs)
ASPECT = Guard("aspect", "asks for another aspect or a second question", aspect_differs)
TASK_REQUEST = Guard("task_request", "a task request against a question", task_request_differs)
# Every guard, the English ones first (those an English calibration chooses among, measured one by one in
# bench/semantic/bench_guards.py), then the one written for the six languages of the multilingual profile.
ALL_GUARDS: tuple[Guard, ...] = (
    NUMBERS, NEGATION, ENTITIES, QUESTION_WORD, SWAP, DIRECTION, OPPOSITE, UNITS, LANGUAGES, TASK, CASE, ASPECT,
    TASK_REQUEST,
)  # fmt: skip
GUARDS_BY_NAME = {guard.name: guard for guard in ALL_GUARDS}


@dataclass(frozen=True, slots=True)
class GuardSet:
    """What a rule checks before its verifier: `vetoes` in order, then `same_question` (a near-duplicate)."""

    vetoes: tuple[Guard, ...]
    same_question: SameQuestion

    @classmethod
    def named(cls, names: Iterable[str], same_question: SameQuestion) -> GuardSet:
        return cls(tuple(GUARDS_BY_NAME[name] for name in names), same_question)

    def veto(self, query: str, candidate: str) -> str | None:
        """The reason of the first guard that finds the texts differ, or None when all agree."""
        return first_veto(query, candidate, self.vetoes)

    def same(self, query: str, candidate: str) -> str | None:
        """Why the pair is the same question without the verifier, or None (ask after `veto`)."""
        return self.same_question(query, candidate)


def first_veto(query: str, candidate: str, guards: tuple[Guard, ...]) -> str | None:
    """The reason of the first guard that finds the texts differ, or None when all agree."""
    for guard in guards:
        if guard.differs(query, candidate):
            return guard.reason
    return None
