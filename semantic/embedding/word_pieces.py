"""BERT word pieces from a model folder's `tokenizer.json`, through the `tokenizers` library alone.

transformers' fast tokenizer is this library underneath, set up per call (truncation, padding); importing
transformers and loading `AutoTokenizer` cost a serving process about 150 MB for nothing it uses (measured
with `/proc/self/status`, issue 46). `WordPieces` sets the library up the way transformers does for
`tokenizer(texts[, pairs], padding=True, truncation="longest_first", max_length=N, return_tensors="np")`,
so the ids, masks and token types are the same arrays (`tests/semantic/test_word_pieces.py` compares them).
"""

from __future__ import annotations

import functools
import json
import threading
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import numpy.typing as npt
from tokenizers import Encoding, Tokenizer

Batch = dict[str, npt.NDArray[np.int64]]
FEATURES = ("input_ids", "attention_mask", "token_type_ids")


class WordPieces:
    """A folder's tokenizer, cutting inputs longest-first to `max_tokens` and padding each batch to its longest.

    Every `WordPieces` of one folder (the embedder's, the verifier's) shares one `tokenizers.Tokenizer`, set
    for each call under a lock: an instance holds its vocabulary and merges in Rust, 6-9 MB a copy."""

    def __init__(self, folder: Path, max_tokens: int) -> None:
        self.max_tokens = max_tokens
        self._tokenizer, self._lock = _shared(folder)
        pad_token = _pad_token(folder)
        pad_id = self._tokenizer.token_to_id(pad_token)
        if pad_id is None:
            raise ValueError(f"{folder}/tokenizer.json has no padding token {pad_token!r}")
        self._pad_id, self._pad_token = pad_id, pad_token

    def batch(self, texts: Sequence[str], pairs: Sequence[str] | None = None) -> Batch:
        """Ids, attention mask and token types of `texts` (each with its `pairs` item when given)."""
        inputs = list(texts) if pairs is None else list(zip(texts, pairs, strict=True))
        with self._lock:
            self._tokenizer.enable_truncation(
                self.max_tokens, stride=0, strategy="longest_first", direction="right"
            )
            self._tokenizer.enable_padding(
                direction="right", pad_id=self._pad_id, pad_type_id=0, pad_token=self._pad_token
            )
            encodings = self._tokenizer.encode_batch(inputs, add_special_tokens=True)
        return {
            "input_ids": _matrix(encodings, "ids"),
            "attention_mask": _matrix(encodings, "attention_mask"),
            "token_type_ids": _matrix(encodings, "type_ids"),
        }

    def lengths(self, texts: Sequence[str]) -> list[int]:
        """Word pieces per text, special tokens included, before any cut."""
        with self._lock:
            self._tokenizer.no_truncation()
            self._tokenizer.no_padding()
            encodings = self._tokenizer.encode_batch(list(texts), add_special_tokens=True)
        return [len(encoding.ids) for encoding in encodings]


@functools.cache
def _shared(folder: Path) -> tuple[Tokenizer, threading.Lock]:
    """One tokenizer per folder. The file may carry a training-time setting (all-MiniLM-L6-v2's: cut and
    padded to 128): each call sets its own."""
    return Tokenizer.from_file(str(folder / "tokenizer.json")), threading.Lock()


def _pad_token(folder: Path) -> str:
    """The padding token as transformers reads it: special_tokens_map.json, then tokenizer_config.json."""
    for name in ("special_tokens_map.json", "tokenizer_config.json"):
        path = folder / name
        if path.is_file():
            token = json.loads(path.read_text(encoding="utf-8")).get("pad_token")
            if isinstance(token, dict):
                token = token.get("content")
            if isinstance(token, str):
                return token
    return "[PAD]"


def _matrix(encodings: list[Encoding], field: str) -> npt.NDArray[np.int64]:
    return np.asarray([getattr(encoding, field) for encoding in encodings], dtype=np.int64)
