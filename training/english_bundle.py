"""The English profile's device bundle: what `train_verifier.py`'s stages learn from, the rows the shipped
calibration is fitted on, and the packaged all-MiniLM-L6-v2 as the network reads it.

- `examples/<stage>.jsonl.gz`: `[a, b, target]` per line, exactly what `train_verifier.py` builds for that
  stage (soft targets resolved); `rewordings-k8` is the third stage with 8 lookup candidates instead of 3.
- `calibration.jsonl.gz` and `calibration.npz`: the rows `bench/semantic/bench_rule.py --write-calibration`
  fits on (the calibration parts of the reviewed Quora, adversarial and chatbot sets, and the lookups of the
  adversarial and chatbot populated scopes), with each row's cosine, guard veto, near-duplicate flag, lookup
  id and set; and per lookup whether a paraphrase is stored.
- `base/`: config and tokenizer files; the base encoder's weights except the word embeddings (fp16); the
  word-embedding rows of the tokens these texts use (int8 with a scale per row, and their ids). The word
  embeddings stay frozen in training and only non-embedding weights ship, so rows no text uses are never read.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import torch
from safetensors.torch import load_file, save_file

from evaluation.pair_sets import CALIBRATION_SETS, LOOKUP_CALIBRATION_SETS, LabelledPair, file_part
from evaluation.scope_lookups import populated_scope, scope_lookups
from semantic.embedding.embedder import SentenceEmbedder
from semantic.embedding.embedder_source import DEFAULT_EMBEDDER_NAME, packaged_model_dir, resolve_embedder
from semantic.guards.near_duplicate import near_duplicate_reason
from semantic.guards.registry import GUARDS_BY_NAME, first_veto
from semantic.rule.calibration_fit import DEFAULT_GUARDS
from semantic.verifier.minilm import load_tokenizer
from semantic.verifier.pair_classifier import FROZEN_PREFIX
from training.bundle_files import quantised_rows
from training.train_verifier import (
    LOOKUP_CANDIDATES,
    rewording_pairs,
    rubric_pairs,
    soft_targets,
    training_pairs,
    training_target,
)

TOKENIZER_FILES = (
    "config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "vocab.txt",
    "special_tokens_map.json",
)


def examples(data_dir: Path) -> dict[str, list[list[object]]]:
    """Each stage's `[a, b, target]` rows."""
    soft = soft_targets(data_dir)
    stages = {
        "paraphrase": training_pairs(data_dir),
        "rubric": rubric_pairs(data_dir),
        "rewordings": rewording_pairs(data_dir),
        "rewordings-k8": rewording_pairs(data_dir, lookup_candidates_k=8),
    }
    return {
        stage: [[pair.a, pair.b, training_target(pair, soft)] for pair in pairs]
        for stage, pairs in stages.items()
    }


def calibration_rows(data_dir: Path) -> tuple[list[list[object]], dict[str, npt.NDArray[Any]]]:
    """The rows the shipped calibration is fitted on (as bench_rule.py assembles them), with their features."""
    embedder = SentenceEmbedder(resolve_embedder(DEFAULT_EMBEDDER_NAME))
    guards = tuple(GUARDS_BY_NAME[name] for name in DEFAULT_GUARDS)
    pairs: list[LabelledPair] = []
    cosines: list[float] = []
    groups: list[int] = []
    sets: list[int] = []
    has_paraphrase: list[bool] = []
    names = [name for name, _ in CALIBRATION_SETS] + [f"lookups-{name}" for name in LOOKUP_CALIBRATION_SETS]
    part = {name: file_part(data_dir / file, "calibration") for name, file in CALIBRATION_SETS}
    for name, _ in CALIBRATION_SETS:
        found = part[name]
        stored, looked_up = embedder.embed([p.a for p in found]), embedder.embed([p.b for p in found])
        pairs += found
        cosines += (stored * looked_up).sum(axis=1).tolist()
        groups += [-1] * len(found)
        sets += [names.index(name)] * len(found)
    for name in LOOKUP_CALIBRATION_SETS:
        scope = populated_scope(part[name])
        lookups = scope_lookups(
            scope,
            embedder.embed(list(scope.stored)),
            embedder.embed([pair.b for pair in scope.queries]),
            LOOKUP_CANDIDATES,
        )
        for lookup in lookups:
            group = len(has_paraphrase)
            has_paraphrase.append(lookup.has_paraphrase)
            for candidate, similarity, paraphrase in zip(
                lookup.candidates, lookup.similarities, lookup.paraphrase, strict=True
            ):
                pairs.append(LabelledPair(candidate, lookup.query, int(paraphrase), lookup.kind))
                cosines.append(similarity)
                groups.append(group)
                sets.append(names.index(f"lookups-{name}"))
    rows: list[list[object]] = [[pair.a, pair.b] for pair in pairs]
    arrays: dict[str, npt.NDArray[Any]] = {
        "labels": np.array([pair.label for pair in pairs], dtype=np.int64),
        "cosines": np.array(cosines, dtype=np.float32),
        "vetoed": np.array([first_veto(p.b, p.a, guards) is not None for p in pairs]),
        "near_duplicates": np.array([near_duplicate_reason(p.b, p.a) is not None for p in pairs]),
        "group": np.array(groups, dtype=np.int64),
        "set": np.array(sets, dtype=np.int64),
        "set_names": np.array(names),
        "has_paraphrase": np.array(has_paraphrase, dtype=bool),
    }
    return rows, arrays


def write_base(out: Path, texts: list[str]) -> None:
    """Config, tokenizer, non-embedding weights, and the word-embedding rows `texts` use."""
    base = packaged_model_dir()
    out.mkdir(parents=True, exist_ok=True)
    for name in TOKENIZER_FILES:
        if (base / name).is_file():
            shutil.copy(base / name, out / name)
    tokenizer = load_tokenizer(base)
    used: set[int] = set()
    for start in range(0, len(texts), 4096):
        for ids in tokenizer(texts[start : start + 4096], add_special_tokens=True)["input_ids"]:
            used.update(ids)
    used.update(tokenizer.all_special_ids)
    weights = load_file(str(base / "model.safetensors"))
    embedding_name = FROZEN_PREFIX.removeprefix("encoder.") + "weight"
    ids = torch.tensor(sorted(used), dtype=torch.int64)
    save_file(quantised_rows(weights[embedding_name], ids), str(out / "word_embeddings.safetensors"))
    save_file(
        {
            name: tensor.to(torch.float16).contiguous()
            for name, tensor in weights.items()
            if name != embedding_name and not name.startswith("pooler.")
        },
        str(out / "encoder.safetensors"),
    )
    print(f"base: {len(used)} of {tokenizer.vocab_size} word embeddings used")
