"""A task request is not a question, in the six languages of the multilingual profile (zh, ja, es, de, fr, ru).

"Hilf mir, ein Kündigungsschreiben aufzusetzen" (draft me a
resignation letter) asks for a text to be made; "Darf mir mein Chef während der Krankschreibung
kündigen?" asks a question on the same topic. The multilingual verifier scored such pairs as surely the
same (on the development set's calibration part, "Составь доверенность на получение посылки" against a
question about that power of attorney), so a request to produce something (write, draft, translate,
summarise, ...) and a text that is not one are never the same question. A text ending in a question mark
asks a question whatever its verbs ("Wie schreibe ich eine Bewerbung?"). The guard is `TASK_REQUEST` in
`semantic/guards/registry.py`.

Knows text only. The word lists are written here, none comes from a pairs file.
"""

from __future__ import annotations

import functools

import regex

from semantic.guards.language import language_of

# Verbs that ask for a text to be produced, in the imperative, looked for among a request's first words
# (an infinitive after "help me" is left out: the rubric reads "help me draft X" as "how do I draft X"); and phrases that ask for something outright ("I
# need"), looked for anywhere. Chinese: at the start, after an optional "please" or "help me"; Japanese: a
# te-form request to produce something at the end ("教えてください", "tell me", asks a question).
_TASK_VERBS: dict[str, frozenset[str]] = {
    "de": frozenset(("schreib", "schreibe", "verfasse", "erstelle", "formuliere", "entwirf", "übersetze",
                     "fasse", "generiere")),
    "es": frozenset(("escribe", "escríbeme", "redacta", "redáctame", "crea", "créame", "genera", "traduce",
                     "tradúceme", "resume", "resúmeme", "hazme")),
    "fr": frozenset(("écris", "écrivez", "rédige", "rédigez", "crée", "créez", "génère", "traduis",
                     "traduisez", "résume", "résumez", "fais-moi", "faites-moi")),
    "ru": frozenset(("напиши", "напишите", "составь", "составьте", "создай", "создайте", "переведи",
                     "переведите", "перескажи", "сформулируй", "придумай", "сочини", "подготовь")),
}  # fmt: skip
_REQUEST_PHRASES: dict[str, tuple[str, ...]] = {
    "de": ("ich brauche",),
    "es": ("necesito", "quiero un", "quiero una"),
    "fr": ("j'ai besoin", "je voudrais un", "je voudrais une"),
    "ru": ("мне нужен", "мне нужна", "мне нужно"),
}
_FIRST_WORDS = 4
_CHINESE_TASK = regex.compile(r"^\s*(?:请|麻烦|帮我|请帮我|给我)?\s*(?:写|起草|翻译|生成|拟|总结|列出)")
_JAPANESE_TASK = regex.compile(
    r"(?:書いて|作成して|翻訳して|要約して|作って)(?:ください|下さい)?\s*[。!！]?\s*$"
)
_QUESTION_END = regex.compile(r"[?？]\s*$")
_WORD = regex.compile(r"[\p{L}\p{M}'-]+")


@functools.lru_cache(maxsize=65_536)
def is_task_request(text: str, language: str) -> bool:
    """`text` asks for something to be written, translated or summarised (and is not a question)."""
    if _QUESTION_END.search(text):
        return False
    if language == "zh":
        return _CHINESE_TASK.search(text) is not None
    if language == "ja":
        return _JAPANESE_TASK.search(text) is not None
    verbs = _TASK_VERBS.get(language)
    if verbs is None:
        return False
    folded = text.casefold()
    words = [word.casefold() for word in _WORD.findall(text)[:_FIRST_WORDS]]
    return any(word in verbs for word in words) or any(
        phrase in folded for phrase in _REQUEST_PHRASES[language]
    )


def task_differs(query: str, candidate: str, language: str) -> bool:
    """One text is a task request and the other is not, both read as `language`."""
    return is_task_request(query, language) != is_task_request(candidate, language)


def task_request_differs(query: str, candidate: str) -> bool:
    """`task_differs` in the query's language (the pairs a rule judges are in one language)."""
    return task_differs(query, candidate, language_of(query))
