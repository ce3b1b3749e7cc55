"""Guards for a question that asks for more than, or another part of, what the other asks.

Quora's most confident wrong hits keep the subject and change the ask: "What is raman scattering?" / "What is
raman scattering used for?" (another aspect of the same subject), "What is the cell membrane? What are its
functions?" (a second question), "Where can I download Word Power Made Easy?" / "... for free" (a narrower
ask). A cross-encoder that has learnt rewordings passes them, since every word of the shorter text is in the
longer one. Each function here reads one such difference from general English word classes (written for
kvgate, not taken from a pairs file); which of them the rule applies is measured in
`bench/semantic/bench_guards.py`.
"""

from __future__ import annotations

import re

_TOKEN = re.compile(r"[a-z0-9]+")
# An aspect of a subject a question may ask about; words of one class ask the same thing ("uses" / "used for").
# A text naming a class the other does not asks for another part of the subject.
ASPECTS: dict[str, tuple[str, ...]] = {
    "use": ("used for", "uses of", "use of", "uses", "purpose of", "purpose", "application of",
            "applications", "good for", "useful for", "function of", "functions", "role of"),
    "benefit": ("benefits", "benefit of", "advantages", "advantage of", "pros"),
    "drawback": ("disadvantages", "disadvantage of", "drawbacks", "downsides", "cons", "side effects",
                 "risks of", "dangers of"),
    "cause": ("causes", "cause of", "caused by", "reason", "reasons", "what makes", "what made", "what led", "how come"),
    "effect": ("effects of", "effect of", "effects", "impact of", "impacts", "consequences"),
    "symptom": ("symptoms", "signs of"),
    "treatment": ("treatment", "treatments", "treat", "cure", "cured", "remedies", "remedy"),
    "history": ("history", "origin of", "origins"),
    "example": ("examples", "example"),
    "kinds": ("types of", "kinds of", "categories of"),
    "cost": ("cost", "costs", "price", "prices", "how much does", "how much is", "fee", "fees"),
    "duration": ("how long",),
}  # fmt: skip
_PATTERNS = {
    name: re.compile(r"\b(?:" + "|".join(re.escape(phrase) for phrase in phrases) + r")\b")
    for name, phrases in ASPECTS.items()
}
_WHAT_DOES_IT_DO = re.compile(
    r"\bwhat (?:does|do|did) (?!i |you |we |they |people |most )(?:\S+ ){1,6}do(?: in| to| for| with| on|$)"
)
_WHY = re.compile(r"\bwhy\b")
# "Free" as the price asked for, not "a free weekend" or "free speech".
_FREE = re.compile(
    r"\(free\)|\bfor free\b|\bfree of charge\b|\bfree (?:download|version|online)\b|\bdownload (?:\w+ )?free\b"
)
_JOINED_QUESTION = re.compile(
    r",?\s+and\s+(?:what|how|why|where|when|who|which)\s+(?:is|are|was|were|does|do|did|can|should|would)\b"
)
# A second question: a sentence ending in "?" after another sentence, that itself asks (starts with a question
# word or an auxiliary), so "Hi? How do I ..." is one question.
_QUESTION_OPENERS = frozenset(
    ["what", "why", "how", "when", "who", "whom", "whose", "which", "where", "is", "are", "was", "were", "do",
     "does", "did", "can", "could", "should", "would", "will", "has", "have", "may", "might"]
)  # fmt: skip


_REQUESTS = frozenset(
    ["tell", "explain", "describe", "list", "show", "give", "help", "please", "i", "can", "could"]
)
# The shorter text's words the longer may miss and still keep them (an article, a spelling).
_KEPT_WORDS_MISSING = 0.2
_STOPWORDS = frozenset(
    ["a", "an", "the", "is", "are", "was", "were", "be", "do", "does", "did", "of", "in", "on", "for", "to",
     "and", "or", "what", "how", "why", "which", "who", "where", "when", "i", "my", "me", "you", "your", "it",
     "its", "can", "could", "should", "would", "will", "this", "that", "these", "those", "some", "any", "with",
     "about", "there", "their", "they", "we", "our", "s", "get", "exactly", "actually", "really", "just",
     "please", "basically", "anyone", "someone", "tell", "know"]
)  # fmt: skip


def aspects_of(text: str) -> frozenset[str]:
    """The aspect classes a text names ("why" asks for a cause)."""
    lowered = _lowered(text)
    found = {name for name, pattern in _PATTERNS.items() if pattern.search(lowered)}
    if _WHY.search(lowered):
        found.add("cause")
    if _FREE.search(text.lower()):
        found.add("free")
    return frozenset(found)


def aspect_differs(query: str, candidate: str) -> bool:
    """One text keeps the other's words and names an aspect of the subject the other does not ("What is X?" /
    "What is X used for?", either way round), or the query adds a second question ("What is X? What are its
    functions?" asked, "What is X?" stored).

    A second question only counts when the query asks it: the stored answer to a broader question still
    answers a narrower one ("What is the dark web? What happens there?" stored, "What is the dark web?" asked),
    while the answer about X's uses does not say what X is. A rewording names an aspect in other words ("what
    does X do" / "the purpose of X"), so texts that do not share their words are left to the verifier.
    """
    added_question = question_count(query) > question_count(candidate)
    asked_aspects, stored_aspects = aspects_of(query), aspects_of(candidate)
    if _WHAT_DOES_IT_DO.search(_lowered(query)) or _WHAT_DOES_IT_DO.search(_lowered(candidate)):
        # "What does X do?" asks for X's use or function, and is also how one asks what X is.
        asked_aspects, stored_aspects = asked_aspects - {"use"}, stored_aspects - {"use"}
    if _is_keyword_query(query) or _is_keyword_query(candidate):
        # A terse query ("xfinity overage charge") asks for an aspect without naming its class.
        asked_aspects = stored_aspects = frozenset()
    if asked_aspects == stored_aspects and not added_question:
        return False
    asked, stored = _content_words(query), _content_words(candidate)
    if added_question and not stored_aspects - asked_aspects:
        return _keeps(stored, asked, more=False)
    return _keeps(stored, asked) or _keeps(asked, stored)


def _keeps(shorter: frozenset[str], longer: frozenset[str], more: bool = True) -> bool:
    """`longer` holds (nearly) every word of `shorter` (and, with `more`, other words too)."""
    kept = bool(shorter) and len(shorter - longer) <= len(shorter) * _KEPT_WORDS_MISSING
    return kept and (not more or bool(longer - shorter))


def question_count(text: str) -> int:
    """How many questions a text asks: sentences ending in "?" that open with a question word or an
    auxiliary (a text with no such sentence asks one), and one more for each question joined by "and"
    ("What is X, and what does Y stand for?")."""
    sentences = [part.strip() for part in re.split(r"(?<=\?)", text) if part.strip().endswith("?")]
    asking = sum(1 for sentence in sentences if _opens_question(sentence))
    joined = len(_JOINED_QUESTION.findall(text.lower()))
    return max(asking, 1) + joined


def _is_keyword_query(text: str) -> bool:
    """A search-style query: no question mark and no question or request opener."""
    words = _TOKEN.findall(text.lower())
    return "?" not in text and bool(words) and words[0] not in _QUESTION_OPENERS and words[0] not in _REQUESTS


def _lowered(text: str) -> str:
    return " ".join(_TOKEN.findall(text.lower()))


def _content_words(text: str) -> frozenset[str]:
    return frozenset(
        word[:-1] if word.endswith("s") and len(word) > 3 else word
        for word in _TOKEN.findall(text.lower())
        if word not in _STOPWORDS
    )


def _opens_question(sentence: str) -> bool:
    words = _TOKEN.findall(sentence.lower())
    return bool(words) and words[0] in _QUESTION_OPENERS
