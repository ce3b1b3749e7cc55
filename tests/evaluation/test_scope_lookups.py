"""What a lookup meets in a populated scope: stored texts, new wordings, paraphrase labels by group."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from evaluation.pair_sets import LabelledPair
from evaluation.scope_lookups import every_prompt_served, populated_scope, scope_lookups

PAIRS = [
    LabelledPair("reset my password", "how do I reset my password", 1, "rephrase"),
    LabelledPair("how do I reset my password", "password reset steps", 1, "keyword"),
    LabelledPair("change my email", "change my e-mail address", 1, "synonym"),
    LabelledPair("change my email", "delete my email", 0, "related"),
    LabelledPair("reset my password", "reset my username", 0, "entity"),
]


def test_every_a_is_stored_once_and_only_new_wordings_are_looked_up() -> None:
    scope = populated_scope(PAIRS)
    assert scope.stored == ("reset my password", "how do I reset my password", "change my email")
    # "how do I reset my password" is stored (an `a` of another pair): not a new wording.
    assert [pair.b for pair in scope.queries] == [
        "password reset steps",
        "change my e-mail address",
        "delete my email",
        "reset my username",
    ]
    # Positive pairs join groups transitively; a negative pair joins nothing.
    assert scope.is_paraphrase("password reset steps", "reset my password")
    assert not scope.is_paraphrase("delete my email", "change my email")
    assert not scope.is_paraphrase("reset my username", "reset my password")


def test_candidates_are_the_k_nearest_labelled_by_group() -> None:
    scope = populated_scope(PAIRS)
    stored = np.eye(3, dtype=np.float32)
    # Each query's nearest stored prompt, by construction: 1 (how do I...), 2, 2, 0.
    queries = np.array(
        [[0.5, 0.8, 0.3], [0.1, 0.2, 0.9], [0.0, 0.3, 0.95], [0.9, 0.4, 0.1]], dtype=np.float32
    )
    lookups = scope_lookups(scope, stored, queries, k=2)
    first, email, delete, username = lookups
    assert first.candidates == ("how do I reset my password", "reset my password")
    assert first.paraphrase == (True, True) and first.kind == "keyword"
    assert email.candidates[0] == "change my email" and email.paraphrase[0]
    assert delete.paraphrase == (False, False) and not delete.has_paraphrase
    assert username.candidates[0] == "reset my password" and username.paraphrase[0] is False
    assert first.has_paraphrase and email.has_paraphrase
    assert first.similarities[0] > first.similarities[1]


def test_every_prompt_is_looked_up_among_the_others_and_the_best_accepted_is_served() -> None:
    # Unit vectors: the password texts near each other, the email texts near each other.
    angles = {
        "reset my password": 0.0,
        "how do I reset my password": 0.1,
        "password reset steps": 0.2,
        "reset my username": 0.35,
        "change my email": 1.5,
        "change my e-mail address": 1.6,
        "delete my email": 1.45,
    }

    def embed(batch: list[str]) -> np.ndarray:
        return np.array([[np.cos(angles[t]), np.sin(angles[t])] for t in batch], dtype=np.float32)

    @dataclass
    class Judged:
        hit: bool
        score: float

    judged: list[tuple[str, str]] = []

    def judge_many(pairs: list[tuple[str, str]], cosines: list[float]) -> list[Judged]:
        judged.extend(pairs)
        # Accept a pair that shares its last word; score it by the candidate's length.
        return [Judged(a.split()[-1] == b.split()[-1], float(len(b))) for a, b in pairs]

    looked, served = every_prompt_served(PAIRS, embed, judge_many, k=2)
    assert looked == len(angles) == 7
    assert len(judged) == 7 * 2 and all(a != b for a, b in judged)  # never itself
    by_query = {hit.query: hit for hit in served}
    # "reset my password": its two nearest both end in "password"; the longer (higher score) is served.
    assert by_query["reset my password"].served == "how do I reset my password"
    assert by_query["reset my password"].paraphrase
    # "delete my email" / "change my email": accepted, but no positive pair joins them.
    assert not by_query["delete my email"].paraphrase


def test_a_set_of_one_text_looks_nothing_up() -> None:
    pair = LabelledPair("same", "same", 1, "rephrase")
    found = every_prompt_served(
        [pair], lambda batch: np.ones((len(batch), 1), np.float32), lambda p, c: [], 3
    )
    assert found == (1, [])
