"""The verifier: a cross-encoder that reads both prompts together and says whether they ask the same thing.

Sentence embeddings lose the word-level differences that separate hard negatives ("2+2" / "2+3", "in
India" / "in China"); a cross-encoder attends across the two texts and keeps them. It is fine-tuned from
the packaged all-MiniLM-L6-v2 encoder in two stages (`training/train_verifier.py`: paraphrase from every
source, then the cache's rubric alone) with the word embeddings frozen, so
kvgate ships only the other weights and the head (`semantic/rule/verifier_weights/`, fp16) and loads them on
top of the installed base model. The network itself (build, load, save, tokenise) is
`semantic/rule/pair_classifier.py`; this module runs it for the cache and knows nothing about thresholds.

It runs on ONNX Runtime when it can (exported at first start from these weights and cached beside the
embedder's export, `semantic/embedding/onnx_runtime.py`), else on torch; `runtime` says which and why.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import numpy.typing as npt
import torch

from semantic.embedding.embedder_source import packaged_model_dir
from semantic.embedding.onnx_runtime import (
    OnnxEncoder,
    RuntimeChoice,
    choose_runtime,
    default_export_dir,
    export_encoder,
    exported,
    quantize_int8,
    weights_digest,
)
from semantic.rule.pair_classifier import (
    PairClassifier,
    encode_pairs,
    load_base_classifier,
    load_tokenizer,
    load_trained_weights,
)

logger = logging.getLogger("kvgate.semantic")

Probabilities = npt.NDArray[np.float32]

WEIGHTS_FILE = Path(__file__).parent / "verifier_weights" / "verifier.safetensors"
DEFAULT_MAX_TOKENS = 96
# Int8 dynamic quantisation (ONNX only): 2.7 ms a pair instead of 6.9 ms, but at the same calibration it moved
# recall by 0.02-0.08 on the shared pair sets (docs/benchmarks.md, hit path), so the shipped rule runs fp32.
INT8_BY_DEFAULT = False


class PairVerifier:
    """Loads the shipped cross-encoder and scores (query, candidate) pairs in batches, on CPU."""

    name = "minilm-cross-encoder"

    def __init__(
        self,
        weights: Path = WEIGHTS_FILE,
        base_dir: Path | None = None,
        max_tokens: int = DEFAULT_MAX_TOKENS,
        *,
        runtime: str = "auto",
        export_dir: Path | None = None,
        threads: int = 1,
        int8: bool = INT8_BY_DEFAULT,
    ) -> None:
        base = base_dir if base_dir is not None else packaged_model_dir()
        self.tokenizer = load_tokenizer(base)
        self.max_tokens = max_tokens
        self.model: PairClassifier | None = None
        self._onnx: OnnxEncoder | None = None
        choice = choose_runtime(runtime)
        if choice.runtime == "onnx":
            self._onnx = OnnxEncoder(
                exported_classifier(weights, base, export_dir or default_export_dir(), int8), threads
            )
            choice = RuntimeChoice("onnx", f"{choice.reason}; {'int8' if int8 else 'fp32'} weights")
        else:
            self.model = trained_classifier(weights, base)
        self.runtime = choice
        logger.info("verifier runs on %s (%s)", choice.runtime, choice.reason)

    def probabilities(self, pairs: Sequence[tuple[str, str]], batch_size: int = 64) -> Probabilities:
        """P(same meaning) for each (query, candidate) pair.

        One order only: training showed each pair in a random order, so the model is close to symmetric,
        and averaging both orders gained < 0.001 AUC (bench/semantic/bench_rule.py) at twice the latency.
        """
        if not pairs:
            return np.zeros(0, dtype=np.float32)
        probabilities: Probabilities = (1.0 / (1.0 + np.exp(-self._logits(pairs, batch_size)))).astype(
            np.float32
        )
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

    def _logits(self, pairs: Sequence[tuple[str, str]], batch_size: int) -> npt.NDArray[np.float32]:
        # Sorting by length keeps padding low inside each batch; the order is restored at the end.
        order = sorted(range(len(pairs)), key=lambda index: len(pairs[index][0]) + len(pairs[index][1]))
        logits = np.empty(len(pairs), dtype=np.float32)
        with torch.inference_mode():
            for start in range(0, len(order), batch_size):
                chunk = order[start : start + batch_size]
                batch = encode_pairs(self.tokenizer, [pairs[index] for index in chunk], self.max_tokens)
                if self._onnx is not None:
                    logits[chunk] = self._onnx.run({key: value.numpy() for key, value in batch.items()})
                else:
                    assert self.model is not None
                    logits[chunk] = self.model(**batch).float().numpy()
        return logits


def trained_classifier(weights: Path, base_dir: Path) -> PairClassifier:
    """The shipped classifier on torch, in eval mode."""
    model = load_base_classifier(base_dir)
    load_trained_weights(model, weights)
    return model.eval()


def exported_classifier(weights: Path, base_dir: Path, export_dir: Path, int8: bool) -> Path:
    """The ONNX file of the trained classifier (int8: dynamically quantised), exported on first use."""
    stem = f"verifier-{weights_digest(weights, base_dir / 'model.safetensors')}"

    def export(path: Path) -> None:
        sample = encode_pairs(
            load_tokenizer(base_dir), [("an example", "a second example")], DEFAULT_MAX_TOKENS
        )
        export_encoder(trained_classifier(weights, base_dir), sample, path, "logits", {0: "batch"})

    fp32 = exported(export_dir / f"{stem}.onnx", export)
    if not int8:
        return fp32
    return exported(export_dir / f"{stem}-int8.onnx", lambda path: quantize_int8(fp32, path))
