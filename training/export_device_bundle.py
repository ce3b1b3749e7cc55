"""Write what `training/train_on_device.py` needs on a lent GPU machine, which reaches neither PyPI nor
`../shared/data`: the training examples of each stage, the calibration rows it selects checkpoints on, and
the base model's configuration, tokenizer and weights, small enough to travel (64 MiB with the tree).

    .venv/bin/python training/export_device_bundle.py --out .device-bundle

- `examples/<stage>.jsonl.gz`: `[a, b, target]` per line, exactly what `train_verifier.py` builds for that
  stage (soft targets resolved); `rewordings-k8` is the third stage with 8 lookup candidates instead of 3.
- `calibration.jsonl.gz` and `calibration.npz`: the rows `bench/semantic/bench_rule.py --write-calibration`
  fits on (the calibration parts of the reviewed Quora, adversarial and chatbot sets, and the lookups of the
  adversarial and chatbot populated scopes), with each row's cosine, guard veto, near-duplicate flag, lookup
  id and set; and per lookup whether a paraphrase is stored.
- `base/`: config and tokenizer files; the base encoder's weights except the word embeddings (fp16); the
  word-embedding rows of the tokens these texts use (int8 with a scale per row, and their ids). The word embeddings stay frozen
  in training and only non-embedding weights ship, so rows no text uses are never read.
"""

from __future__ import annotations

import argparse
import gzip
import json
import shutil
import sys
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import torch
from safetensors.torch import load_file, save_file

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from semantic.embedding.embedder import SentenceEmbedder
from semantic.embedding.embedder_source import (
    DEFAULT_EMBEDDER_NAME,
    packaged_model_dir,
    resolve_embedder,
)
from semantic.pair_sets import (
    CALIBRATION_SETS,
    LOOKUP_CALIBRATION_SETS,
    LabelledPair,
    file_part,
)
from semantic.rule.calibrated import DEFAULT_GUARDS
from semantic.rule.guards import GUARDS_BY_NAME, first_veto
from semantic.rule.near_duplicate import near_duplicate_reason
from semantic.rule.pair_classifier import FROZEN_PREFIX, load_tokenizer
from semantic.scope_lookups import populated_scope, scope_lookups
from training.train_verifier import (
    DATA_DIR,
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


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--data-dir", type=Path, default=DATA_DIR)
    parser.add_argument("--out", type=Path, default=Path(".device-bundle"))
    args = parser.parse_args()
    out: Path = args.out
    (out / "examples").mkdir(parents=True, exist_ok=True)
    texts: set[str] = set()

    soft = soft_targets(args.data_dir)
    stages = {
        "paraphrase": training_pairs(args.data_dir),
        "rubric": rubric_pairs(args.data_dir),
        "rewordings": rewording_pairs(args.data_dir),
        "rewordings-k8": rewording_pairs(args.data_dir, lookup_candidates_k=8),
    }
    for stage, pairs in stages.items():
        rows = [[pair.a, pair.b, training_target(pair, soft)] for pair in pairs]
        write_jsonl(out / "examples" / f"{stage}.jsonl.gz", rows)
        texts.update(text for pair in pairs for text in (pair.a, pair.b))
        print(f"{stage}: {len(rows)} examples")

    rows, arrays = calibration_rows(args.data_dir)
    write_jsonl(out / "calibration.jsonl.gz", rows)
    np.savez(out / "calibration.npz", **arrays)  # type: ignore[arg-type]
    texts.update(str(text) for row in rows for text in row[:2])
    print(f"calibration: {len(rows)} rows, {int((arrays['group'] >= 0).sum())} of them lookup candidates")

    write_base(out / "base", sorted(texts))
    total = sum(path.stat().st_size for path in out.rglob("*") if path.is_file())
    print(f"wrote {out} ({total / 2**20:.1f} MiB)")


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


def quantised_rows(table: torch.Tensor, ids: torch.Tensor) -> dict[str, torch.Tensor]:
    """Rows `ids` of `table` as int8 with one fp32 scale per row (absmax): a quarter of fp32's size, so the
    bundle travels with the tree. `dequantised_rows` reads them back; the error is at most half a step
    (row max / 254), measured in docs/benchmarks.md against fp32 rows."""
    rows = table[ids].float()
    scales = rows.abs().amax(dim=1).clamp(min=1e-12) / 127.0
    return {
        "ids": ids,
        "rows": torch.round(rows / scales[:, None]).to(torch.int8).contiguous(),
        "scales": scales.contiguous(),
    }


def write_jsonl(path: Path, rows: list[list[object]]) -> None:
    with gzip.open(path, "wt", encoding="utf-8") as lines:
        for row in rows:
            lines.write(json.dumps(row, ensure_ascii=False) + "\n")


if __name__ == "__main__":
    main()
