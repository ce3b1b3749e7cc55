"""The verifier's network, whatever its base model: a BERT encoder over a pair of texts, mean-pooled, one logit.

Both profiles' verifiers are this network: MiniLM (`semantic/verifier/minilm.py`) and multilingual-e5-small
(`semantic/verifier/e5_network.py`) differ only in the encoder's weights, its tokenizer and how the weights
are stored. Kept to torch and transformers so that training (`training/`) builds the same network on any
machine.
"""

from __future__ import annotations

import torch
from torch import nn
from transformers import BertConfig, BertModel

# Frozen during fine-tuning and read from the base model (MiniLM: 30522 x 384 floats; multilingual-e5:
# 250,037 x 384, 4-bit), most of the size: never in a trained weights file.
FROZEN_PREFIX = "encoder.embeddings.word_embeddings."


class PairClassifier(nn.Module):
    """An encoder over `a` and `b` fed together, mean-pooled, then one logit: same meaning or not."""

    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.encoder = BertModel(config, add_pooling_layer=False)
        self.dropout = nn.Dropout(0.1)
        self.head = nn.Linear(config.hidden_size, 1)

    def forward(
        self,
        input_ids: torch.Tensor | None,
        attention_mask: torch.Tensor,
        token_type_ids: torch.Tensor,
        inputs_embeds: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """One logit per pair; the word vectors come from `input_ids`, or are given (`inputs_embeds`: the
        multilingual network's ONNX export, whose word table stays outside the graph)."""
        hidden = self.encoder(
            input_ids=input_ids,
            attention_mask=attention_mask,
            token_type_ids=token_type_ids,
            inputs_embeds=inputs_embeds,
        ).last_hidden_state  # (B, T, H)
        mask = attention_mask.unsqueeze(-1).to(hidden.dtype)  # (B, T, 1)
        pooled = (hidden * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1.0)  # (B, H)
        logits: torch.Tensor = self.head(self.dropout(pooled)).squeeze(-1)  # (B,)
        return logits
