"""What a lookup meets in a populated scope: stored texts, new wordings, paraphrase labels by group."""

from __future__ import annotations

import numpy as np

from semantic.pair_sets import LabelledPair
from semantic.scope_lookups import populated_scope, scope_lookups

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
