"""The English profile's network: the packaged all-MiniLM-L6-v2 encoder fine-tuned as a cross-encoder.

It is fine-tuned in stages (`training/train_verifier.py`: paraphrase from every source, then the cache's
rubric) with the word embeddings frozen, so kvgate ships only the other weights and the head (fp16,
`semantic/rule/verifier_weights/verifier.safetensors`) and lays them over the installed base model. Pairs are
fed as BERT does: `[CLS] a [SEP] b [SEP]`, the longer text cut first, 96 tokens at most.

`MiniLMNetwork` runs it on ONNX Runtime when it can (exported at first start from these weights and cached
beside the embedder's export, `semantic/embedding/onnx_runtime.py`), else on torch; `runtime` says which and
why. The functions build, load, save and feed the network for training too (`training/`).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt

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
from semantic.embedding.word_pieces import WordPieces
from semantic.embedding.word_table import shared_word_table

if TYPE_CHECKING:  # torch and transformers load only for training, `runtime="torch"` and the one-time export
    import torch
    from transformers import PreTrainedTokenizerBase

    from semantic.verifier.pair_classifier import PairClassifier

logger = logging.getLogger("kvgate.semantic")

DEFAULT_MAX_TOKENS = 96
# Int8 dynamic quantisation (ONNX only): 2.7 ms a pair instead of 6.9 ms, but at the same calibration it moved
# recall by 0.02-0.08 on the shared pair sets (docs/benchmarks.md, hit path), so the shipped rule runs fp32.
INT8_BY_DEFAULT = False


class MiniLMNetwork:
    """The fine-tuned MiniLM cross-encoder over the installed base model, on ONNX Runtime or torch."""

    name = "minilm-cross-encoder"
    sorts_by_length = True

    def __init__(
        self,
        weights: Path,
        base_dir: Path | None = None,
        max_tokens: int = DEFAULT_MAX_TOKENS,
        *,
        runtime: str = "auto",
        export_dir: Path | None = None,
        threads: int = 1,
        int8: bool = INT8_BY_DEFAULT,
    ) -> None:
        base = base_dir if base_dir is not None else packaged_model_dir()
        self.max_tokens = max_tokens
        self.model: PairClassifier | None = None
        self._onnx: OnnxEncoder | None = None
        self._word_pieces: WordPieces | None = None
        choice = choose_runtime(runtime)
        if choice.runtime == "onnx":
            self._word_pieces = WordPieces(base, max_tokens)  # transformers' ids, without transformers
            # fp32: the word table is the embedder's, mapped once from the installed base weights.
            shared = {} if int8 else shared_word_table(base / "model.safetensors", weights)
            self._onnx = OnnxEncoder(
                exported_classifier(weights, base, export_dir or default_export_dir(), int8), threads, shared
            )
            choice = RuntimeChoice("onnx", f"{choice.reason}; {'int8' if int8 else 'fp32'} weights")
        else:
            self.tokenizer = load_tokenizer(base)
            self.model = trained_classifier(weights, base)
        self.runtime = choice
        logger.info("verifier runs on %s (%s)", choice.runtime, choice.reason)

    def probabilities(self, pairs: Sequence[tuple[str, str]]) -> npt.NDArray[np.float32]:
        """P(same meaning) for one batch."""
        if self._onnx is not None and self._word_pieces is not None:
            batch = self._word_pieces.batch([first for first, _ in pairs], [second for _, second in pairs])
            logits = np.asarray(self._onnx.run(batch))
        else:
            import torch

            assert self.model is not None
            with torch.inference_mode():
                logits = self.model(**encode_pairs(self.tokenizer, pairs, self.max_tokens)).float().numpy()
        logits = logits.astype(np.float32, copy=False)
        return (1.0 / (1.0 + np.exp(-logits))).astype(np.float32)


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


def load_tokenizer(base_dir: Path) -> PreTrainedTokenizerBase:
    from transformers import AutoTokenizer

    tokenizer: PreTrainedTokenizerBase = AutoTokenizer.from_pretrained(str(base_dir), local_files_only=True)
    return tokenizer


def load_base_classifier(base_dir: Path) -> PairClassifier:
    """A PairClassifier whose encoder holds the base MiniLM weights and whose head is untrained."""
    from safetensors.torch import load_file
    from transformers import BertConfig

    from semantic.verifier.pair_classifier import PairClassifier

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
    from safetensors.torch import load_file

    from semantic.verifier.pair_classifier import FROZEN_PREFIX

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
    import torch
    from safetensors.torch import save_file

    from semantic.verifier.pair_classifier import FROZEN_PREFIX

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
