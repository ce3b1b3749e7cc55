"""Sentence embeddings for the semantic cache: a sentence-transformers model, normalised, on CPU.

Knows how to load and run the embedder; knows nothing about Redis, FAISS or HTTP.
"""

from __future__ import annotations

from typing import Protocol

import numpy as np
import numpy.typing as npt
from sentence_transformers import SentenceTransformer

from semantic.embedder_source import EmbedderSource

Vectors = npt.NDArray[np.float32]


class Embedder(Protocol):
    """What the cache needs of an embedder."""

    name: str
    dimension: int
    max_tokens: int

    def embed(self, texts: list[str]) -> Vectors: ...

    def token_counts(self, texts: list[str]) -> list[int]:
        """How many tokens (special ones included) the embedder would see per text, before truncation."""
        ...


class SentenceEmbedder:
    """A sentence-transformers model whose vectors are L2-normalised (inner product == cosine)."""

    def __init__(self, source: EmbedderSource) -> None:
        self.name = source.name
        self._model = SentenceTransformer(source.location, device="cpu", local_files_only=source.local)
        dimension = self._model.get_embedding_dimension()
        if dimension is None:
            raise ValueError(f"embedder {source.name} does not report its dimension")
        self.dimension: int = dimension
        # Texts longer than this are truncated by the model; the cache must know to avoid them.
        self.max_tokens: int = self._model.max_seq_length or self._model.tokenizer.model_max_length

    def embed(self, texts: list[str]) -> Vectors:
        """Embed a batch of texts: float32 array of shape (len(texts), dimension), unit rows."""
        vectors = self._model.encode(
            texts, batch_size=64, convert_to_numpy=True, normalize_embeddings=True, show_progress_bar=False
        )
        return np.asarray(vectors, dtype=np.float32)

    def token_counts(self, texts: list[str]) -> list[int]:
        """Word pieces per text, [CLS] and [SEP] included: more than `max_tokens` means truncation."""
        encoded = self._model.tokenizer(texts, add_special_tokens=True, truncation=False, verbose=False)
        return [len(ids) for ids in encoded["input_ids"]]
