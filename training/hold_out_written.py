"""Hold out one slice of subjects of the English pairs written for training, so that they stay a check.

    .venv/bin/python training/hold_out_written.py      # once; rewrites both files

A subject (`domain`) is held out when its SHA-1 is 0 modulo 6 (17 of 103 subjects, ~270 pairs, in every
family). Its pairs move to `bench/semantic/data/english_new_subjects_holdout.jsonl` (evaluation only); a
training pair is dropped when either text equals a held-out text or lies within MiniLM cosine 0.90 of one
(the leak bound the written pairs were cleaned with). Running it again on the split files changes nothing.
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

ROOT = Path(__file__).resolve().parents[1]
WRITTEN = ROOT / "training" / "data" / "english_written.jsonl"
HOLDOUT = ROOT / "bench" / "semantic" / "data" / "english_new_subjects_holdout.jsonl"
MODULUS = 6
LEAK_COSINE = 0.90


def held_out_subject(domain: str) -> bool:
    return int(hashlib.sha1(domain.encode()).hexdigest(), 16) % MODULUS == 0


def read(path: Path) -> list[dict[str, object]]:
    if not path.is_file():
        return []
    with path.open(encoding="utf-8") as lines:
        return [json.loads(line) for line in lines if line.strip()]


def write(path: Path, rows: list[dict[str, object]]) -> None:
    with path.open("w", encoding="utf-8") as out:
        out.writelines(json.dumps(row, ensure_ascii=False) + "\n" for row in rows)


def main() -> None:
    from semantic.embedding.embedder import SentenceEmbedder
    from semantic.embedding.embedder_source import DEFAULT_EMBEDDER_NAME, resolve_embedder

    rows = read(WRITTEN) + read(HOLDOUT)
    held = [row for row in rows if held_out_subject(str(row["domain"]))]
    train = [row for row in rows if not held_out_subject(str(row["domain"]))]
    held_texts = sorted({str(row[key]).strip().casefold() for row in held for key in ("a", "b")})
    embedder = SentenceEmbedder(resolve_embedder(DEFAULT_EMBEDDER_NAME))
    held_vectors = np.asarray(embedder.embed(held_texts))
    texts = [str(row[key]).strip().casefold() for row in train for key in ("a", "b")]
    nearest = (
        (np.asarray(embedder.embed(texts)) @ held_vectors.T).max(axis=1).reshape(len(train), 2).max(axis=1)
    )
    kept = [row for row, cosine in zip(train, nearest.tolist(), strict=True) if cosine < LEAK_COSINE]
    write(WRITTEN, kept)
    write(HOLDOUT, held)
    print(
        f"held out {len(held)} pairs in {len({row['domain'] for row in held})} subjects; "
        f"{len(kept)} train pairs kept, {len(train) - len(kept)} dropped as too close"
    )


if __name__ == "__main__":
    main()
