"""Each prompt is embedded by the model that reads its language, into scopes of that model's own."""

from __future__ import annotations

import numpy as np
import pytest

from semantic.embedding.embedder import Vectors
from semantic.language_routing import LanguageRoutedEmbedder, served_embedder


class ConstantEmbedder:
    """Every text to one unit vector along `axis`, and `tokens` tokens per text; records what it embedded."""

    def __init__(self, name: str, axis: int, tokens: int, dimension: int = 4, max_tokens: int = 128) -> None:
        self.name = name
        self.dimension = dimension
        self.max_tokens = max_tokens
        self.axis = axis
        self.tokens = tokens
        self.seen: list[str] = []

    def embed(self, texts: list[str]) -> Vectors:
        self.seen.extend(texts)
        out = np.zeros((len(texts), self.dimension), dtype=np.float32)
        out[:, self.axis] = 1.0
        return out

    def token_counts(self, texts: list[str]) -> list[int]:
        return [self.tokens] * len(texts)


def routed() -> tuple[LanguageRoutedEmbedder, ConstantEmbedder, ConstantEmbedder]:
    english = ConstantEmbedder("minilm", axis=0, tokens=5, max_tokens=256)
    multilingual = ConstantEmbedder("e5", axis=1, tokens=9, max_tokens=512)
    return LanguageRoutedEmbedder(english, multilingual, ("zh", "ja")), english, multilingual


def test_prompts_go_to_the_model_of_their_language_in_their_order() -> None:
    embedder, english, multilingual = routed()
    texts = [
        "How do I reset my password?",
        "怎样才能不晕车？",
        "Wie setze ich mein Passwort zurück?",
        "京都の紅葉はいつ見頃ですか？",
    ]
    vectors = embedder.embed(texts)
    assert vectors[:, 0].tolist() == [1.0, 0.0, 1.0, 0.0]  # English and German (not routed): MiniLM
    assert vectors[:, 1].tolist() == [0.0, 1.0, 0.0, 1.0]
    assert english.seen == [texts[0], texts[2]] and multilingual.seen == [texts[1], texts[3]]
    assert embedder.token_counts(texts) == [5, 9, 5, 9]
    assert embedder.max_tokens == 256  # a text either model would cut gets no vector


def test_each_routed_language_has_an_identity_of_its_own() -> None:
    embedder, _, _ = routed()
    assert embedder.identity("How do I reset my password?") == "minilm"  # English scopes are unchanged
    assert embedder.identity("怎样才能不晕车？") == "e5/zh"
    assert embedder.identity("京都の紅葉はいつ見頃ですか？") == "e5/ja"
    assert embedder.identity("Wie setze ich mein Passwort zurück?") == "minilm"
    assert embedder.name == "minilm"


def test_models_of_different_dimensions_are_refused() -> None:
    with pytest.raises(ValueError, match="one dimension"):
        LanguageRoutedEmbedder(ConstantEmbedder("a", 0, 1), ConstantEmbedder("b", 0, 1, dimension=8), ("zh",))


def test_no_routed_language_keeps_the_english_embedder_alone() -> None:
    english = ConstantEmbedder("minilm", axis=0, tokens=5)
    assert served_embedder(english, ()) is english
