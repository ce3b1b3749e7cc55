"""The BERT word-embedding table of an installed model, memory-mapped from its safetensors file and shared.

The English embedder and the English verifier are both exported from all-MiniLM-L6-v2 with its word
embeddings unchanged (the verifier's were frozen in training), so each ONNX file holds the same 30,522 x 384
float table (47 MB). ONNX Runtime takes an initializer from memory the caller owns
(`SessionOptions.add_initializer`): both sessions are given this one read-only map of the installed
`model.safetensors` instead of their own copies, and only the rows that prompts use are ever read into
memory. Same values, same graph: the outputs are bit for bit those of the exported table (measured, and
`tests/semantic/embedding/test_word_table.py`); two sessions held 90 MB less (issue 46).
"""

from __future__ import annotations

import functools
import json
import struct
from pathlib import Path

import numpy as np
import numpy.typing as npt

# The table's name in the base model's safetensors file (BERT) and in the exported graphs (the module path
# the exporters trace through: `encoder.` + the base model's own name).
BASE_NAME = "embeddings.word_embeddings.weight"
GRAPH_NAME = "encoder." + BASE_NAME


def safetensors_names(path: Path) -> dict[str, dict[str, object]]:
    """The header of a safetensors file: each tensor's dtype, shape and byte range (no tensor is read)."""
    return _header(path)[1]


def _header(path: Path) -> tuple[int, dict[str, dict[str, object]]]:
    """The header's length in bytes (the data starts 8 bytes after it) and the header."""
    with path.open("rb") as file:
        (length,) = struct.unpack("<Q", file.read(8))
        header: dict[str, dict[str, object]] = json.loads(file.read(length))
    header.pop("__metadata__", None)
    return length, header


@functools.cache
def word_table(weights: Path) -> npt.NDArray[np.float32] | None:
    """`weights`' float32 word-embedding table as a read-only memory map, or None when it has none."""
    if not weights.is_file() or weights.suffix != ".safetensors":
        return None
    length, header = _header(weights)
    entry = header.get(BASE_NAME)
    if entry is None or entry.get("dtype") != "F32":
        return None
    offsets: list[int] = list(entry["data_offsets"])  # type: ignore[call-overload]
    shape: list[int] = list(entry["shape"])  # type: ignore[call-overload]
    if len(shape) != 2 or offsets[1] - offsets[0] != shape[0] * shape[1] * 4:
        return None
    table: npt.NDArray[np.float32] = np.memmap(
        str(weights), dtype="<f4", mode="r", offset=8 + length + offsets[0], shape=(shape[0], shape[1])
    )
    return table


def shared_word_table(base: Path, trained: Path | None = None) -> dict[str, npt.NDArray[np.float32]]:
    """The initializers a session exported from `base` (plus the fine-tuned weights `trained`) may take from
    the shared map: the word table, unless `trained` carries word embeddings of its own (then they differ).

    Safe by construction: an export's file name holds the sha256 of the weights it came from
    (`onnx_runtime.weights_digest`), so the graph's table is this file's, row for row and of this shape.
    """
    if trained is not None and any(name.startswith(GRAPH_NAME) for name in safetensors_names(trained)):
        return {}
    table = word_table(base)
    return {} if table is None else {GRAPH_NAME: table}
