"""The English embedder and verifier share one memory-mapped word table (`semantic/embedding/word_table.py`):
what they compute is bit for bit what their exported files compute alone."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from safetensors.numpy import save_file

from semantic.embedding.embedder import SentenceEmbedder
from semantic.embedding.embedder_source import DEFAULT_EMBEDDER_NAME, packaged_model_dir, resolve_embedder
from semantic.embedding.onnx_runtime import OnnxEncoder
from semantic.embedding.word_table import GRAPH_NAME, shared_word_table, word_table
from semantic.rule.profiles import VERIFIER_WEIGHTS
from semantic.verifier.minilm import MiniLMNetwork

TEXTS = ["What is the capital city of France?", "how do i reset my router", "Ünïcödé 東京", "a " * 300]
PAIRS = [
    ("How do I reset my password?", "How can I reset my password?"),
    ("Is tea healthy?", "Why is the sky blue?"),
]


def test_the_embedder_and_the_verifier_compute_what_their_files_compute_alone() -> None:
    embedder = SentenceEmbedder(resolve_embedder(DEFAULT_EMBEDDER_NAME), "onnx")
    onnx = embedder._onnx
    assert onnx is not None and onnx._encoder._shared  # the shared table is in use
    alone = OnnxEncoder(onnx.path)  # the same file with its own copy of the table
    batch = onnx.word_pieces.batch(TEXTS)
    assert np.array_equal(onnx._encoder.run(batch), alone.run(batch))

    verifier = MiniLMNetwork(VERIFIER_WEIGHTS, runtime="onnx")
    assert verifier._onnx is not None and verifier._word_pieces is not None and verifier._onnx._shared
    pairs = verifier._word_pieces.batch([a for a, _ in PAIRS], [b for _, b in PAIRS])
    assert np.array_equal(verifier._onnx.run(pairs), OnnxEncoder(verifier._onnx.path).run(pairs))


def test_one_read_only_map_of_the_installed_weights() -> None:
    base = packaged_model_dir() / "model.safetensors"
    table = word_table(base)
    assert table is not None and table.shape == (30522, 384) and not table.flags.writeable
    assert word_table(base) is table  # one map per process, whichever session asks


def test_fine_tuned_word_embeddings_are_never_replaced_by_the_base_table(tmp_path: Path) -> None:
    trained = tmp_path / "trained.safetensors"
    save_file(
        {GRAPH_NAME: np.zeros((4, 384), dtype=np.float32), "head.bias": np.zeros(1, np.float32)}, str(trained)
    )
    base = packaged_model_dir() / "model.safetensors"
    assert shared_word_table(base, trained) == {}
    assert list(shared_word_table(base, VERIFIER_WEIGHTS)) == [
        GRAPH_NAME
    ]  # the shipped verifier's are frozen
    assert word_table(tmp_path / "model.bin") is None
