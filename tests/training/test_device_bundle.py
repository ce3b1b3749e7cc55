from __future__ import annotations

from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from semantic.embedding.embedder_source import packaged_model_dir
from semantic.rule.pair_classifier import encode_pairs, load_tokenizer
from semantic.rule.verifier import WEIGHTS_FILE, trained_classifier
from training.export_device_bundle import TOKENIZER_FILES, quantised_rows
from training.train_on_device import bundled_classifier, selection_score


def test_quantised_rows_are_within_half_a_step() -> None:
    table = torch.randn(50, 16) * torch.linspace(0.01, 3.0, 50)[:, None]
    ids = torch.tensor([0, 7, 49])
    packed = quantised_rows(table, ids)
    restored = packed["rows"].float() * packed["scales"][:, None]
    assert packed["rows"].dtype == torch.int8
    assert torch.all((restored - table[ids]).abs() <= packed["scales"][:, None] / 2 + 1e-7)


def test_bundled_classifier_scores_as_the_shipped_one(tmp_path: Path) -> None:
    """A bundle holding every row the texts use gives the shipped verifier's logits (int8 rows: close)."""
    base = packaged_model_dir()
    tokenizer = load_tokenizer(base)
    pairs = [("How do I reset my password?", "I forgot my password, how can I reset it?")]
    bundle = tmp_path / "base"
    bundle.mkdir()
    for name in TOKENIZER_FILES:
        if (base / name).is_file():
            (bundle / name).write_bytes((base / name).read_bytes())
    weights = load_file(str(base / "model.safetensors"))
    table = weights.pop("embeddings.word_embeddings.weight")
    used = sorted(
        {token for ids in encode_pairs(tokenizer, pairs, 96)["input_ids"].tolist() for token in ids}
    )
    save_file(quantised_rows(table, torch.tensor(used)), str(bundle / "word_embeddings.safetensors"))
    save_file({name: tensor.half() for name, tensor in weights.items()}, str(bundle / "encoder.safetensors"))

    batch = encode_pairs(tokenizer, pairs, 96)
    with torch.no_grad():
        shipped = trained_classifier(WEIGHTS_FILE, base)(**batch)
        bundled = bundled_classifier(bundle, WEIGHTS_FILE).eval()(**batch)
    assert torch.allclose(shipped, bundled, atol=0.1)


def test_selection_score_charges_precision_below_each_bar() -> None:
    clean = {"chatbot/recall": 0.6, "chatbot/precision": 0.995, "reviewed/precision": 0.97}
    sloppy = {**clean, "reviewed/precision": 0.93}
    assert selection_score(clean) > 0.59
    assert selection_score(sloppy) < selection_score(clean) - 0.4
