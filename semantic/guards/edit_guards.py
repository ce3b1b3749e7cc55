"""Guards for minimal edits that keep every word an embedding (or a cross-encoder) looks at, but not the meaning.

"How do I redirect HTTP to HTTPS?" and "... HTTPS to HTTP?" share their words; "Which planet is closest to
the Sun?" and "... farthest from the Sun?" differ by one antonym; "km" / "miles", "per day" / "per year",
"5am" / "5pm" by a unit or a period. Each function here says whether two texts differ in one such way. They
are built from general lexicons written for English (not from any test file) and are cheap (a few
regular expressions and set operations). Which of them the rule applies is a measured choice: see
`bench/semantic/bench_guards.py` and `DEFAULT_GUARDS` in `semantic/rule/calibration_fit.py`.
"""

from __future__ import annotations

import re
from collections import Counter

_TOKEN = re.compile(r"[a-z0-9]+(?:'[a-z]+)?")
# Words that relate two things, so that what follows each says which role it plays.
_RELATIONS = frozenset(
    ["from", "to", "into", "onto", "than", "versus", "vs", "over", "under", "before", "after", "above",
     "below", "between", "against", "via", "toward", "towards", "per", "by"]
)  # fmt: skip
# Longest run of words read as one role in `_roles_exchanged` ("the 2 prong", "people in Denver" is three).
_MAX_ROLE_WORDS = 3
# Between two things exchanged, only these keep the meaning ("X and Y" / "Y and X").
_SYMMETRIC = frozenset(
    ["and", "or", "nor", "vs", "versus", "plus", "a", "an", "the", "both", "either", "neither"]
)
_FILLER = frozenset(
    ["a", "an", "the", "my", "your", "our", "their", "his", "her", "its", "this", "that", "these", "those",
     "some", "any", "of", "and"]
)  # fmt: skip
# Each pair: two words (or phrases) with opposite meaning in a question. Both directions are checked.
OPPOSITES: tuple[tuple[str, str], ...] = (
    ("highest", "lowest"), ("high", "low"), ("higher", "lower"), ("most", "least"), ("more", "less"),
    ("more", "fewer"), ("best", "worst"), ("better", "worse"), ("largest", "smallest"), ("biggest", "smallest"),
    ("larger", "smaller"), ("bigger", "smaller"), ("big", "small"), ("large", "small"), ("longest", "shortest"),
    ("longer", "shorter"), ("long", "short"), ("fastest", "slowest"), ("faster", "slower"), ("fast", "slow"),
    ("closest", "farthest"), ("closest", "furthest"), ("nearest", "farthest"), ("nearest", "furthest"),
    ("closer", "farther"), ("closer", "further"), ("near", "far"), ("cheapest", "most expensive"),
    ("cheaper", "more expensive"), ("cheap", "expensive"), ("oldest", "newest"), ("oldest", "youngest"),
    ("older", "newer"), ("older", "younger"), ("old", "new"), ("earliest", "latest"), ("earlier", "later"),
    ("early", "late"), ("first", "last"), ("maximum", "minimum"), ("max", "min"), ("hottest", "coldest"),
    ("hotter", "colder"), ("hot", "cold"), ("warm", "cold"), ("heaviest", "lightest"), ("heavier", "lighter"),
    ("strongest", "weakest"), ("stronger", "weaker"), ("richest", "poorest"), ("easiest", "hardest"),
    ("easier", "harder"), ("safest", "most dangerous"), ("safer", "more dangerous"), ("top", "bottom"),
    ("before", "after"), ("above", "below"), ("over", "under"), ("inside", "outside"), ("inbound", "outbound"),
    ("incoming", "outgoing"), ("input", "output"), ("upload", "download"), ("import", "export"),
    ("increase", "decrease"), ("increase", "reduce"), ("raise", "lower"), ("gain", "lose"), ("win", "lose"),
    ("buy", "sell"), ("buying", "selling"), ("borrow", "lend"), ("send", "receive"), ("push", "pull"),
    ("enable", "disable"), ("encrypt", "decrypt"), ("encode", "decode"), ("compress", "decompress"),
    ("install", "uninstall"), ("mount", "unmount"), ("lock", "unlock"), ("start", "stop"), ("open", "close"),
    ("add", "remove"), ("add", "delete"), ("join", "leave"), ("accept", "reject"), ("allow", "block"),
    ("allow", "deny"), ("left", "right"), ("north", "south"), ("east", "west"), ("up", "down"),
    ("positive", "negative"), ("true", "false"), ("pros", "cons"), ("advantages", "disadvantages"),
    ("benefits", "drawbacks"), ("benefits", "risks"), ("male", "female"), ("men", "women"), ("boy", "girl"),
    ("husband", "wife"), ("buyer", "seller"), ("employer", "employee"), ("landlord", "tenant"),
    ("parent", "child"), ("teacher", "student"), ("winner", "loser"), ("success", "failure"),
    ("legal", "illegal"), ("possible", "impossible"), ("healthy", "unhealthy"), ("safe", "unsafe"),
    ("wet", "dry"), ("light", "dark"), ("day", "night"), ("summer", "winter"), ("spring", "autumn"),
    ("spring", "fall"), ("morning", "evening"), ("sunrise", "sunset"), ("past", "future"),
    ("yesterday", "tomorrow"), ("last", "next"), ("previous", "next"), ("ago", "from now"),
    ("beginning", "end"), ("start", "end"), ("junior", "senior"), ("public", "private"),
    ("internal", "external"), ("ascending", "descending"), ("horizontal", "vertical"), ("inner", "outer"),
    ("beginner", "advanced"),
)  # fmt: skip
# Words naming a unit or a period: two texts naming different ones ask for different answers. Spellings of
# one unit map to one name; plurals are folded by `_singular`.
_UNITS = {
    "km": "km", "kilometer": "km", "kilometre": "km", "mile": "mile", "meter": "metre", "metre": "metre",
    "cm": "cm", "centimeter": "cm", "centimetre": "cm", "mm": "mm", "millimeter": "mm", "millimetre": "mm",
    "inch": "inch", "foot": "foot", "feet": "foot", "ft": "foot", "yard": "yard", "kg": "kg",
    "kilogram": "kg", "gram": "gram", "mg": "mg", "milligram": "mg", "lbs": "pound", "pound": "pound",
    "oz": "ounce", "ounce": "ounce", "tonne": "tonne", "liter": "litre", "litre": "litre",
    "milliliter": "ml", "millilitre": "ml", "gallon": "gallon", "pint": "pint", "quart": "quart",
    "tablespoon": "tablespoon", "tbsp": "tablespoon", "teaspoon": "teaspoon", "tsp": "teaspoon",
    "celsius": "celsius", "fahrenheit": "fahrenheit", "kelvin": "kelvin", "mph": "mph", "kph": "kph",
    "kmh": "kph", "knot": "knot", "watt": "watt", "kw": "kw", "kilowatt": "kw", "kwh": "kwh", "volt": "volt",
    "hz": "hz", "ghz": "ghz", "mhz": "mhz", "byte": "byte", "kb": "kb", "gb": "gb", "tb": "tb",
    "mbps": "mbps", "gbps": "gbps", "dollar": "usd", "usd": "usd", "euro": "eur", "eur": "eur",
    "yen": "jpy", "rupee": "inr", "peso": "peso", "percent": "percent", "calorie": "calorie",
    "kcal": "calorie", "acre": "acre", "hectare": "hectare", "seconds": "second", "secs": "second",
    "minute": "minute", "hour": "hour", "day": "day", "daily": "day", "week": "week", "weekly": "week",
    "month": "month", "monthly": "month", "year": "year", "yearly": "year", "annual": "year",
    "annually": "year", "decade": "decade", "century": "century", "weekday": "weekday", "weekend": "weekend",
}  # fmt: skip
# Left out as words, being other words too: "am" ("Am I"), "second" (an ordinal), "in", "min", "m", "g",
# "l", "ml" (machine learning), "hr" (human resources), "bit", "cup", "ton", "stone", "mb". After a number
# ("5m", "20°C", "5am") they are read by `_AFTER_A_NUMBER` and `_TIME_OF_DAY`.
_AFTER_A_NUMBER = {
    "c": "celsius", "f": "fahrenheit", "w": "watt", "min": "minute", "mins": "minute", "in": "inch",
    "m": "metre", "g": "gram", "l": "litre", "ml": "ml", "mb": "mb", "hr": "hour", "hrs": "hour",
    "s": "second", "sec": "second", "lb": "pound", "mi": "mile",
}  # fmt: skip
# "convert X to Y", "turn X into Y", "from X to Y": a phrase of at most four words on each side, the second
# ending at a preposition, a conjunction or the end of the sentence.
_PHRASE = r"[a-z0-9][a-z0-9'+#.-]*(?:\s+[a-z0-9][a-z0-9'+#.-]*){0,3}?"
_PHRASE_END = r"(?=\s+(?:in|on|with|using|for|without|via|by|at|so|and|or|when|if|while|before|after)\b|\s*[?.!,;:]|\s*$)"
_CONVERT_TO = re.compile(
    r"\b(?:convert|turn|change|transform|cast|translate|switch|migrate|port|exchange)(?:s|ed|ing)?\s+"
    rf"(?P<source>{_PHRASE})\s+(?:to|into)\s+(?P<target>{_PHRASE}){_PHRASE_END}"
)
_BOTH_WAYS = re.compile(r"\b(?:and back|vice versa|back and forth|both ways|either way|and the reverse)\b")
_AND_TO = re.compile(rf"\band\s+(?P<source>{_PHRASE})\s+(?:to|into)\s+(?P<target>{_PHRASE}){_PHRASE_END}")
_FROM_TO = re.compile(rf"\bfrom\s+(?P<source>{_PHRASE})\s+(?:to|into)\s+(?P<target>{_PHRASE}){_PHRASE_END}")
_TIME_OF_DAY = re.compile(r"\b\d{1,2}(?::\d{2})?\s*([ap])\.?m\b")


def direction_swapped(query: str, candidate: str) -> bool:
    """The texts use the same words, but what follows a relation word ("from", "to", "than", ...) differs:
    "from my laptop to a server" / "from a server to my laptop"; or two words or phrases trade places
    around other words, so that who does what to whom changes: "can a tenant do if the landlord breaks
    ..." / "can a landlord do if the tenant breaks ...", "replace a 2-prong outlet with a 3-prong outlet" /
    the reverse. A clause moved as a whole ("In Python, how do I ...?" / "How do I ... in Python?") keeps
    each relation's object and is not a swap; nor are two things exchanged around "and" or "or" ("the walls
    or the attic" / "the attic or the walls")."""
    if conversion_reversed(query, candidate):
        return True
    first, second = _tokens(query), _tokens(candidate)
    if first == second or Counter(first) != Counter(second):
        return False
    return _relation_objects(first) != _relation_objects(second) or _roles_exchanged(first, second)


def conversion_reversed(query: str, candidate: str) -> bool:
    """Each text asks to go from one thing to another ("convert a String to an integer", "move my files
    from Dropbox to Google Drive") and the other text goes the other way, in whatever words ("turn an
    integer into a String"): the same-words check above misses a reversal that is also reworded. Things
    are compared by their last word, singular ("a String" / "strings"); a text that goes both ways ("and
    back", "vice versa") reverses nothing."""
    first, second = _conversions(query), _conversions(candidate)
    return any(
        (target, source) in second and (source, target) not in second for source, target in first
    ) and not (_both_ways(first) or _both_ways(second))


def _both_ways(conversions: set[tuple[str, str]]) -> bool:
    return any((target, source) in conversions for source, target in conversions)


def _conversions(text: str) -> set[tuple[str, str]]:
    lowered = text.lower().replace("’", "'")
    found = _matched_conversions(lowered, _CONVERT_TO) | _matched_conversions(lowered, _FROM_TO)
    if found:  # "... and Y to X" only continues a conversion
        found |= _matched_conversions(lowered, _AND_TO)
    if _BOTH_WAYS.search(lowered):  # "JSON to YAML and back": either way
        found |= {(target, source) for source, target in found}
    return found


def _matched_conversions(lowered: str, pattern: re.Pattern[str]) -> set[tuple[str, str]]:
    heads = ((_head(match["source"]), _head(match["target"])) for match in pattern.finditer(lowered))
    return {(source, target) for source, target in heads if source and target and source != target}


def _head(phrase: str) -> str:
    words = [word for word in _tokens(phrase) if word not in _FILLER]
    return _singular(words[-1]) if words else ""


def opposite_swapped(query: str, candidate: str) -> bool:
    """One text says a word or phrase and the other its opposite ("closest" / "farthest", "upload" /
    "download"), where the first text does not also say the opposite (as in "pros and cons")."""
    first, second = _phrase_text(query), _phrase_text(candidate)
    for one, other in OPPOSITES:
        for left, right in ((one, other), (other, one)):
            if (
                _has(first, left)
                and not _has(first, right)
                and _has(second, right)
                and not _has(second, left)
            ):
                return True
    return False


def unit_or_period_differs(query: str, candidate: str) -> bool:
    """Both texts name units or periods, and not the same ones ("km" / "miles", "per day" / "per year",
    "5am" / "5pm"). A unit on one side only is context more often than a changed question ("I've been
    trying for weeks: how do I ...?"), so it is left to the verifier."""
    first, second = _units(query), _units(candidate)
    return bool(first) and bool(second) and first != second


def _tokens(text: str) -> list[str]:
    return _TOKEN.findall(text.lower().replace("’", "'"))


def _relation_objects(tokens: list[str]) -> Counter[tuple[str, str]]:
    """(relation word, the first content word after it) for each relation word in the text."""
    objects: Counter[tuple[str, str]] = Counter()
    for index, token in enumerate(tokens):
        if token not in _RELATIONS:
            continue
        following = next((word for word in tokens[index + 1 :] if word not in _FILLER), None)
        if following is not None:
            objects[(token, following)] += 1
    return objects


def _roles_exchanged(first: list[str], second: list[str]) -> bool:
    """`second` is `first` with two short runs of words X and Y (the names of who or what plays a role, at most
    `_MAX_ROLE_WORDS` each) exchanged around a middle M that is not just "and" / "or" (X M Y -> Y M X). An
    empty middle is a clause moved, and longer runs are clauses put in another order, not roles exchanged."""
    start = next(index for index, (one, other) in enumerate(zip(first, second, strict=True)) if one != other)
    end = len(first)
    while first[end - 1] == second[end - 1]:
        end -= 1
    window, swapped = first[start:end], second[start:end]
    for head in range(1, min(len(window), _MAX_ROLE_WORDS + 1)):
        for tail in range(1, min(len(window) - head, _MAX_ROLE_WORDS + 1)):
            middle = window[head : len(window) - tail]
            if swapped == window[len(window) - tail :] + middle + window[:head]:
                return not all(word in _SYMMETRIC for word in middle)
    return False


def _phrase_text(text: str) -> str:
    return " " + " ".join(_tokens(text)) + " "


def _has(text: str, phrase: str) -> bool:
    return f" {phrase} " in text


def _units(text: str) -> frozenset[str]:
    lowered = text.lower()
    found = {f"{letter}m" for letter in _TIME_OF_DAY.findall(lowered)}
    lowered = _TIME_OF_DAY.sub(" ", lowered)
    for token in _tokens(lowered):
        unit = _UNITS.get(token, _UNITS.get(_singular(token)))
        if unit is not None:
            found.add(unit)
    for number_unit in re.findall(r"\d+(?:\.\d+)?\s*(°\s*[cf]|[a-z]+)\b", lowered):  # "5km", "20°C"
        key = number_unit.replace("°", "").replace(" ", "")
        unit = _AFTER_A_NUMBER.get(key)
        unit = unit or _UNITS.get(key, _UNITS.get(_singular(key)))
        if unit is not None:
            found.add(unit)
    return frozenset(found)


def _singular(word: str) -> str:
    if word.endswith("ies") and len(word) > 4:
        return word[:-3] + "y"
    if word.endswith("es") and word[:-2].endswith(("ch", "sh", "x", "s")):
        return word[:-2]
    if word.endswith("s") and not word.endswith("ss") and len(word) > 2:
        return word[:-1]
    return word
