"""Near-duplicates: two prompts that ask the same thing in the same words, give or take what carries no meaning.

Case and punctuation, politeness and interjections at either end ("Quick question: ... Thanks!"), "please"
anywhere, contractions ("what's" / "what is"), hyphens ("multi-factor" / "multi factor"), a known abbreviation
against its expansion, plural too ("EIN" / "employer identification number", "KPIs" / "key performance
indicators"), a listed word for the same thing ("permitted" / "allowed", `semantic/guards/word_tables.py`), up to three
misspelt or differently spelt words ("recieve" / "receive", "colour" / "color"), and a clause moved whole
from one end to the other ("In Python, how do I ...?" / "How do I ... in Python?"). Such pairs hit without
the verifier, after the guards have had their veto (`semantic/rule/calibrated_rule.py`).

The tables are general English, written for kvgate (not taken from any pairs file). Knows text only: no
model, no thresholds.
"""

from __future__ import annotations

import functools
import re
import unicodedata

import regex

from semantic.guards.word_set import WordSet
from semantic.guards.word_tables import ALL_ABBREVIATIONS, SYNONYMS

# Words (any script), and every symbol as a token of its own: "~" / "%", "()" / "[]" and "=" / "==" ask
# different things. Only sentence punctuation and quotes are dropped.
_TOKEN = re.compile(r"\w+(?:'\w+)?|[^\w\s.,?!;:'\"’“”‘]")
_LEADING: tuple[tuple[str, ...], ...] = (
    ("quick", "question"), ("question",), ("please", "help"), ("hey", "there"), ("hi", "there"), ("hello",),
    ("hey",), ("hi",), ("hiya",), ("so",), ("ok", "so"), ("okay", "so"), ("ok",), ("okay",), ("well",),
    ("um",), ("uh",), ("hmm",), ("just", "wondering"), ("dear", "assistant"),
)  # fmt: skip
_TRAILING: tuple[tuple[str, ...], ...] = (
    ("thank", "you", "in", "advance"), ("thanks", "in", "advance"), ("thank", "you", "so", "much"),
    ("thank", "you"), ("thanks", "a", "lot"), ("thanks",), ("thx",), ("cheers",), ("please",), ("pls",),
    ("plz",), ("any", "help", "appreciated"), ("appreciate", "it"),
)  # fmt: skip
_ANYWHERE = frozenset(["please", "pls", "plz", "kindly"])
_CONTRACTIONS = {
    "what's": "what is", "where's": "where is", "who's": "who is", "how's": "how is", "when's": "when is",
    "why's": "why is", "that's": "that is", "there's": "there is", "it's": "it is", "i'm": "i am",
    "i've": "i have", "you're": "you are", "we're": "we are", "they're": "they are", "can't": "can not",
    "cannot": "can not", "won't": "will not", "don't": "do not", "doesn't": "does not", "didn't": "did not",
    "isn't": "is not", "aren't": "are not", "wasn't": "was not", "weren't": "were not",
    "shouldn't": "should not", "couldn't": "could not", "wouldn't": "would not", "i'd": "i would",
    "i'll": "i will", "let's": "let us", "whats": "what is", "dont": "do not", "doesnt": "does not",
    "didnt": "did not", "isnt": "is not", "cant": "can not", "wouldnt": "would not", "shouldnt": "should not",
}  # fmt: skip
_MIN_TYPO_LENGTH = 5
# More misspelt words than this in one question is another question, or noise: the verifier's call.
_MAX_TYPOS = 3
_HYPHEN = re.compile(r"(?<=\w)-(?=\w)")
# Typos are read in Latin-script words only: in Chinese or Japanese a `\w+` run is a whole clause and one
# differing character another word ("最长" / "最短", longest / shortest); the vocabulary below is English.
_LATIN_WORD = regex.compile(r"\p{Latin}+")
# Ways to open a "how do I" question that ask the same thing (the rubric: "How do I..." / "Tell me how to...").
# Each is read as "how do i"; longest first, so that "can you tell me how to" is not read as "tell me how to".
_HOW_DO_I: tuple[tuple[str, ...], ...] = tuple(
    sorted(
        (tuple(phrase.split()) for phrase in (
            "how can i", "how should i", "how could i", "how would i", "how to", "how do you",
            "tell me how to", "tell me how i can", "can you tell me how to", "could you tell me how to",
            "can you explain how to", "could you explain how to", "explain how to", "what is the way to",
            "what is the best way to", "what is a good way to", "what are the steps to", "show me how to",
        )),
        key=len,
        reverse=True,
    )
)  # fmt: skip
# British -> American spellings, as suffix (or infix) rewrites: a word pair that one of them maps onto the
# other is the same word ("colour" / "color", "organise" / "organize", "centre" / "center").
_SPELLINGS = (
    ("our", "or"), ("ours", "ors"), ("ise", "ize"), ("ised", "ized"), ("ising", "izing"), ("isation", "ization"),
    ("yse", "yze"), ("ysed", "yzed"), ("tre", "ter"), ("tres", "ters"), ("ogue", "og"), ("ence", "ense"),
    ("lled", "led"), ("lling", "ling"), ("ller", "ler"), ("grey", "gray"), ("mme", "m"), ("rol", "roll"),
    ("rolment", "rollment"), ("rols", "rolls"), ("fil", "fill"), ("filment", "fillment"), ("fils", "fills"),
)  # fmt: skip
# ... and the classical digraphs: "anaemia" / "anemia", "haemoglobin", "oestrogen", "paediatric", "aesthetic".
_DIGRAPHS = (("ae", "e"), ("oe", "e"))
# A noun and its plural are the same word to the rubric ("steakhouse" / "steakhouses"), in words this long.
_MIN_PLURAL_STEM = 5
_SYNONYM_OF: dict[tuple[str, ...], tuple[str, ...]] = {
    tuple(member.split()): tuple(group[0].split()) for group in SYNONYMS for member in group
}
_LONGEST_SYNONYM = max(len(phrase) for phrase in _SYNONYM_OF)


def near_duplicate_reason(query: str, candidate: str) -> str | None:
    """Why the two texts ask the same thing without a model (a few words, for logs), or None."""
    if _tokens(query) == _tokens(candidate):
        return "same text"
    first, second = _core(query), _core(candidate)
    if not first or not second:
        return None
    if first == second:
        return "same words"
    if sorted(first) == sorted(second) and _rotated(first, second):
        return "a clause moved"
    if (spelt := _spelt_differently(first, second)) is not None:
        return spelt
    first, second = _synonyms_read(first), _synonyms_read(second)
    if first == second:
        return "words for the same thing"
    return _spelt_differently(first, second)


def _spelt_differently(first: list[str], second: list[str]) -> str | None:
    """Word for word the same but for up to `_MAX_TYPOS` misspelt or British/American-spelt words."""
    if len(first) != len(second):
        return None
    differing = [(one, other) for one, other in zip(first, second, strict=True) if one != other]
    if not 1 <= len(differing) <= _MAX_TYPOS:
        return None
    if not all(_spelling_variant(*pair) or _misspelt(*pair) for pair in differing):
        return None
    return (
        "one word spelt differently" if len(differing) == 1 else f"{len(differing)} words spelt differently"
    )


def _tokens(text: str) -> list[str]:
    return _TOKEN.findall(text.lower().replace("’", "'"))


def _core(text: str) -> list[str]:
    """Lower-case words, contractions and abbreviations expanded, filler at either end and "please" dropped."""
    words: list[str] = []
    for token in _tokens(_HYPHEN.sub(" ", text)):
        expansion = _CONTRACTIONS.get(token) or _abbreviation_expanded(token)
        words.extend(expansion.split() if expansion else [token])
    words = [word for word in words if word not in _ANYWHERE]
    for phrase in _HOW_DO_I:
        if tuple(words[: len(phrase)]) == phrase and len(words) > len(phrase):
            words = ["how", "do", "i", *words[len(phrase) :]]
            break
    changed = True
    while changed and words:
        changed = False
        for phrase in _LEADING:
            if tuple(words[: len(phrase)]) == phrase and len(words) > len(phrase):
                words, changed = words[len(phrase) :], True
        for phrase in _TRAILING:
            if tuple(words[-len(phrase) :]) == phrase and len(words) > len(phrase):
                words, changed = words[: -len(phrase)], True
    return words


def _abbreviation_expanded(token: str) -> str | None:
    """An abbreviation's expansion; a plural one ("kpis") gives the plural expansion."""
    if (expansion := ALL_ABBREVIATIONS.get(token)) is not None:
        return expansion
    singular = ALL_ABBREVIATIONS.get(token[:-1]) if len(token) > 3 and token.endswith("s") else None
    if singular is None:
        return None
    return singular if singular.endswith("s") else singular + "s"


def _synonyms_read(words: list[str]) -> list[str]:
    """Each listed word or phrase read as the first member of its group, longest phrase first."""
    read: list[str] = []
    index = 0
    while index < len(words):
        for length in range(_LONGEST_SYNONYM, 0, -1):
            canonical = _SYNONYM_OF.get(tuple(words[index : index + length]))
            if canonical is not None:
                read.extend(canonical)
                index += length
                break
        else:
            read.append(words[index])
            index += 1
    return read


def _rotated(first: list[str], second: list[str]) -> bool:
    """`second` is `first` with a run of words moved from one end to the other."""
    return any(first[shift:] + first[:shift] == second for shift in range(1, len(first)))


def _spelling_variant(first: str, second: str) -> bool:
    """British and American spellings, singular and plural, or accented and plain forms of one word."""
    for one, other in ((first, second), (second, first)):
        if any(
            one.endswith(british) and one[: -len(british)] + american == other
            for british, american in _SPELLINGS
        ):
            return True
        if len(other) >= _MIN_PLURAL_STEM and one in (other + "s", other + "es"):
            return True
        if any(
            one[:start] + plain + one[start + len(digraph) :] == other
            for digraph, plain in _DIGRAPHS
            for start in range(len(one))
            if one.startswith(digraph, start)
        ):
            return True
    return first != second and _accents_dropped(first) == _accents_dropped(second)


def _accents_dropped(word: str) -> str:
    return "".join(char for char in unicodedata.normalize("NFKD", word) if not unicodedata.combining(char))


def _misspelt(first: str, second: str) -> bool:
    """One of the words is not a word (`_vocabulary`) and is one edit from the other: "recieve" / "receive"
    is a typo; "desert" / "dessert", "angle" / "angel" and "paternity" / "maternity" are two words."""
    if not (first.isalpha() and second.isalpha()):  # "ain't" / "amn't", "v2" / "v3": not typos
        return False
    if not (_LATIN_WORD.fullmatch(first) and _LATIN_WORD.fullmatch(second)):
        return False
    known = _vocabulary()
    if first in known and second in known:
        return False
    # Two unknown words (technical terms, names): a letter changed at the start is another prefix, so another
    # word ("probiotics" / "prebiotics"); further in, a typo ("kubernets" / "kubernetes").
    if first not in known and second not in known and _changed_near_start(first, second):
        return False
    return _one_edit(first, second)


def _changed_near_start(first: str, second: str, letters: int = 3) -> bool:
    """One letter replaced by another within the first `letters` ("pro" / "pre"); two neighbours swapped is a
    typo wherever it is ("ngnix" / "nginx")."""
    if len(first) != len(second):
        return False
    differ = [index for index, (one, other) in enumerate(zip(first, second, strict=True)) if one != other]
    return len(differ) == 1 and differ[0] < letters


def warm() -> None:
    """Read the vocabulary now (at rule load, off the event loop), not on the first lookup that needs it."""
    _vocabulary()


@functools.cache
def _vocabulary() -> WordSet:
    """English words: the whole words of the packaged MiniLM's WordPiece vocabulary (~22k words and names),
    and pyspellchecker's English word list (~160k words, common misspellings left out of it). With MiniLM's
    alone, a rarer word one letter from a common one read as its misspelling: "Is paternity leave paid?" was
    served "Is maternity leave paid?" (chatbot_dev test part, in a populated scope)."""
    from spellchecker import SpellChecker

    from semantic.embedding.embedder_source import packaged_model_dir

    lines = (packaged_model_dir() / "vocab.txt").read_text(encoding="utf-8").splitlines()
    words = {line for line in lines if line.isalpha() and not line.startswith("##")}
    words.update(word for word in SpellChecker(language="en").word_frequency.dictionary if word.isalpha())
    return WordSet(words)  # 23.4 MB as a frozenset of str, ~1.6 MB so (semantic/guards/word_set.py)


def _one_edit(first: str, second: str) -> bool:
    """One insertion, deletion, substitution or swap of neighbours, in words long enough that one letter
    rarely makes another word; never between two numbers."""
    if min(len(first), len(second)) < _MIN_TYPO_LENGTH or first.isdigit() or second.isdigit():
        return False
    if abs(len(first) - len(second)) > 1:
        return False
    if len(first) == len(second):
        differ = [index for index, (one, other) in enumerate(zip(first, second, strict=True)) if one != other]
        if len(differ) == 1:
            return True
        swapped = len(differ) == 2 and differ[1] == differ[0] + 1
        return swapped and first[differ[0]] == second[differ[1]] and first[differ[1]] == second[differ[0]]
    shorter, longer = sorted((first, second), key=len)
    return any(longer[:index] + longer[index + 1 :] == shorter for index in range(len(longer)))
