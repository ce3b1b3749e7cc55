"""Guards on single words: numbers, negation, names, the question word, a swapped word, case.

A sentence embedding puts "What is 2+2?" next to "What is 2+3?" and "flights to Paris" next to "flights
to Rome". Each function here looks at one such feature and says whether the two texts disagree on it. They
only veto; they never make a hit, and know nothing of embeddings or thresholds. Each becomes a named `Guard`
in `semantic/guards/registry.py`; which of them a rule applies is its calibration's choice.
"""

from __future__ import annotations

import difflib
import re

# A comma joins digits only as a thousands separator ("1,000"); "(2,3)" is two numbers, as "(2, 3)" is.
_NUMBER = re.compile(r"\d+(?:\.\d+|,\d{3}(?!\d))*")
_EXPRESSION = re.compile(r"\d[\d.,]*(?:\s*[-+*/^x×÷=]\s*\d[\d.,]*)+")
# "x³" is "x^3": a superscript digit is the power the other text may write with a caret.
_SUPERSCRIPTS = str.maketrans({digit: f"^{value}" for value, digit in enumerate("⁰¹²³⁴⁵⁶⁷⁸⁹")})
_WORD = re.compile(r"[A-Za-z][A-Za-z'’]*")
_NEGATIONS = frozenset(
    [
        "not",
        "no",
        "never",
        "nothing",
        "nobody",
        "none",
        "neither",
        "nor",
        "cannot",
        "without",
        "dont",
        "doesnt",
        "didnt",
        "isnt",
        "arent",
        "wasnt",
        "werent",
        "wont",
        "wouldnt",
        "shouldnt",
        "couldnt",
        "cant",
        "havent",
        "hasnt",
        "hadnt",
        "aint",
    ]
)
_NUMBER_WORDS = {
    "zero": "0", "one": "1", "two": "2", "three": "3", "four": "4", "five": "5", "six": "6", "seven": "7",
    "eight": "8", "nine": "9", "ten": "10", "eleven": "11", "twelve": "12", "twenty": "20", "fifty": "50",
    "hundred": "100", "thousand": "1000", "million": "1000000", "billion": "1000000000", "twice": "2",
}  # fmt: skip
_QUESTION_WORDS = ("what", "why", "how", "when", "who", "which", "where")
# Capitalised words that are not names: sentence openers, pronouns, question words, weekdays do differ
# meaningfully but are caught by the other text containing them anyway.
_NOT_NAMES = frozenset(
    [
        "i",
        "i'm",
        "i've",
        "i'd",
        "i'll",
        "a",
        "an",
        "the",
        "is",
        "are",
        "was",
        "were",
        "do",
        "does",
        "did",
        "can",
        "could",
        "should",
        "would",
        "will",
        "may",
        "might",
        "must",
        "what",
        "why",
        "how",
        "when",
        "who",
        "whom",
        "whose",
        "which",
        "where",
        "if",
        "in",
        "on",
        "at",
        "for",
        "of",
        "to",
        "and",
        "or",
        "but",
        "my",
        "your",
        "our",
        "their",
        "his",
        "her",
        "its",
        "this",
        "that",
        "these",
        "those",
        "there",
        "here",
        "it",
        "he",
        "she",
        "we",
        "they",
        "you",
        "yes",
        "no",
        "not",
        "please",
        "hi",
        "hello",
    ]
)


# Words whose swap does not change what is asked ("which" / "what", "can" / "should", "best" / "good").
_FUNCTION_WORDS = _NOT_NAMES | frozenset(
    ["be", "been", "being", "shall", "have", "has", "had", "me", "us", "them", "one", "some", "any",
     "most", "more", "best", "good", "better", "s"]
)  # fmt: skip


def numbers_differ(query: str, candidate: str) -> bool:
    """The texts mention different numbers or arithmetic ("2+2" vs "2+3", "iPhone 6" vs "iPhone 7").

    The word "one" alone on one side is not a number the other lacks: it is most often "a" or the pronoun
    ("one Pro seat" / "a Pro license", "how would one revert"); "one" against "two" still differs.
    """
    first, second = _numbers(query), _numbers(candidate)
    if first == second:
        return False
    return not (first ^ second == {"1"} and _one_only_as_word(query if "1" in first else candidate))


def _one_only_as_word(text: str) -> bool:
    """ "1" comes from the word "one" only (not from a digit or an expression)."""
    return "one" in _words(text) and "1" not in {match.replace(",", "") for match in _NUMBER.findall(text)}


def negation_differs(query: str, candidate: str) -> bool:
    """One text is negated and the other is not (an odd number of negations against an even one)."""
    return _negation_count(query) % 2 != _negation_count(candidate) % 2


def entities_differ(query: str, candidate: str) -> bool:
    """A capitalised name in one text (not its first word) appears nowhere in the other, in any case."""
    return bool(_unmatched_names(query, candidate) or _unmatched_names(candidate, query))


def question_word_differs(query: str, candidate: str) -> bool:
    """Both texts open with a question word, and not the same one ("why ..." vs "how ...")."""
    first, second = _question_word(query), _question_word(candidate)
    return first is not None and second is not None and first != second


def word_swapped(query: str, candidate: str) -> bool:
    """The texts are the same but for one or two content words swapped for others ("... in Iceland" vs
    "... in Canada", "boy" vs "girl"): a different subject in the same frame. Function words, inflections
    ("achievement" / "achievements") and typos ("derick" / "derrick") are not swaps.
    """
    first, second = _tokens(query), _tokens(candidate)
    changes = [
        op
        for op in difflib.SequenceMatcher(None, first, second, autojunk=False).get_opcodes()
        if op[0] != "equal"
    ]
    if len(changes) != 1 or changes[0][0] != "replace":
        return False
    _, start, end, other_start, other_end = changes[0]
    if end - start > 2 or other_end - other_start > 2:
        return False
    removed = [word for word in first[start:end] if word not in _FUNCTION_WORDS]
    added = [word for word in second[other_start:other_end] if word not in _FUNCTION_WORDS]
    if not removed or not added:
        return False
    return not (len(removed) == 1 and len(added) == 1 and _same_word(removed[0], added[0]))


def case_differs(query: str, candidate: str) -> bool:
    """The texts differ only in the case of a word, and one of them writes that word in two cases inside a
    sentence, so case tells its words apart there ("an Aa x Aa cross" / "an Aa x aa cross"). Elsewhere case
    is noise ("python" / "Python", a capital opening a sentence) and the uncased models cannot see it either.
    """
    first, second = _cased_tokens(query), _cased_tokens(candidate)
    if len(first) != len(second) or [t.lower() for t, _ in first] != [t.lower() for t, _ in second]:
        return False
    ambiguous = _two_cases(first) | _two_cases(second)
    return any(
        one != other and one.lower() in ambiguous for (one, _), (other, _) in zip(first, second, strict=True)
    )


def _cased_tokens(text: str) -> list[tuple[str, bool]]:
    """Words and numbers as written, each with whether it opens a sentence."""
    tokens = []
    for match in re.finditer(r"[A-Za-z0-9]+", text):
        before = text[: match.start()].rstrip()
        tokens.append((match.group(), not before or before[-1] in ".?!:"))
    return tokens


def _two_cases(tokens: list[tuple[str, bool]]) -> set[str]:
    """The lower-cased forms written in two cases or more inside sentences of one text."""
    casings: dict[str, set[str]] = {}
    for token, opens in tokens:
        if not opens:
            casings.setdefault(token.lower(), set()).add(token)
    return {form for form, seen in casings.items() if len(seen) > 1}


def _numbers(text: str) -> frozenset[str]:
    text = text.translate(_SUPERSCRIPTS)
    # An expression ends at its last digit: "call 123-4567." and "call 123-4567" name the same number.
    expressions = {re.sub(r"\s+", "", match).rstrip(".,") for match in _EXPRESSION.findall(text)}
    digits = {match.replace(",", "") for match in _NUMBER.findall(text)}
    words = {_NUMBER_WORDS[word] for word in _words(text) if word in _NUMBER_WORDS}
    return frozenset(expressions | digits | words)


def _negation_count(text: str) -> int:
    return sum(1 for word in _words(text) if word.replace("'", "") in _NEGATIONS or word.endswith("n't"))


def _unmatched_names(text: str, other: str) -> set[str]:
    other_lower = other.lower()
    names = set()
    for index, match in enumerate(_WORD.finditer(text)):
        word = match.group()
        if index == 0 or not word[0].isupper() or word.lower() in _NOT_NAMES or len(word) < 2:
            continue
        if not re.search(rf"\b{re.escape(word.lower())}\b", other_lower):
            names.add(word.lower())
    return names


def _question_word(text: str) -> str | None:
    for word in _words(text)[:3]:
        if word in _QUESTION_WORDS:
            return word
    return None


def _words(text: str) -> list[str]:
    return [word.lower().replace("’", "'") for word in _WORD.findall(text)]


def _tokens(text: str) -> list[str]:
    return re.findall(r"[a-z0-9]+", text.lower().replace("’", "'"))


def _same_word(first: str, second: str) -> bool:
    """An inflection or a typo of the same word: one is a prefix of the other, or they are 80% alike."""
    if first.startswith(second) or second.startswith(first):
        return True
    return len(first) >= 4 and difflib.SequenceMatcher(None, first, second).ratio() >= 0.8
