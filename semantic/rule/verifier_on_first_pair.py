"""A verifier that loads when the first pair comes to it, not when the process starts.

The multilingual verifier is about 200 MB of a process (multilingual-e5-small's layers on ONNX Runtime and
its tokenizer), and a deployment whose traffic is English never runs it. Loaded on the first pair it must
score, on the thread that scores (the cache's inference thread), once, under a lock; that pair waits for the
load (about 0.6 s on a 2-core machine), and every pair after it runs as on a verifier loaded at start. The
scores are the same either way: the same weights, runtime and threads.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence

import numpy as np
import numpy.typing as npt

from semantic.embedding.onnx_runtime import RuntimeChoice
from semantic.rule.calibrated_rule import PairScorer


class LoadsOnFirstPair:
    """A `PairScorer` that calls `load` the first time it scores (or when `load_now` is called)."""

    def __init__(self, name: str, load: Callable[[], PairScorer]) -> None:
        self._name = name
        self._load = load
        self._lock = threading.Lock()
        self._verifier: PairScorer | None = None

    @property
    def name(self) -> str:
        return self._name

    @property
    def loaded(self) -> bool:
        return self._verifier is not None

    @property
    def runtime(self) -> RuntimeChoice | None:
        """Where it runs once loaded (None before)."""
        runtime: RuntimeChoice | None = getattr(self._verifier, "runtime", None)
        return runtime

    def load_now(self) -> PairScorer:
        verifier = self._verifier
        if verifier is None:
            with self._lock:
                if self._verifier is None:
                    self._verifier = self._load()
                verifier = self._verifier
        return verifier

    def probabilities(
        self, pairs: Sequence[tuple[str, str]], batch_size: int = 64
    ) -> npt.NDArray[np.float32]:
        return self.load_now().probabilities(pairs, batch_size)
