"""The multilingual verifier's weights file: the encoder's matrices int8 with one scale per row, the rest fp16.

Every tensor of the network but the word embeddings (frozen, read from the base model) is stored:
`save_int8_weights` writes such a file, `read_int8_weights` reads it back as float32 under the network's
names (a file of fp16 tensors only, as the English verifier's, reads as well), `load_int8_weights` lays it
over a network. Training's bundles store the base encoder the same way (`training/`).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from semantic.verifier.pair_classifier import FROZEN_PREFIX, PairClassifier

_SCALES = ".scales"
_ROWS = ".rows"


def save_int8_weights(model: PairClassifier, path: Path) -> None:
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


def read_int8_weights(path: Path) -> dict[str, torch.Tensor]:
    """The file `save_int8_weights` wrote, as float32 tensors under the model's names."""
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


def load_int8_weights(model: PairClassifier, path: Path) -> None:
    """Lay the file `save_int8_weights` wrote over `model` (its word embeddings left as they are)."""
    tensors = read_int8_weights(path)
    load_weights_into(
        model, {name: value for name, value in tensors.items() if not name.startswith(FROZEN_PREFIX)}
    )


def load_weights_into(model: PairClassifier, tensors: Mapping[str, torch.Tensor]) -> None:
    """Lay `tensors` over `model`; every tensor but the word embeddings must be there."""
    expected = {name for name in model.state_dict() if not name.startswith(FROZEN_PREFIX)}
    missing = expected - tensors.keys() - {"encoder.embeddings.position_ids"}
    if missing:
        raise ValueError(f"multilingual verifier weights lack {sorted(missing)[:3]}")
    model.load_state_dict(dict(tensors), strict=False)
