"""Which language a prompt is written in, so that the rule judges only text it was measured on.

A calibration holds its false-hit target only for the languages of the pairs it was fitted on (today English:
all-MiniLM-L6-v2 maps most Chinese and Japanese characters to `[UNK]`, and reads Spanish or Russian as
English sub-words). Any other prompt gets exact hits only (`semantic/rule/calibrated_rule.py`).

Two steps, measured on every prompt of the development sets (`docs/benchmarks.md`, "languages"):

1. **Script.** A letter outside the Latin script (Han, kana, Hangul, Cyrillic, Arabic, ...) means the prompt is
   not English, whatever else it holds: "Python里怎么把列表倒序排列？" and "React props state 違い" are Chinese
   and Japanese questions with English words in them. A prompt with no letter at all ("2+2=?") has no
   language (`NO_LANGUAGE`): numbers and symbols read the same in every language.
2. **Latin-script languages** by py3langid (a naive Bayes over byte n-grams, numpy only, its model inside the
   wheel), restricted to the languages below, and English unless it gives another language a probability of
   at least 0.3: out of 27,730 English prompts 66 are read as another language (0.24%; short keyword
   queries such as "AWS CLI v2 install on Linux", and English questions quoting Chinese or Korean words),
   out of 3,424 non-English ones 8 as English (code-mixed ones such as "python string umdrehen").
   fastText's lid.176 lite model (220 English misread, 4 let through), CLD2 (30 and 154) and lingua (565 and
   13, 2 ms a text) were measured beside it.

Knows text only: no thresholds, no model of meaning.
"""

from __future__ import annotations

import functools
from collections.abc import Collection
from typing import TYPE_CHECKING

import regex

if TYPE_CHECKING:  # py3langid ships no type information
    from py3langid.langid import LanguageIdentifier

# No letter at all: digits, symbols and punctuation only.
NO_LANGUAGE = "zxx"
# Languages with a script of their own whose prompt the identifier called English: kept apart from English.
MIXED = "mul"

# The identifier chooses among these (ISO 639-1): widely written languages, so that a short English prompt is
# not read as Scots, Latin or Tagalog (with all 97 of py3langid's languages, 373 English prompts were).
DETECTED_LANGUAGES: tuple[str, ...] = (
    "en", "es", "de", "fr", "it", "pt", "nl", "sv", "da", "no", "fi", "pl", "cs", "ro", "hu", "tr", "id", "vi",
    "ca", "hr", "sk", "sl", "lt", "lv", "et", "ru", "uk", "bg", "el", "zh", "ja", "ko", "ar", "he", "hi", "th",
    "fa",
)  # fmt: skip

# A Latin-script text is read as another language than English only when the identifier gives that language
# at least this probability (the same 27,730 English prompts: 66 read as another language, against 140 on
# the identifier's call alone; non-English ones read as English: 8 of 3,424, against 6).
MIN_OTHER_LANGUAGE_PROBABILITY = 0.3

_LETTER = regex.compile(r"\p{L}")
_NON_LATIN_LETTER = regex.compile(r"[^\P{L}\p{Latin}]")
_CACHE_SIZE = 65_536


@functools.lru_cache(maxsize=_CACHE_SIZE)
def language_of(text: str) -> str:
    """The ISO 639-1 code of `text`'s language, `NO_LANGUAGE` without letters, `MIXED` for a prompt in
    another script that the identifier still called English."""
    if _LETTER.search(text) is None:
        return NO_LANGUAGE
    code, probability = _identifier().classify(text)
    code = str(code)
    if _NON_LATIN_LETTER.search(text) is not None:
        return MIXED if code == "en" else code
    # Too little text for the identifier to be sure of another language: English, the calibrated default.
    return code if probability >= MIN_OTHER_LANGUAGE_PROBABILITY else "en"


def refusal(text: str, judged: Collection[str]) -> str | None:
    """Why `text` gets exact hits only (its language is not among the `judged` ones), or None.
    Text without letters goes with any language."""
    code = language_of(text)
    if code == NO_LANGUAGE or code in judged:
        return None
    return f"language {code} not calibrated: exact hits only"


def pair_refusal(query: str, candidate: str, judged: Collection[str]) -> str | None:
    """Why the pair is not judged: a text in a language not `judged`, or the two in different languages."""
    if (reason := refusal(query, judged) or refusal(candidate, judged)) is not None:
        return reason
    codes = {language_of(query), language_of(candidate)} - {NO_LANGUAGE}
    return "languages differ" if len(codes) > 1 else None


def warm() -> None:
    """Load the identifier now (at rule load, off the event loop), not on the first lookup."""
    _identifier()


@functools.cache
def _identifier() -> LanguageIdentifier:
    from py3langid.langid import MODEL_DIR, MODEL_FILE, LanguageIdentifier

    identifier = LanguageIdentifier.from_modelpath(MODEL_DIR / MODEL_FILE, norm_probs=True)
    identifier.set_languages(list(DETECTED_LANGUAGES))
    # The identifier keeps its 97-language tables to allow a later `set_languages`; kvgate never calls it
    # again, so the restricted tables replace them: 19 MB less per process, the same answers.
    identifier._full_model = (identifier.nb_ptc, identifier.nb_pc, identifier.nb_classes)
    return identifier
