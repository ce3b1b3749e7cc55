"""A sentence-transformers embedder run on ONNX Runtime: tokenizer, exported encoder, mean pooling, L2 norm.

Only the pipeline kvgate ships (a BERT-like `Transformer`, mean `Pooling`, optional `Normalize`) is exported;
any other pipeline raises `NotExportable` and the caller keeps it on torch. The export records what the
pipeline needs at run time (longest input, dimension, whether to normalise) in a JSON file beside the ONNX
file, so a later start loads only the tokenizer (`tokenizers` alone: `word_pieces.py`) and the ONNX file,
never torch or transformers.
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from semantic.embedding.onnx_runtime import OnnxEncoder, export_encoder, exported, weights_digest
from semantic.embedding.word_pieces import WordPieces
from semantic.embedding.word_table import shared_word_table

Vectors = npt.NDArray[np.float32]
_WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")
# Texts per encoder call in a large batch (sentence-transformers' default batch size).
_CHUNK = 32


class NotExportable(Exception):
    """This embedder cannot run on ONNX Runtime here; the message says why."""


@dataclass(frozen=True, slots=True)
class PipelineShape:
    """What running the exported encoder needs to reproduce the sentence-transformers pipeline."""

    max_tokens: int
    dimension: int
    normalize: bool


class OnnxSentenceModel:
    """Embeds like the sentence-transformers pipeline it was exported from (vectors equal to ~1e-6)."""

    def __init__(self, name: str, folder: Path, export_dir: Path, threads: int = 1) -> None:
        weights = next((folder / name for name in _WEIGHT_FILES if (folder / name).is_file()), None)
        if weights is None:
            raise NotExportable(f"{folder} has no {' or '.join(_WEIGHT_FILES)} to export")
        stem = f"embedder-{_safe(name)}-{weights_digest(weights)}"
        shape_file = export_dir / f"{stem}.json"
        model_file = exported(export_dir / f"{stem}.onnx", lambda path: _export(folder, path, shape_file))
        if not shape_file.is_file():  # an export from a crashed start without its shape: redo both
            model_file.unlink()
            model_file = exported(model_file, lambda path: _export(folder, path, shape_file))
        self.shape = PipelineShape(**json.loads(shape_file.read_text(encoding="utf-8")))
        self.path = model_file
        self.word_pieces = WordPieces(folder, self.shape.max_tokens)  # transformers' ids, no transformers
        # The word table from the installed weights, mapped once and shared with the verifier's session.
        self._encoder = OnnxEncoder(model_file, threads, shared_word_table(weights))

    def embed(self, texts: list[str]) -> Vectors:
        """(len(texts), dimension) float32, unit rows when the pipeline normalises.

        Texts run in chunks of similar length (sorted by characters, as sentence-transformers' `encode`
        sorts), so one long text does not pad a whole batch: 600 Quora questions embedded in 3.5 s instead
        of 21.1 s as one batch, the same vectors. The order is restored at the end.
        """
        if len(texts) <= _CHUNK:
            return self._embed_chunk(texts)
        order = sorted(range(len(texts)), key=lambda index: len(texts[index]))
        vectors = np.empty((len(texts), self.shape.dimension), dtype=np.float32)
        for start in range(0, len(order), _CHUNK):
            chunk = order[start : start + _CHUNK]
            vectors[chunk] = self._embed_chunk([texts[index] for index in chunk])
        return vectors

    def _embed_chunk(self, texts: list[str]) -> Vectors:
        encoded = self.word_pieces.batch(texts)
        hidden = self._encoder.run(encoded)  # (B, T, H)
        mask = encoded["attention_mask"][..., None].astype(np.float32)  # (B, T, 1)
        pooled = (hidden * mask).sum(axis=1) / np.maximum(mask.sum(axis=1), 1e-9)  # (B, H)
        if self.shape.normalize:
            pooled /= np.maximum(np.linalg.norm(pooled, axis=1, keepdims=True), 1e-12)
        vectors: Vectors = pooled.astype(np.float32, copy=False)
        return vectors


def _export(folder: Path, path: Path, shape_file: Path) -> None:
    from sentence_transformers import SentenceTransformer
    from torch import nn

    model: Any = SentenceTransformer(str(folder), device="cpu", local_files_only=True)  # modules by index
    modules = [type(module).__name__ for module in model]
    pooling = model[1].get_config_dict().get("pooling_mode") if len(modules) > 1 else None
    if (
        modules[:2] != ["Transformer", "Pooling"]
        or modules[2:] not in ([], ["Normalize"])
        or pooling != "mean"
    ):
        raise NotExportable(f"pipeline {modules} with pooling {pooling!r} is not the exported kind")
    if getattr(model[0], "do_lower_case", False):
        raise NotExportable("a lower-casing Transformer module is not the exported kind")
    encoder = model[0].auto_model

    class LastHidden(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.encoder = encoder

        def forward(self, input_ids, attention_mask, token_type_ids):  # type: ignore[no-untyped-def]
            return self.encoder(
                input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids
            ).last_hidden_state

    sample = model.tokenizer(["an example", "a second, longer example"], padding=True, return_tensors="pt")
    if "token_type_ids" not in sample:
        raise NotExportable("the tokenizer gives no token_type_ids (not a BERT-like encoder)")
    export_encoder(LastHidden(), sample, path, "last_hidden_state", {0: "batch", 1: "tokens"})
    dimension = model.get_embedding_dimension()
    if not dimension or not model.max_seq_length:
        raise NotExportable("the model reports no dimension or no longest input")
    shape = PipelineShape(int(model.max_seq_length), int(dimension), modules[2:] == ["Normalize"])
    shape_file.write_text(json.dumps(asdict(shape)) + "\n", encoding="utf-8")


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", name)[:64]
