"""Near-duplicates: two prompts that ask the same thing in the same words, give or take what carries no meaning.

Case and punctuation, politeness and interjections at either end ("Quick question: ... Thanks!"), "please"
anywhere, contractions ("what's" / "what is"), a known abbreviation against its expansion ("EIN" / "employer
identification number"), one misspelt or differently spelt word ("recieve" / "receive", "colour" / "color"),
and a clause moved whole from one end to the other ("In Python, how do I ...?" / "How do I ... in Python?").
Such pairs hit without the verifier, after the guards have had their veto (`semantic/rule.py`).

The tables here are general English, written for this module (not taken from any pairs file). Knows text
only: no model, no thresholds.
"""

from __future__ import annotations

import functools
import re

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
# Common abbreviations and what they stand for; both sides are compared in the expanded form.
ABBREVIATIONS = {
    "ai": "artificial intelligence", "ml": "machine learning", "hr": "human resources",
    "ein": "employer identification number", "llc": "limited liability company", "ssn": "social security number",
    "ira": "individual retirement account", "apr": "annual percentage rate", "roi": "return on investment",
    "ceo": "chief executive officer", "cfo": "chief financial officer", "cto": "chief technology officer",
    "faq": "frequently asked questions", "diy": "do it yourself", "eta": "estimated time of arrival",
    "asap": "as soon as possible", "fyi": "for your information", "pto": "paid time off",
    "vpn": "virtual private network", "dns": "domain name system",
    "url": "uniform resource locator", "html": "hypertext markup language", "css": "cascading style sheets",
    "api": "application programming interface", "sql": "structured query language", "os": "operating system",
    "cpu": "central processing unit", "gpu": "graphics processing unit", "ram": "random access memory",
    "ssd": "solid state drive", "hdd": "hard disk drive", "usb": "universal serial bus",
    "lan": "local area network", "wan": "wide area network", "ssh": "secure shell", "ftp": "file transfer protocol",
    "pdf": "portable document format", "gps": "global positioning system", "tv": "television",
    "pc": "personal computer", "ui": "user interface", "ux": "user experience", "ide": "integrated development environment",
    "json": "javascript object notation", "xml": "extensible markup language", "2fa": "two factor authentication",
    "mfa": "multi factor authentication", "sso": "single sign on", "crm": "customer relationship management",
    "erp": "enterprise resource planning", "kpi": "key performance indicator", "okr": "objectives and key results",
    "b2b": "business to business", "seo": "search engine optimization", "hoa": "homeowners association",
    "hvac": "heating ventilation and air conditioning", "rpm": "revolutions per minute", "mpg": "miles per gallon",
    "atm": "automated teller machine", "dob": "date of birth",
    "id": "identification", "dmv": "department of motor vehicles", "irs": "internal revenue service",
    "gdp": "gross domestic product", "bmi": "body mass index", "adhd": "attention deficit hyperactivity disorder",
    "ocd": "obsessive compulsive disorder", "ptsd": "post traumatic stress disorder", "cpr": "cardiopulmonary resuscitation",
    "icu": "intensive care unit", "otc": "over the counter", "uti": "urinary tract infection",
    "ibs": "irritable bowel syndrome", "std": "sexually transmitted disease", "dna": "deoxyribonucleic acid",
    "nasa": "national aeronautics and space administration", "eu": "european union",
    "uk": "united kingdom", "usa": "united states of america", "nyc": "new york city",
    "wfh": "work from home", "ooo": "out of office", "eod": "end of day",
    "ev": "electric vehicle", "wifi": "wi fi", "4wd": "four wheel drive",
    "awd": "all wheel drive", "tbd": "to be determined",
    "aka": "also known as", "vs": "versus", "approx": "approximately", "govt": "government",
}  # fmt: skip
_MIN_TYPO_LENGTH = 5
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
    ("lled", "led"), ("lling", "ling"), ("ller", "ler"), ("grey", "gray"), ("mme", "m"),
)  # fmt: skip


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
    if len(first) == len(second):
        differing = [(one, other) for one, other in zip(first, second, strict=True) if one != other]
        if len(differing) == 1 and (_spelling_variant(*differing[0]) or _misspelt(*differing[0])):
            return "one word spelt differently"
    return None


def _tokens(text: str) -> list[str]:
    return _TOKEN.findall(text.lower().replace("’", "'"))


def _core(text: str) -> list[str]:
    """Lower-case words, contractions and abbreviations expanded, filler at either end and "please" dropped."""
    words: list[str] = []
    for token in _tokens(text):
        expansion = _CONTRACTIONS.get(token) or ABBREVIATIONS.get(token)
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


def _rotated(first: list[str], second: list[str]) -> bool:
    """`second` is `first` with a run of words moved from one end to the other."""
    return any(first[shift:] + first[:shift] == second for shift in range(1, len(first)))


def _spelling_variant(first: str, second: str) -> bool:
    """British and American spellings of one word."""
    for british, american in _SPELLINGS:
        for one, other in ((first, second), (second, first)):
            if one.endswith(british) and one[: -len(british)] + american == other:
                return True
    return False


def _misspelt(first: str, second: str) -> bool:
    """One of the words is not a word (not whole in the embedder's vocabulary) and is one edit from the other:
    "recieve" / "receive" is a typo, "desert" / "dessert" and "angle" / "angel" are two words."""
    if not (first.isalpha() and second.isalpha()):  # "ain't" / "amn't", "v2" / "v3": not typos
        return False
    known = _vocabulary()
    return (first not in known or second not in known) and _one_edit(first, second)


def warm() -> None:
    """Read the vocabulary now (at rule load, off the event loop), not on the first lookup that needs it."""
    _vocabulary()


@functools.cache
def _vocabulary() -> frozenset[str]:
    """The whole words of the packaged MiniLM's WordPiece vocabulary (~20k English words and names)."""
    from semantic.embedder_source import packaged_model_dir

    lines = (packaged_model_dir() / "vocab.txt").read_text(encoding="utf-8").splitlines()
    return frozenset(line for line in lines if line.isalpha() and not line.startswith("##"))


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
