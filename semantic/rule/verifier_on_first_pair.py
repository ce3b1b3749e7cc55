"""A verifier that loads when the first pair comes to it, not when the process starts.

The multilingual verifier is about 200 MB of a process (multilingual-e5-small's layers on ONNX Runtime and
its tokenizer), and a deployment whose traffic is English never runs it. It loads once, under a lock: on a
thread of its own when the cache first has a pair for it (`loading()`: the lookup waits for it off the
inference thread, so that other lookups go on meanwhile; ONNX Runtime builds the session without the GIL),
or on the caller's thread when something scores before that (evaluation). The pair that asked waits for the
load (0.6-1.2 s on a 2-core machine); every pair after it runs as on a verifier loaded at start. The scores
are the same either way: the same weights, runtime and threads.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future

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
        self._loading: Future[PairScorer] | None = None

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

    def loading(self) -> Future[PairScorer]:
        """The load, started on a thread of its own the first time (done at once when already loaded)."""
        with self._lock:
            if self._loading is None:
                self._loading = Future()
                if self._verifier is not None:
                    self._loading.set_result(self._verifier)
                else:
                    threading.Thread(target=self._load_into, args=(self._loading,), daemon=True).start()
            return self._loading

    def _load_into(self, future: Future[PairScorer]) -> None:
        try:
            future.set_result(self.load_now())
        except BaseException as error:  # the waiting lookups see it; the next `loading()` tries again
            with self._lock:
                self._loading = None
            future.set_exception(error)

    def probabilities(
        self, pairs: Sequence[tuple[str, str]], batch_size: int = 64
    ) -> npt.NDArray[np.float32]:
        return self.load_now().probabilities(pairs, batch_size)
