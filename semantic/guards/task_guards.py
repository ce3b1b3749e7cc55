"""Guards for requests whose output changes with one word: the language asked for, and a task's form,
format, tone or length.

"Translate this into French" / "... into German" and "Write a formal email ..." / "Write a funny email ..."
keep every word an embedding looks at but one, and that one decides the answer. Each function here says
whether two texts differ in one such way, from lexicons written for English (not from any test file).
Which of them the rule applies is measured (`bench/semantic/bench_guards.py`, `DEFAULT_GUARDS` in `semantic/rule/calibration_fit.py`).
"""

from __future__ import annotations

import re

_TOKEN = re.compile(r"[a-z0-9+#]+(?:-[a-z0-9]+)*")
_LANGUAGES = frozenset(
    ["english", "french", "german", "spanish", "italian", "portuguese", "dutch", "russian", "polish",
     "ukrainian", "czech", "greek", "turkish", "arabic", "hebrew", "persian", "farsi", "hindi", "urdu",
     "bengali", "punjabi", "tamil", "telugu", "marathi", "gujarati", "kannada", "malayalam", "chinese",
     "mandarin", "cantonese", "japanese", "korean", "vietnamese", "thai", "indonesian", "malay", "tagalog",
     "swahili", "swedish", "norwegian", "danish", "finnish", "hungarian", "romanian", "latin", "sanskrit",
     "python", "java", "javascript", "typescript", "c++", "c#", "ruby", "php", "golang", "rust", "kotlin",
     "swift", "scala", "perl", "haskell", "matlab", "sql", "bash", "powershell", "lua", "dart", "elixir"]
)  # fmt: skip
# A task's slots: words naming what kind of text to produce, its layout, its tone and its length.
_SLOTS: dict[str, frozenset[str]] = {
    "form": frozenset(
        ["poem", "haiku", "limerick", "sonnet", "story", "essay", "email", "letter", "tweet", "blog", "speech",
         "song", "lyric", "outline", "report", "review", "joke", "riddle", "slogan", "caption", "headline",
         "bio", "resume", "memo", "toast", "eulogy", "recipe", "quiz", "dialogue", "monologue", "ad",
         "advertisement", "newsletter", "proposal", "invitation"]
    ),
    "format": frozenset(
        ["table", "json", "csv", "yaml", "xml", "markdown", "html", "bullet", "numbered", "paragraph",
         "checklist", "spreadsheet", "slide"]
    ),
    "tone": frozenset(
        ["formal", "casual", "funny", "serious", "professional", "friendly", "polite", "rude", "sarcastic",
         "playful", "angry", "sad", "happy", "hopeful", "romantic", "persuasive", "neutral", "enthusiastic",
         "academic", "poetic", "dramatic", "gentle", "firm", "apologetic", "witty", "cheerful", "somber",
         "optimistic", "pessimistic", "simple", "technical"]
    ),
    "length": frozenset(
        ["brief", "detailed", "lengthy", "tldr", "eli5"]
    ),
}  # fmt: skip
# Words of one slot that say the same thing, read as one.
_SAME_SLOT = {
    "humorous": "funny", "informal": "casual", "concise": "brief", "succinct": "brief", "bulleted": "bullet",
    "detail": "detailed", "thorough": "detailed", "in-depth": "detailed", "lyrics": "lyric", "cv": "resume",
}  # fmt: skip
_TASK_VERBS = frozenset(
    ["write", "compose", "draft", "create", "generate", "translate", "summarize", "summarise", "rewrite",
     "paraphrase", "rephrase", "convert", "make", "give", "produce", "prepare", "craft", "design", "list",
     "outline", "suggest", "tell", "describe", "explain", "edit", "proofread", "format", "turn"]
)  # fmt: skip
# Words before a task verb that do not change it: "Could you please write ...", "I need you to draft ...".
_LEAD_IN = frozenset(
    ["can", "could", "would", "will", "you", "please", "kindly", "i", "need", "want", "would", "like", "to",
     "help", "me", "hey", "hi", "quick", "question", "now", "just", "also", "ok", "okay", "so"]
)  # fmt: skip


def languages_differ(query: str, candidate: str) -> bool:
    """Both texts name languages (spoken or programming), and not the same ones: "in French" / "in German",
    "in Python" / "in Java". A language on one side only is usually context, and is left to the verifier."""
    first, second = _languages(query), _languages(candidate)
    return bool(first) and bool(second) and first != second


def task_slots_differ(query: str, candidate: str) -> bool:
    """The texts ask for another form, format, tone or length of output: both name one and they differ
    ("a poem" / "a story", "as a table" / "as bullet points"), or, where either is a task request ("Write
    ...", "Translate ..."), one names it and the other does not ("Write an email" / "Write a formal email")."""
    first, second = _tokens(query), _tokens(candidate)
    task = _is_task(first) or _is_task(second)
    for words in _SLOTS.values():
        one, other = words.intersection(first), words.intersection(second)
        if one != other and ((one and other) or task):
            return True
    return False


def _languages(text: str) -> frozenset[str]:
    return _LANGUAGES.intersection(_tokens(text))


def _is_task(tokens: list[str]) -> bool:
    for token in tokens[:6]:
        if token in _TASK_VERBS:
            return True
        if token not in _LEAD_IN:
            return False
    return False


def _tokens(text: str) -> list[str]:
    words = _TOKEN.findall(text.lower().replace("’", "'").replace("bullet points", "bullets"))
    return [_SAME_SLOT.get(word, _singular(word)) for word in words]


def _singular(word: str) -> str:
    if len(word) > 3 and word.endswith("s") and not word.endswith(("ss", "us", "is")):
        return word[:-1]
    return word
