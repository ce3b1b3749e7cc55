"""The rule kvgate serves: each pair to the rule of the profile its query's language belongs to.

A pair whose query is in a language the multilingual rule judges goes to it (the cache's scopes never mix
languages, `semantic/language_routing.py`); every other pair goes to the English rule, which refuses the
languages it did not measure. Both are `CalibratedRule`s, built from their profiles (`profiles.py`).
"""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import Future
from typing import Any

from semantic.guards import language
from semantic.rule.calibrated_rule import CalibratedRule
from semantic.rule.verdict import ByBatch, HitRule, Verdict
from semantic.rule.verifier_on_first_pair import LoadsOnFirstPair


class LanguageRoutedRule(ByBatch):
    """The served `HitRule`: a pair whose query is in the multilingual rule's languages goes to it, every
    other pair to the English rule."""

    def __init__(self, english: HitRule, multilingual: CalibratedRule) -> None:
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

    def judge_many(
        self, pairs: Sequence[tuple[str, str]], similarities: Sequence[float], strictness: float = 0.0
    ) -> list[Verdict]:
        """Each profile's rule over its own pairs, in one batch each; the verdicts in the pairs' order."""
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

    def verifier_loading(self, query: str) -> Future[Any] | None:
        """The multilingual verifier's load, when `query` would reach it before it has loaded (it loads with
        the first pair it judges: `verifier_on_first_pair.py`); None when there is nothing to wait for."""
        verifier = self.multilingual.verifier
        if not self._routed(query) or not isinstance(verifier, LoadsOnFirstPair) or verifier.loaded:
            return None
        return verifier.loading()

    def _routed(self, query: str) -> bool:
        return language.language_of(query) in self.multilingual.languages


def multilingual_languages(rule: object) -> tuple[str, ...]:
    """The languages `rule` judges with the multilingual models (none unless it is a `LanguageRoutedRule`)."""
    return rule.multilingual.languages if isinstance(rule, LanguageRoutedRule) else ()
