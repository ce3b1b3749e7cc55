"""The verifier: a cross-encoder that reads both prompts together and says whether they ask the same thing.

Sentence embeddings lose the word-level differences that separate hard negatives ("2+2" / "2+3", "in
India" / "in China"); a cross-encoder attends across the two texts and keeps them. `PairVerifier` is the one
class that scores pairs, for every language profile: it batches the pairs and hands each batch to its
`PairNetwork`, which is what differs by base model (MiniLM for English, `semantic/verifier/minilm.py`;
multilingual-e5-small for the six languages, `semantic/verifier/e5_network.py`): tokenizer, runtime, weights.
Knows nothing about thresholds.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Protocol

import numpy as np
import numpy.typing as npt

from semantic.embedding.onnx_runtime import RuntimeChoice

Probabilities = npt.NDArray[np.float32]


class PairNetwork(Protocol):
    """One base model's cross-encoder: P(same meaning) for one batch of (query, candidate) pairs."""

    name: str
    runtime: RuntimeChoice
    # Whether batches are cut from the pairs sorted by length (less padding per batch) or in the order given.
    # Each network keeps the order its shipped calibration was fitted with: a batch's padding moves a score
    # in the fifth decimal, enough to move a pair across a threshold fitted on the other order's scores.
    sorts_by_length: bool

    def probabilities(self, pairs: Sequence[tuple[str, str]]) -> Probabilities: ...


class PairVerifier:
    """Scores (query, candidate) pairs in batches with one profile's network, on CPU (a `PairScorer`)."""

    def __init__(self, network: PairNetwork) -> None:
        self.network = network

    @property
    def name(self) -> str:
        return self.network.name

    @property
    def runtime(self) -> RuntimeChoice:
        """Where the network runs (ONNX Runtime or torch) and why."""
        return self.network.runtime

    def probabilities(self, pairs: Sequence[tuple[str, str]], batch_size: int = 64) -> Probabilities:
        """P(same meaning) for each (query, candidate) pair.

        One order only: training showed each pair in a random order, so the model is close to symmetric,
        and averaging both orders gained < 0.001 AUC (bench/semantic/bench_rule.py) at twice the latency.
        """
        probabilities = np.zeros(len(pairs), dtype=np.float32)
        order = list(range(len(pairs)))
        if self.network.sorts_by_length:
            order.sort(key=lambda index: len(pairs[index][0]) + len(pairs[index][1]))
        for start in range(0, len(order), batch_size):
            chunk = order[start : start + batch_size]
            probabilities[chunk] = self.network.probabilities([pairs[index] for index in chunk])
        return probabilities

    def probability(self, query: str, candidate: str) -> float:
        """P(same meaning) for one pair."""
        return float(self.probabilities([(query, candidate)])[0])

    def time_one(self, query: str, candidate: str, repeats: int = 20) -> float:
        """Median seconds to score one pair, after a warm-up call."""
        self.probability(query, candidate)
        timings = []
        for _ in range(repeats):
            started = time.perf_counter()
            self.probability(query, candidate)
            timings.append(time.perf_counter() - started)
        return float(np.median(timings))
