"""The loader reads an HF folder (weights, tokenizer, chat template together) into a model that matches
transformers, and reuses a finished GGUF conversion instead of converting again."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from engine.model.paging import LogitsFor, SequenceChunk
from engine.runner import ModelRunner
from engine.weights.loader import CONVERTED_SUFFIX, ensure_hf_folder, load_model
from engine.weights.model_files import GeneratorSource, SourceKind
from tests.engine.llama_testing import hf_logits, make_hf_llama

TEMPLATE = "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}{% endfor %}"


def write_hf_folder(folder: Path) -> torch.nn.Module:
    hf = make_hf_llama(tie_word_embeddings=True, eos_token_id=[3, 5])
    hf.save_pretrained(folder)
    vocab = {f"w{i}": i for i in range(97)}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="w0"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="w0", chat_template=TEMPLATE)
    tokenizer.save_pretrained(folder)
    return hf


def test_hf_folder_loads_weights_tokenizer_and_template_from_the_same_place(tmp_path: Path) -> None:
    hf = write_hf_folder(tmp_path / "tiny")
    loaded = load_model(GeneratorSource(SourceKind.HF_FOLDER, str(tmp_path / "tiny")), tmp_path)
    assert loaded.chat_template == TEMPLATE
    assert loaded.config.eos_token_ids == (3, 5)
    assert loaded.tokenizer("w4 w9 w2")["input_ids"] == [4, 9, 2]
    runner = ModelRunner(loaded.model, num_blocks=8, block_size=4)
    tokens = [4, 9, 2, 50, 61, 7, 7, 1, 96]
    logits = runner.execute([SequenceChunk(tokens, 0, [3, 1, 6], LogitsFor.ALL)])
    torch.testing.assert_close(logits, hf_logits(hf, tokens), atol=1e-4, rtol=0)


def test_a_finished_gguf_conversion_is_reused(tmp_path: Path) -> None:
    gguf = tmp_path / "model.Q4.gguf"
    gguf.write_bytes(b"GGUF not really")
    converted = tmp_path / ("model.Q4" + CONVERTED_SUFFIX)
    converted.mkdir()
    (converted / "kvgate-source.json").write_text(
        json.dumps({"gguf": gguf.name, "size": gguf.stat().st_size})
    )
    # A matching record means no conversion is attempted (this fake GGUF would fail to convert).
    assert ensure_hf_folder(GeneratorSource(SourceKind.GGUF_FILE, str(gguf)), tmp_path) == converted
