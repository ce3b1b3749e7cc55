"""One `Embedder` for the cache that embeds each prompt with the model that reads its language.

English (and any prompt the multilingual verifier was not calibrated for) goes to the English embedder,
exactly as before; a prompt in one of `languages` goes to the multilingual one. The two models' vectors are
not comparable, so each multilingual language gets scopes of its own: `identity(prompt)` is the embedder
name a request's scope is built with (`semantic/store/scope.py` digests it into the scope id), so a Chinese
prompt is only ever compared with Chinese prompts stored under the same tenant, model and context, and an
English prompt's scope is the one it always had.
"""

from __future__ import annotations

from collections.abc import Collection

import numpy as np

from semantic.embedding.embedder import Embedder, Vectors
from semantic.guards.language import language_of


class LanguageRoutedEmbedder:
    """English embedder for most prompts, the multilingual one for prompts in `languages`."""

    def __init__(self, english: Embedder, multilingual: Embedder, languages: Collection[str]) -> None:
        if english.dimension != multilingual.dimension:
            raise ValueError(
                f"{english.name} ({english.dimension}) and {multilingual.name} ({multilingual.dimension}) "
                "must give vectors of one dimension: the index is built for one"
            )
        self.english = english
        self.multilingual = multilingual
        self.languages = frozenset(languages)
        self.name = english.name
        self.dimension = english.dimension
        # The smaller of the two: a text either would cut gets no vector (embed_batcher.py).
        self.max_tokens = min(english.max_tokens, multilingual.max_tokens)

    def routed(self, text: str) -> bool:
        """Whether `text` is embedded (and judged) by the multilingual models."""
        return language_of(text) in self.languages

    def identity(self, text: str) -> str:
        """The embedder name `text`'s scope is built with: one scope family per multilingual language."""
        code = language_of(text)
        return f"{self.multilingual.name}/{code}" if code in self.languages else self.english.name

    def embed(self, texts: list[str]) -> Vectors:
        routed = [self.routed(text) for text in texts]
        out = np.zeros((len(texts), self.dimension), dtype=np.float32)
        for use_multilingual, embedder in ((False, self.english), (True, self.multilingual)):
            rows = [row for row, flag in enumerate(routed) if flag == use_multilingual]
            if rows:
                out[rows] = embedder.embed([texts[row] for row in rows])
        return out

    def token_counts(self, texts: list[str]) -> list[int]:
        counts = [0] * len(texts)
        for use_multilingual, embedder in ((False, self.english), (True, self.multilingual)):
            rows = [row for row, text in enumerate(texts) if self.routed(text) == use_multilingual]
            if not rows:
                continue
            for row, count in zip(rows, embedder.token_counts([texts[row] for row in rows]), strict=True):
                counts[row] = count
        return counts


def served_embedder(english: Embedder, languages: Collection[str], threads: int = 1) -> Embedder:
    """`english` alone when no language goes to the multilingual models, else both behind the routing (the
    multilingual profile's embedder, `semantic/rule/profiles.py`)."""
    if not languages:
        return english
    from semantic.rule.profiles import MULTILINGUAL

    return LanguageRoutedEmbedder(english, MULTILINGUAL.embedder(threads), languages)
