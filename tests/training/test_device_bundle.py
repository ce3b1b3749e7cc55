from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from semantic.embedding.embedder_source import packaged_model_dir
from semantic.rule.profiles import VERIFIER_WEIGHTS
from semantic.verifier.minilm import encode_pairs, load_tokenizer, trained_classifier
from training.bundle_files import quantised_rows
from training.english_bundle import TOKENIZER_FILES
from training.evaluators import selection_score
from training.train_on_device import bundled_classifier


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
        shipped = trained_classifier(VERIFIER_WEIGHTS, base)(**batch)
        bundled = bundled_classifier(bundle, VERIFIER_WEIGHTS).eval()(**batch)
    assert torch.allclose(shipped, bundled, atol=0.1)


def test_selection_score_charges_precision_below_each_bar() -> None:
    clean = {"chatbot/recall": 0.6, "chatbot/precision": 0.995, "reviewed/precision": 0.97}
    sloppy = {**clean, "reviewed/precision": 0.93}
    assert selection_score(clean) > 0.59
    assert selection_score(sloppy) < selection_score(clean) - 0.4


@pytest.mark.slow
def test_a_multilingual_bundle_scores_as_the_shipped_verifier(tmp_path: Path) -> None:
    """The one trainer reads the multilingual profile's bundle (int8 encoder, the vocabulary as JSON) into the
    network the cache serves: the bundle's tokenizer gives the engine's ids, the network close logits."""
    from semantic.rule.profiles import MULTILINGUAL_WEIGHTS
    from semantic.verifier.e5_network import E5Network
    from semantic.verifier.e5_torch import encode_e5_pairs
    from training.device_profiles import MULTILINGUAL_DEVICE
    from training.multilingual_bundle import write_base

    pairs = [
        ("快递显示已签收但我没收到怎么办", "包裹显示签收了可是我根本没拿到"),
        ("¿Cómo cambio mi contraseña?", "Olvidé mi clave"),
    ]
    write_base(tmp_path / "base", sorted({text for pair in pairs for text in pair}))
    tokenizer = MULTILINGUAL_DEVICE.tokenizer(tmp_path / "base")
    shipped = E5Network(MULTILINGUAL_WEIGHTS, runtime="torch")
    batch = encode_e5_pairs(tokenizer, pairs, 96)
    assert torch.equal(batch["input_ids"], encode_e5_pairs(shipped.tokenizer, pairs, 96)["input_ids"])
    with torch.no_grad():
        bundled = bundled_classifier(tmp_path / "base", MULTILINGUAL_WEIGHTS, MULTILINGUAL_DEVICE).eval()
        assert torch.allclose(shipped.model(**batch), bundled(**batch), atol=0.1)
