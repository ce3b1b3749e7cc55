"""`WordSet` answers `in` exactly as a set of the same words would."""

from __future__ import annotations

import random

from semantic.guards import near_duplicate
from semantic.guards.word_set import WordSet


def test_membership_equals_a_set_of_the_same_words() -> None:
    rng = random.Random(7)
    letters = "abcdeéñßzあ東"
    words = {"".join(rng.choice(letters) for _ in range(rng.randint(1, 8))) for _ in range(3000)}
    words |= {"a", "ab", "abc", "b", "résumé", "naïve"}
    word_set = WordSet(words)
    probes = [*words, *(word + "a" for word in words), *(word[:-1] for word in words), "", "zzz", "東京"]
    assert len(word_set) == len(words)
    assert [probe in word_set for probe in probes] == [probe in words for probe in probes]
    assert 3 not in word_set and None not in word_set


def test_an_empty_set_holds_nothing() -> None:
    assert "a" not in WordSet([]) and "" not in WordSet([])


def test_the_english_vocabulary_tells_words_from_typos() -> None:
    known = near_duplicate._vocabulary()
    assert "receive" in known and "paternity" in known and "maternity" in known
    assert "recieve" not in known and "kubernets" not in known
