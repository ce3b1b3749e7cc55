"""Sentence embeddings for the semantic cache: a sentence-transformers model, normalised, on CPU.

The model runs on ONNX Runtime when it can (`semantic/embedding/onnx_embedder.py`: same vectors, about 3.5x faster
for one short prompt), else on torch, and says which and why in `runtime`. Knows how to load and run the
embedder; knows nothing about Redis, FAISS or HTTP.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Protocol

import numpy as np
import numpy.typing as npt

from semantic.embedding.embedder_source import EmbedderSource
from semantic.embedding.onnx_embedder import NotExportable, OnnxSentenceModel
from semantic.embedding.onnx_runtime import RuntimeChoice, choose_runtime, default_export_dir

logger = logging.getLogger("kvgate.semantic")

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
    """A sentence-transformers model whose vectors are L2-normalised (inner product == cosine).

    `runtime`: `auto` (ONNX Runtime when installed and the model exports, else torch), `onnx` or `torch`.
    Exports are cached in `export_dir` (default: the gateway's model directory).
    """

    def __init__(
        self,
        source: EmbedderSource,
        runtime: str = "auto",
        export_dir: Path | None = None,
        threads: int = 1,
    ) -> None:
        self.name = source.name
        choice = choose_runtime(runtime)
        self._onnx: OnnxSentenceModel | None = None
        if choice.runtime == "onnx":
            try:
                if not source.present:
                    raise NotExportable(f"{source.location} is not a local folder")
                self._onnx = OnnxSentenceModel(
                    source.name, Path(source.location), export_dir or default_export_dir(), threads
                )
            except NotExportable as error:
                if runtime == "onnx":
                    raise RuntimeError(f"KVGATE_INFERENCE_RUNTIME=onnx but {error}") from error
                choice = RuntimeChoice("torch", str(error))
        self.runtime = choice
        if self._onnx is not None:
            self._model = None
            self.dimension: int = self._onnx.shape.dimension
            self.max_tokens: int = self._onnx.shape.max_tokens
        else:
            from sentence_transformers import SentenceTransformer

            self._model = SentenceTransformer(source.location, device="cpu", local_files_only=source.local)
            dimension = self._model.get_embedding_dimension()
            if dimension is None:
                raise ValueError(f"embedder {source.name} does not report its dimension")
            self.dimension = dimension
            # Texts longer than this are truncated by the model; the cache must know to avoid them.
            self.max_tokens = self._model.max_seq_length or self._model.tokenizer.model_max_length
        logger.info("embedder %s runs on %s (%s)", self.name, choice.runtime, choice.reason)

    def embed(self, texts: list[str]) -> Vectors:
        """Embed a batch of texts: float32 array of shape (len(texts), dimension), unit rows."""
        if self._onnx is not None:
            return self._onnx.embed(texts)
        assert self._model is not None
        vectors = self._model.encode(
            texts, batch_size=64, convert_to_numpy=True, normalize_embeddings=True, show_progress_bar=False
        )
        return np.asarray(vectors, dtype=np.float32)

    def token_counts(self, texts: list[str]) -> list[int]:
        """Word pieces per text, [CLS] and [SEP] included: more than `max_tokens` means truncation."""
        if self._onnx is not None:
            return self._onnx.word_pieces.lengths(texts)
        assert self._model is not None
        encoded = self._model.tokenizer(texts, add_special_tokens=True, truncation=False, verbose=False)
        return [len(ids) for ids in encoded["input_ids"]]
