"""Minimal pairs made from real questions, for training the verifier on the cache's rubric.

Quora's labels teach "same topic"; a cache needs "same answer". The pairs made here teach the difference on
questions people really asked: each takes one text and changes one thing.

- label 0 (the answer changes): direction or roles swapped, an opposite word, another unit or period,
  another number or year, another entity of the same sort (country, language, product, ...), negation, a
  constraint added ("... for beginners"), a second question appended; and task requests ("Write...",
  "Translate...", "Summarize...") whose target, form, length, tone or format changes;
- label 1 (the same answer): typos, filler and politeness, case and punctuation, an abbreviation for its
  expansion, a clause moved, "between X and Y" turned round, a synonym, "How do I" / "How can I" /
  "Tell me how to".

The lexicons are written here for English; none come from a pairs file. The output depends only on the
seed and the input texts.
"""

from __future__ import annotations

import functools
import random
import re
from collections.abc import Callable, Sequence

from evaluation.pair_sets import LabelledPair
from semantic.guards.edit_guards import OPPOSITES
from semantic.guards.word_tables import ABBREVIATIONS

Maker = Callable[[str, random.Random], str | None]

_ENTITIES: tuple[tuple[str, ...], ...] = (
    ("India", "China", "Pakistan", "Japan", "Germany", "France", "Canada", "Australia", "Brazil", "Russia",
     "Mexico", "Italy", "Spain", "Nigeria", "Egypt", "Kenya", "Sweden", "Norway", "Ireland", "Singapore",
     "the US", "the UK", "Bangladesh", "Indonesia", "Turkey", "Iran", "Israel", "South Korea", "Vietnam"),
    ("Delhi", "Mumbai", "Bangalore", "London", "Paris", "New York", "Tokyo", "Berlin", "Toronto", "Sydney",
     "Chicago", "Boston", "Seattle", "Dubai", "Hyderabad", "Chennai", "Pune", "Kolkata", "San Francisco"),
    ("Python", "Java", "JavaScript", "C++", "C#", "Ruby", "PHP", "Go", "Rust", "Swift", "Kotlin", "R",
     "MATLAB", "Scala", "Perl", "TypeScript"),
    ("English", "Hindi", "French", "German", "Spanish", "Chinese", "Japanese", "Arabic", "Russian",
     "Portuguese", "Italian", "Korean", "Tamil", "Urdu", "Bengali"),
    ("Google", "Facebook", "Amazon", "Apple", "Microsoft", "Netflix", "Uber", "Twitter", "Quora", "Infosys",
     "TCS", "Wipro", "IBM", "Intel", "Tesla", "Samsung", "Flipkart", "LinkedIn", "Instagram", "YouTube"),
    ("iPhone", "Android", "Windows", "Linux", "Mac", "Ubuntu", "iPad", "Xbox", "PlayStation", "Kindle"),
    ("Trump", "Obama", "Hillary Clinton", "Modi", "Putin", "Gandhi", "Einstein", "Newton", "Hitler",
     "Elon Musk", "Bill Gates", "Steve Jobs"),
    ("Harvard", "Stanford", "MIT", "IIT", "Oxford", "Cambridge", "Yale", "Princeton", "Berkeley"),
    ("Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"),
    ("January", "February", "March", "April", "May", "June", "July", "August", "September", "October",
     "November", "December"),
)  # fmt: skip
_UNIT_FAMILIES: tuple[tuple[str, ...], ...] = (
    ("km", "miles", "meters", "feet"), ("kg", "pounds", "grams", "ounces"), ("Celsius", "Fahrenheit", "Kelvin"),
    ("liters", "gallons", "ml"), ("seconds", "minutes", "hours", "days"), ("day", "week", "month", "year"),
    ("daily", "weekly", "monthly", "yearly"), ("dollars", "rupees", "euros", "pounds"), ("GB", "MB", "TB"),
    ("mph", "km/h"), ("inches", "centimeters"), ("morning", "evening", "night", "afternoon"),
)  # fmt: skip
_CONSTRAINTS = (
    "for beginners", "for kids", "for a small business", "without a degree", "at home", "for free", "on a budget",
    "in winter", "on Windows", "on a Mac", "for a vegetarian", "without a credit card", "after 40", "as a student",
    "in one month", "for an interview", "on my phone", "without losing data", "legally", "for a first date",
)  # fmt: skip
_NEGATIONS = (
    ("can I ", "can't I "), ("is it ", "isn't it "), ("should I ", "shouldn't I "), ("does it ", "doesn't it "),
    ("do I ", "don't I "), ("is ", "is not "), ("are ", "are not "), ("will ", "will not "), ("can ", "cannot "),
    ("should ", "should not "), ("was ", "was not "), ("does ", "does not "),
)  # fmt: skip
_SYNONYMS = (
    ("buy", "purchase"), ("movie", "film"), ("movies", "films"), ("fix", "repair"), ("car", "automobile"),
    ("begin", "start"), ("quickly", "fast"), ("mobile phone", "cell phone"), ("smartphone", "phone"),
    ("learn", "study"), ("big", "large"), ("small", "little"), ("choose", "pick"), ("get rid of", "remove"),
    ("find out", "discover"), ("improve", "get better at"), ("job", "work"), ("kids", "children"),
    ("help", "assist"), ("tips", "advice"), ("method", "way"), ("easy", "simple"), ("website", "site"),
    ("happen", "occur"), ("reason", "cause"), ("purpose", "point"), ("grow", "increase"), ("top", "best"),
)  # fmt: skip
_LEADING = ("Quick question: ", "Hey, ", "Hi! ", "Hello, ", "So, ", "Okay so ", "Just wondering, ",
            "Can you help? ", "Please help: ")  # fmt: skip
# A second question joined to the first: the first one's answer does not cover it.
_MORE = (
    " and how does it work?", " and why?", ", and what are the alternatives?", " and how much does it cost?",
    ", and how long does it take?", " and is it worth it?", " and what are the risks?", " and what are its uses?",
    ", and how is it different from the others?", " and what happens after that?", " and who decides?",
    ", and what should I do about it?", " and where can I learn more?", " and how do I get started?",
)  # fmt: skip
_TRAILING = (
    " Thanks!",
    " Thank you.",
    " Thanks in advance.",
    " Please.",
    " Any help appreciated.",
    " Cheers",
)


def _typo(text: str, rng: random.Random) -> str | None:
    words = text.split(" ")
    long = [index for index, word in enumerate(words) if len(word) >= 5 and word.isalpha()]
    if not long:
        return None
    for index in rng.sample(long, min(len(long), rng.choice((1, 1, 2)))):
        word = words[index]
        at = rng.randrange(1, len(word) - 1)
        edit = rng.choice(("swap", "drop", "double", "replace"))
        if edit == "swap":
            word = word[: at - 1] + word[at] + word[at - 1] + word[at + 1 :]
        elif edit == "drop":
            word = word[:at] + word[at + 1 :]
        elif edit == "double":
            word = word[:at] + word[at] + word[at:]
        else:
            word = word[:at] + rng.choice("aeiourstnl") + word[at + 1 :]
        words[index] = word
    changed = " ".join(words)
    return changed if changed != text else None


def _filler(text: str, rng: random.Random) -> str | None:
    lead = rng.random() < 0.6
    body = text[0].lower() + text[1:] if lead and text[:1].isupper() and not text[:2].isupper() else text
    result = (rng.choice(_LEADING) + body) if lead else body
    return result + rng.choice(_TRAILING) if (not lead or rng.random() < 0.3) else result


def _case_punctuation(text: str, rng: random.Random) -> str | None:
    changed = (
        text.lower().rstrip("?!. ") if rng.random() < 0.5 else text.rstrip("?") + rng.choice(("??", "", " ?"))
    )
    return changed if changed != text else None


def _abbreviation(text: str, rng: random.Random) -> str | None:
    for short, long in rng.sample(list(ABBREVIATIONS.items()), len(ABBREVIATIONS)):
        if _word(long).search(text):
            return _word(long).sub(short.upper(), text, count=1)
        if len(short) > 2 and _word(short).search(text):
            return _word(short).sub(long, text, count=1)
    return None


def _moved_clause(text: str, rng: random.Random) -> str | None:
    match = re.match(r"^([^.?!]+?) ((?:in|on|for|with|using|during) [^,.?!]{3,40})\?$", text)
    if match is None or len(match.group(1).split()) < 3:
        return None
    head, clause = match.groups()
    return f"{clause[0].upper()}{clause[1:]}, {head[0].lower()}{head[1:]}?"


def _between_turned(text: str, rng: random.Random) -> str | None:
    match = re.search(r"\bbetween (\w+(?: \w+)?) and (\w+(?: \w+)?)", text)
    if match is None:
        return None
    return text[: match.start()] + f"between {match.group(2)} and {match.group(1)}" + text[match.end() :]


def _synonym(text: str, rng: random.Random) -> str | None:
    return _replace_one(text, rng, [(a, b) for a, b in _SYNONYMS] + [(b, a) for a, b in _SYNONYMS])


def _rephrased(text: str, rng: random.Random) -> str | None:
    forms = {
        r"^How do I (.+?)\?$": ("How can I {}?", "Tell me how to {}.", "Could you explain how to {}?",
                                "What is the way to {}?", "How should I {}?"),
        r"^How can I (.+?)\?$": ("How do I {}?", "Tell me how to {}.", "What's the way to {}?", "How could I {}?"),
        r"^What is (.+?)\?$": ("What's {}?", "Can you tell me what {} is?", "Explain what {} is."),
        r"^What are (.+?)\?$": ("Which are {}?", "Can you tell me what {} are?", "Tell me what {} are."),
        r"^Why is (.+?)\?$": ("For what reason is {}?", "Why exactly is {}?", "What makes {}?"),
    }  # fmt: skip
    for pattern, outputs in forms.items():
        match = re.match(pattern, text)
        if match is not None:
            return rng.choice(outputs).format(match.group(1))
    return None


def _direction(text: str, rng: random.Random) -> str | None:
    for pattern in (
        r"\bfrom (\w+(?: \w+)?) to (\w+(?: \w+)?)",
        r"\b(\w+) into (\w+)",
        r"\b(\w+) (?:better|worse|bigger|smaller|faster|slower|harder|easier|cheaper) than (\w+(?: \w+)?)",
        r"\bconvert (\w+) to (\w+)",
        r"\b(\w+) to (\w+) (?:conversion|converter|translation)",
    ):
        match = re.search(pattern, text, flags=re.IGNORECASE)
        if match is None or match.group(1).lower() == match.group(2).lower():
            continue
        first, second = match.span(1), match.span(2)
        return (
            text[: first[0]]
            + match.group(2)
            + text[first[1] : second[0]]
            + match.group(1)
            + text[second[1] :]
        )
    return None


def _opposite(text: str, rng: random.Random) -> str | None:
    return _replace_one(text, rng, [(a, b) for a, b in OPPOSITES] + [(b, a) for a, b in OPPOSITES])


def _unit(text: str, rng: random.Random) -> str | None:
    return _replace_in_family(text, rng, _UNIT_FAMILIES)


def _entity(text: str, rng: random.Random) -> str | None:
    return _replace_in_family(text, rng, _ENTITIES)


def _number(text: str, rng: random.Random) -> str | None:
    numbers = list(re.finditer(r"\b\d+(?:\.\d+)?\b", text))
    if not numbers:
        return None
    match = rng.choice(numbers)
    value = match.group(0)
    if len(value) == 4 and value.startswith(("19", "20")):
        other = str(int(value) + rng.choice((-3, -2, -1, 1, 2, 5)))
    else:
        base = float(value)
        other = (
            str(int(base * rng.choice((2, 3, 10)) + rng.choice((1, 2))))
            if "." not in value
            else f"{base * 2:g}"
        )
    return text[: match.start()] + other + text[match.end() :]


def _negation(text: str, rng: random.Random) -> str | None:
    for plain, negated in _NEGATIONS:
        index = text.find(plain)
        if index >= 0:
            return text[:index] + negated + text[index + len(plain) :]
    return None


def _constraint(text: str, rng: random.Random) -> str | None:
    if not text.endswith("?") or len(text.split()) < 4:
        return None
    return text[:-1] + " " + rng.choice(_CONSTRAINTS) + "?"


@functools.cache
def _word(phrase: str, boundary: str = r"\w'", ignore_case: bool = True) -> re.Pattern[str]:
    """`phrase` as a whole word (compiled once: the lexicons hold hundreds)."""
    flags = re.IGNORECASE if ignore_case else 0
    return re.compile(rf"(?<![{boundary}]){re.escape(phrase)}(?![{boundary}])", flags=flags)


def _replace_one(text: str, rng: random.Random, pairs: Sequence[tuple[str, str]]) -> str | None:
    found = [(old, new) for old, new in pairs if _word(old).search(text)]
    if not found:
        return None
    old, new = rng.choice(found)
    return _word(old).sub(new, text, count=1)


def _replace_in_family(text: str, rng: random.Random, families: Sequence[Sequence[str]]) -> str | None:
    for family in rng.sample(list(families), len(families)):
        for word in family:
            match = _word(word, r"\w+#", ignore_case=False).search(text)
            if match is not None:
                other = rng.choice([candidate for candidate in family if candidate != word])
                return text[: match.start()] + other + text[match.end() :]
    return None


# Makers that apply to almost any question would otherwise crowd out the rest.
_WEIGHTS = {"constraint": 0.35, "negation": 0.5, "case": 0.5, "filler": 0.7, "subject": 0.4}
SAME_ANSWER: tuple[tuple[str, Maker], ...] = (
    ("typo", _typo), ("filler", _filler), ("case", _case_punctuation), ("abbreviation", _abbreviation),
    ("reorder", _moved_clause), ("reorder", _between_turned), ("synonym", _synonym), ("rephrase", _rephrased),
)  # fmt: skip
OTHER_ANSWER: tuple[tuple[str, Maker], ...] = (
    ("direction", _direction), ("comparative", _opposite), ("unit", _unit), ("entity", _entity),
    ("number", _number), ("negation", _negation), ("constraint", _constraint),
)  # fmt: skip


def minimal_pairs(texts: Sequence[str], rng: random.Random, per_text: int = 2) -> list[LabelledPair]:
    """Up to `per_text` pairs from each text: one that keeps its answer and one that changes it, where a
    maker applies (makers are tried in a random order, the first that applies is kept)."""
    short = [text.strip() for text in texts if 12 <= len(text.strip()) <= 70 and text.strip().endswith("?")]
    names, words = _word_pools(texts)
    corpus_makers: tuple[tuple[str, Maker], ...] = (
        ("entity", lambda text, rng: _swap_from_pool(text, rng, _NAME, names)),
        ("subject", lambda text, rng: _swap_from_pool(text, rng, _CONTENT_WORD, words)),
    )
    pairs: list[LabelledPair] = []
    for text in texts:
        text = text.strip()
        if len(text) < 12:
            continue
        for makers, label in ((SAME_ANSWER, 1), (OTHER_ANSWER + corpus_makers, 0))[: max(per_text, 1)]:
            made = [(kind, changed) for kind, make in makers if (changed := make(text, rng)) is not None]
            made = [(kind, changed) for kind, changed in made if changed.strip() and changed != text]
            if label == 0 and short and text.endswith("?") and rng.random() < 0.2:
                if rng.random() < 0.5:
                    other = rng.choice(short)
                    made = [("asks-more", f"{text} {other}")] if other != text else made
                else:
                    made = [("asks-more", text[:-1] + rng.choice(_MORE))]
            if made:
                weights = [_WEIGHTS.get(kind, 1.0) for kind, _ in made]
                kind, changed = rng.choices(made, weights=weights)[0]
                pairs.append(LabelledPair(text, changed, label, kind))
    return pairs


# A name: a capitalised word that does not open the text; a content word: a longer lower-case word.
_NAME = re.compile(r"(?<=[\w,] )[A-Z][a-z]{2,}\b")
_CONTENT_WORD = re.compile(r"\b[a-z]{5,}\b")
_COMMON = frozenset(
    ["about", "after", "again", "being", "could", "doing", "every", "first", "going", "great", "their", "there",
     "these", "thing", "things", "think", "those", "where", "which", "while", "would", "should", "people",
     "really", "still", "other", "without", "between", "before", "because", "someone", "something"]
)  # fmt: skip


def _word_pools(texts: Sequence[str]) -> tuple[list[str], list[str]]:
    """Names and content words seen in the texts, sorted (so the pools depend only on the texts)."""
    names = {match for text in texts for match in _NAME.findall(text)}
    words = {match for text in texts for match in _CONTENT_WORD.findall(text)} - _COMMON
    return sorted(names), sorted(words)


def _swap_from_pool(
    text: str, rng: random.Random, pattern: re.Pattern[str], pool: Sequence[str]
) -> str | None:
    """One name (or content word) of the text replaced by another from the pool: another subject."""
    found = [match for match in pattern.finditer(text) if match.group(0).lower() not in _COMMON]
    if not found or not pool:
        return None
    match = rng.choice(found)
    other = rng.choice(pool)
    if other.lower() == match.group(0).lower() or other.lower() in text.lower():
        return None
    return text[: match.start()] + other + text[match.end() :]


_TOPICS = (
    "the ocean", "autumn leaves", "a lost dog", "friendship", "climate change", "a rainy city", "my grandmother",
    "space travel", "coffee", "the first day of school", "a robot that learns to paint", "remote work",
    "a mountain village", "electric cars", "a broken promise", "the moon", "a small bakery", "time travel",
    "learning to code", "a football final",
)  # fmt: skip
_FORMS = (
    "poem",
    "short story",
    "email",
    "blog post",
    "essay",
    "song",
    "limerick",
    "speech",
    "haiku",
    "letter",
)
_TONES = ("formal", "funny", "sad", "friendly", "professional", "sarcastic", "hopeful", "angry")
_LENGTHS = ("100-word", "300-word", "one-paragraph", "two-sentence", "500-word")
_LANGUAGES = ("French", "German", "Spanish", "Japanese", "Hindi", "Italian", "Portuguese", "Chinese")
_SENTENCES = (
    "Where is the train station?", "I would like a cup of tea.", "The meeting is moved to Friday.",
    "Please close the door.", "How much does this cost?", "I lost my keys yesterday.", "We are open until 9 pm.",
)  # fmt: skip
_FORMATS = ("a bulleted list", "a table", "JSON", "a numbered list", "one paragraph", "Markdown")
_SUBJECTS = (
    "this article",
    "the meeting notes",
    "this email thread",
    "the report",
    "this chapter",
    "the paper",
)


def task_pairs(rng: random.Random, count: int) -> list[LabelledPair]:
    """Task requests whose one changed slot changes the output (label 0), or reworded (label 1)."""
    pairs: list[LabelledPair] = []
    while len(pairs) < count:
        kind = rng.choice(("write", "translate", "summarize"))
        if kind == "write":
            topic, form, tone, length = (rng.choice(values) for values in (_TOPICS, _FORMS, _TONES, _LENGTHS))
            base = f"Write a {length} {form} about {topic} in a {tone} tone."
            same = rng.choice((
                f"Can you write a {length} {form} about {topic}? Make it {tone}.",
                f"Please write me a {tone} {length} {form} about {topic}.",
                f"I need a {length} {form} about {topic}, {tone} in tone.",
            ))  # fmt: skip
            slot = rng.choice(("topic", "form", "tone", "length"))
            values = {"topic": _TOPICS, "form": _FORMS, "tone": _TONES, "length": _LENGTHS}[slot]
            current = {"topic": topic, "form": form, "tone": tone, "length": length}[slot]
            other = rng.choice([value for value in values if value != current])
            changed = base.replace(f" {current} ", f" {other} ", 1) if f" {current} " in base else None
            if changed is None:
                changed = base.replace(f" {current}.", f" {other}.", 1)
        elif kind == "translate":
            sentence, language = rng.choice(_SENTENCES), rng.choice(_LANGUAGES)
            base = f'Translate "{sentence}" into {language}.'
            same = rng.choice(
                (
                    f'How do you say "{sentence}" in {language}?',
                    f'Please translate to {language}: "{sentence}"',
                )
            )
            other = rng.choice([value for value in _LANGUAGES if value != language])
            changed = (
                base.replace(language, other)
                if rng.random() < 0.6
                else f'Translate "{rng.choice([s for s in _SENTENCES if s != sentence])}" into {language}.'
            )
            slot = "language"
        else:
            subject, form = rng.choice(_SUBJECTS), rng.choice(_FORMATS)
            sentences = rng.choice((2, 3, 5))
            base = f"Summarize {subject} in {sentences} sentences as {form}."
            same = f"Give me a {sentences}-sentence summary of {subject}, as {form}."
            if rng.random() < 0.5:
                changed = base.replace(f" {form}.", f" {rng.choice([f for f in _FORMATS if f != form])}.")
                slot = "format"
            else:
                changed = base.replace(f"in {sentences} ", f"in {sentences * 2 + 1} ")
                slot = "length"
        pairs.append(LabelledPair(base, same, 1, "task-rephrase"))
        pairs.append(LabelledPair(base, changed, 0, f"task-{slot}"))
    return pairs
