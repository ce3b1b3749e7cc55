"""The same words in any script: two texts equal but for case, width, spaces and sentence punctuation.

The multilingual profile's near-duplicate (the English one, `semantic/guards/near_duplicate.py`, also reads
contractions, abbreviations and misspellings from English tables): such a pair is the same question, served
without the verifier once the guards have had their veto. Knows text only.
"""

from __future__ import annotations

import unicodedata

_SENTENCE_MARKS = frozenset("?!.,;:¿¡。、，．？！；：")


def same_words_reason(query: str, candidate: str) -> str | None:
    """The reason "same words" when the two texts read the same once folded (`bare`), else None."""
    return "same words" if bare(query) == bare(candidate) else None


def bare(text: str) -> str:
    """Case, width, spaces and sentence punctuation dropped: "怎样才能不晕车？" and "怎样才能不晕车 " read the
    same; a symbol that can carry meaning ("C#", "C++", "$") is kept."""
    folded = unicodedata.normalize("NFKC", text).casefold()
    return "".join(char for char in folded if not char.isspace() and char not in _SENTENCE_MARKS)
