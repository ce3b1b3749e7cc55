"""`WordPieces` (the `tokenizers` library alone) gives the arrays transformers' tokenizer gives for the same
call: the ids the shipped calibration was fitted on, without importing transformers at serve time."""

from __future__ import annotations

import json

import numpy as np
import pytest
from transformers import AutoTokenizer

from semantic.embedding.embedder_source import packaged_model_dir
from semantic.embedding.word_pieces import FEATURES, WordPieces
from tests.pair_fixtures import ENGLISH_PAIRS

ODD = [
    ("a " * 300, "b " * 12),  # longer than any cut: longest-first truncation
    ("Ünïcödé 東京 \0 tabs\tand\nnewlines", "ÉTÉ Straße ﬁ"),
    ("", "only the second"),
    ("  leading and trailing  ", "x"),
]


@pytest.fixture(scope="module")
def folder():  # type: ignore[no-untyped-def]
    return packaged_model_dir()


@pytest.mark.parametrize("max_tokens", [96, 256])
def test_batches_equal_transformers_arrays(folder, max_tokens: int) -> None:  # type: ignore[no-untyped-def]
    reference = AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
    pieces = WordPieces(folder, max_tokens)
    cut = {"padding": True, "truncation": "longest_first", "max_length": max_tokens, "return_tensors": "np"}
    lines = ENGLISH_PAIRS.read_text(encoding="utf-8").splitlines()
    pairs = [(row["a"], row["b"]) for row in map(json.loads, filter(None, lines))] + ODD
    for start in range(0, len(pairs), 64):
        firsts = [first for first, _ in pairs[start : start + 64]]
        seconds = [second for _, second in pairs[start : start + 64]]
        checks = [
            (pieces.batch(firsts, seconds), reference(firsts, seconds, **cut)),
            (pieces.batch(firsts), reference(firsts, **cut)),
        ]
        for ours, theirs in checks:
            for feature in FEATURES:
                assert ours[feature].dtype == np.int64
                assert np.array_equal(ours[feature], theirs[feature]), (start, feature)
    texts = [first for first, _ in pairs]
    uncut = reference(texts, add_special_tokens=True, truncation=False, verbose=False)["input_ids"]
    assert pieces.lengths(texts) == [len(ids) for ids in uncut]
    assert max(map(len, uncut)) > max_tokens  # the counts are before any cut


def test_a_folder_without_its_padding_token_is_refused(tmp_path, folder) -> None:  # type: ignore[no-untyped-def]
    (tmp_path / "tokenizer.json").write_bytes((folder / "tokenizer.json").read_bytes())
    (tmp_path / "special_tokens_map.json").write_text('{"pad_token": "<no such piece>"}', encoding="utf-8")
    with pytest.raises(ValueError, match="no padding token"):
        WordPieces(tmp_path, 96)
