"""An exact set of words held as one sorted UTF-8 blob: `in` by binary search.

The English near-duplicate check knows ~130k words (`near_duplicate._vocabulary`). As a `frozenset` of `str`
they held 23.4 MB of a serving process for 1.06 MB of text (an object and a hash slot per word); here they
take the text plus four bytes a word. A lookup is ~17 comparisons of short byte strings, a few microseconds,
and the check asks about a handful of words per judged pair.
"""

from __future__ import annotations

from array import array
from collections.abc import Iterable


class WordSet:
    """`word in words` for a fixed set of words, answered exactly (byte for byte after UTF-8)."""

    def __init__(self, words: Iterable[str]) -> None:
        # UTF-8 keeps code-point order, so sorting the strings sorts their bytes.
        encoded = [word.encode("utf-8", "surrogatepass") for word in sorted(set(words))]
        self._blob = b"".join(encoded)
        self._ends = array("I")
        end = 0
        for word in encoded:
            end += len(word)
            self._ends.append(end)

    def __len__(self) -> int:
        return len(self._ends)

    def __contains__(self, word: object) -> bool:
        if not isinstance(word, str):
            return False
        key = word.encode("utf-8", "surrogatepass")
        low, high = 0, len(self._ends)
        while low < high:
            middle = (low + high) // 2
            if self._word(middle) < key:
                low = middle + 1
            else:
                high = middle
        return low < len(self._ends) and self._word(low) == key

    def _word(self, index: int) -> bytes:
        start = self._ends[index - 1] if index else 0
        return self._blob[start : self._ends[index]]
