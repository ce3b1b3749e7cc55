"""The verifier's network: MiniLM over a pair of texts, one logit; how to build, load, save and feed it.

Kept apart from `semantic/rule/verifier.py` (which runs it in the cache, on ONNX Runtime or torch) so that
training (`training/`) can build the same network with torch and transformers alone, on any machine.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from torch import nn
from transformers import AutoTokenizer, BertConfig, BertModel, PreTrainedTokenizerBase

# Frozen during fine-tuning and read from the installed base model: 30522 x 384 floats, most of the size.
FROZEN_PREFIX = "encoder.embeddings.word_embeddings."


class PairClassifier(nn.Module):
    """MiniLM over `[CLS] a [SEP] b [SEP]`, mean-pooled, then one logit: same meaning or not."""

    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.encoder = BertModel(config, add_pooling_layer=False)
        self.dropout = nn.Dropout(0.1)
        self.head = nn.Linear(config.hidden_size, 1)

    def forward(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, token_type_ids: torch.Tensor
    ) -> torch.Tensor:
        hidden = self.encoder(
            input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids
        ).last_hidden_state  # (B, T, H)
        mask = attention_mask.unsqueeze(-1).to(hidden.dtype)  # (B, T, 1)
        pooled = (hidden * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1.0)  # (B, H)
        logits: torch.Tensor = self.head(self.dropout(pooled)).squeeze(-1)  # (B,)
        return logits


def load_tokenizer(base_dir: Path) -> PreTrainedTokenizerBase:
    tokenizer: PreTrainedTokenizerBase = AutoTokenizer.from_pretrained(str(base_dir), local_files_only=True)
    return tokenizer


def load_base_classifier(base_dir: Path) -> PairClassifier:
    """A PairClassifier whose encoder holds the base MiniLM weights and whose head is untrained."""
    config = BertConfig.from_pretrained(str(base_dir), local_files_only=True)
    model = PairClassifier(config)
    # The sentence model's pooler is unused here; everything else must be present.
    base = {
        name: tensor
        for name, tensor in load_file(str(base_dir / "model.safetensors")).items()
        if not name.startswith("pooler.")
    }
    missing, _ = model.encoder.load_state_dict(base, strict=False)
    if [name for name in missing if not name.endswith("position_ids")]:
        raise ValueError(f"base model {base_dir} lacks {missing[:3]}")
    return model


def load_trained_weights(model: PairClassifier, weights: Path) -> None:
    """Overlay the fine-tuned weights; every trainable tensor must be in the file (the word embeddings may
    be, when they were trained too)."""
    trained = {name: tensor.float() for name, tensor in load_file(str(weights)).items()}
    expected = {name for name in model.state_dict() if not name.startswith(FROZEN_PREFIX)}
    missing = expected - trained.keys() - {"encoder.embeddings.position_ids"}
    unexpected = {name for name in trained.keys() - expected if not name.startswith(FROZEN_PREFIX)}
    if missing or unexpected:
        raise ValueError(
            f"verifier weights {weights} do not fit: missing {sorted(missing)[:3]}, "
            f"unexpected {sorted(unexpected)[:3]}"
        )
    model.load_state_dict(trained, strict=False)


def save_trained_weights(model: PairClassifier, weights: Path, word_embeddings: bool = False) -> None:
    """Write every tensor, as fp16, except the word embeddings unless they were trained (`word_embeddings`)."""
    weights.parent.mkdir(parents=True, exist_ok=True)
    tensors = {
        name: tensor.detach().to(torch.float16).contiguous()
        for name, tensor in model.state_dict().items()
        if (word_embeddings or not name.startswith(FROZEN_PREFIX)) and not name.endswith("position_ids")
    }
    save_file(tensors, str(weights))


def encode_pairs(
    tokenizer: PreTrainedTokenizerBase, pairs: Sequence[tuple[str, str]], max_tokens: int
) -> dict[str, torch.Tensor]:
    """Tokenise `[CLS] a [SEP] b [SEP]`, truncating the longer text first, padded to the batch."""
    encoded = tokenizer(
        [first for first, _ in pairs],
        [second for _, second in pairs],
        truncation="longest_first",
        max_length=max_tokens,
        padding=True,
        return_tensors="pt",
    )
    return {key: encoded[key] for key in ("input_ids", "attention_mask", "token_type_ids")}
