"""The shipped verifier: small, loadable offline on top of the base model, symmetric, and sensible."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from semantic.embedding.embedder_source import packaged_model_dir
from semantic.rule.profiles import ENGLISH, VERIFIER_WEIGHTS
from semantic.verifier.minilm import (
    encode_pairs,
    load_base_classifier,
    load_tokenizer,
    load_trained_weights,
    save_trained_weights,
)
from semantic.verifier.pair_classifier import FROZEN_PREFIX
from semantic.verifier.pair_verifier import PairVerifier


@pytest.fixture(scope="module")
def verifier() -> PairVerifier:
    return ENGLISH.verifier()


def test_shipped_weights_are_small_fp16_and_leave_out_the_word_embeddings() -> None:
    assert VERIFIER_WEIGHTS.stat().st_size < 25 * 2**20
    tensors = load_file(str(VERIFIER_WEIGHTS))
    assert not [name for name in tensors if name.startswith(FROZEN_PREFIX)]
    assert {tensor.dtype for tensor in tensors.values()} == {torch.float16}
    assert "head.weight" in tensors


def test_scores_are_probabilities_close_to_symmetric(verifier: PairVerifier) -> None:
    pairs = [
        ("How do I learn Python?", "What is the best way to learn Python?"),
        ("Is tea healthy?", "Why is the sky blue?"),
    ]
    forward = verifier.probabilities(pairs)
    backward = verifier.probabilities([(second, first) for first, second in pairs])
    assert ((forward >= 0) & (forward <= 1)).all()
    assert forward == pytest.approx(backward, abs=0.2)  # trained on both orders


def test_paraphrase_outscores_unrelated_questions(verifier: PairVerifier) -> None:
    query = "How do I reset my password?"
    paraphrase = verifier.probability(query, "How can I reset my password?")
    unrelated = [
        verifier.probability(query, text) for text in ("What is the capital of France?", "Is tea healthy?")
    ]
    # Not asserted: a topical neighbour ("How do I delete my account?") still scores as high as the
    # paraphrase with the shipped weights; the guards and the calibrated threshold carry that case.
    assert paraphrase > 0.5 > max(unrelated)


def test_saved_weights_reload_to_the_same_outputs(tmp_path: Path) -> None:
    torch.manual_seed(0)
    base = packaged_model_dir()
    model = load_base_classifier(base).eval()
    torch.nn.init.normal_(model.head.weight)  # a head that is not the default init
    path = tmp_path / "weights.safetensors"
    save_trained_weights(model, path)
    reloaded = load_base_classifier(base).eval()
    load_trained_weights(reloaded, path)
    batch = encode_pairs(load_tokenizer(base), [("a cat", "a dog"), ("one", "two three")], 32)
    with torch.inference_mode():
        assert torch.allclose(model(**batch), reloaded(**batch), atol=0.05)


def test_weights_missing_a_layer_are_refused(tmp_path: Path) -> None:
    tensors = load_file(str(VERIFIER_WEIGHTS))
    del tensors["head.weight"]
    path = tmp_path / "broken.safetensors"

    save_file(tensors, str(path))
    with pytest.raises(ValueError, match="do not fit"):
        load_trained_weights(load_base_classifier(packaged_model_dir()), path)


def test_trained_word_embeddings_are_saved_and_loaded_when_asked(tmp_path: Path) -> None:
    base = packaged_model_dir()
    model = load_base_classifier(base).eval()
    with torch.no_grad():
        model.encoder.embeddings.word_embeddings.weight[:10] += 0.5  # as if the embeddings were trained
    path = tmp_path / "weights.safetensors"
    save_trained_weights(model, path, word_embeddings=True)
    assert [name for name in load_file(str(path)) if name.startswith(FROZEN_PREFIX)]
    reloaded = load_base_classifier(base).eval()
    load_trained_weights(reloaded, path)
    assert torch.allclose(
        reloaded.encoder.embeddings.word_embeddings.weight[:10],
        model.encoder.embeddings.word_embeddings.weight[:10],
        atol=1e-2,
    )
