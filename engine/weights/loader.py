"""Loading a generator: weights into `LlamaModel`, plus the tokenizer and chat template of the same source.

Every source is reduced to a local Hugging Face folder (config.json, *.safetensors, tokenizer files):
- a GGUF file is converted once (transformers dequantises it to float32, slowly) into a cached folder next
  to it in the model directory, `<stem>.hf/`, written under a temporary name and renamed when complete;
  later loads read the folder in under a second;
- a local folder is used as it is;
- a hub name is downloaded by `huggingface_hub` (only ever when the user configured a hub name).
The tokenizer always comes from that same folder, so template and weights cannot drift apart.
"""

from __future__ import annotations

import json
import logging
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from engine.model.config import ModelConfig
from engine.model.llama import LlamaModel
from engine.weights.formats import SourceWeight, WeightsFormat, build_model
from engine.weights.gguf_weights import UnsupportedGguf, projection_storage, read_gguf_weights
from engine.weights.model_files import GeneratorSource, SourceKind

logger = logging.getLogger("kvgate.engine")

CONVERTED_SUFFIX = ".hf"
_SOURCE_RECORD = "kvgate-source.json"  # which GGUF (name, size) a converted folder was made from
_HUB_FILES = ["*.json", "*.safetensors", "*.jinja", "tokenizer.model"]


@dataclass(frozen=True, slots=True)
class LoadedModel:
    config: ModelConfig
    model: LlamaModel
    tokenizer: Any  # a transformers tokenizer
    chat_template: str | None
    folder: Path  # the HF folder the weights and tokenizer were read from


def load_model(
    source: GeneratorSource,
    model_dir: Path,
    dtype: torch.dtype = torch.float32,
    device: str = "cpu",
    weights: WeightsFormat = "fp32",
) -> LoadedModel:
    """Load weights, tokenizer and chat template from one source (see the module docstring).

    `weights` other than fp32 builds the projections in that format (`engine.weights.formats`), on the CPU:
    from a llama GGUF they are read as stored (4- and 8-bit codes kept), from anything else from the float folder.
    """
    folder = ensure_hf_folder(source, model_dir)
    config = read_config(folder)
    if weights == "fp32":
        model = LlamaModel.from_hf_weights(config, read_safetensors(folder), dtype, device)
    else:
        model = build_model(config, _stored_weights(source, folder), weights)
    tokenizer = load_tokenizer(folder)
    return LoadedModel(config, model, tokenizer, tokenizer.chat_template, folder)


def ensure_hf_folder(source: GeneratorSource, model_dir: Path) -> Path:
    """A local HF folder holding the source's weights and tokenizer, converting or downloading if needed."""
    if source.kind is SourceKind.HF_FOLDER:
        return Path(source.location)
    if source.kind is SourceKind.GGUF_FILE:
        gguf = Path(source.location)
        target = model_dir / (gguf.stem + CONVERTED_SUFFIX)
        if not _is_converted_from(target, gguf):
            convert_gguf(gguf, target)
        return target
    from huggingface_hub import snapshot_download  # only a hub source ever needs it

    return Path(snapshot_download(source.location, allow_patterns=_HUB_FILES))


def convert_gguf(gguf: Path, target: Path) -> None:
    """Dequantise a GGUF into an HF folder at `target` (float32 safetensors, config, tokenizer)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if not gguf.is_file():
        raise FileNotFoundError(f"no GGUF file at {gguf}")
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    hf_model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    config = hf_model.config.to_dict()
    config.pop("quantization_config", None)  # the weights we write are plain float32
    state = {
        name: tensor.contiguous()
        for name, tensor in hf_model.state_dict().items()
        if not (name == "lm_head.weight" and config.get("tie_word_embeddings"))
    }
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=target.name + ".", dir=target.parent))
    try:
        save_file(state, staging / "model.safetensors", metadata={"format": "pt"})
        (staging / "config.json").write_text(json.dumps(config, indent=2))
        hf_model.generation_config.to_json_file(staging / "generation_config.json")
        tokenizer.save_pretrained(staging)
        (staging / _SOURCE_RECORD).write_text(json.dumps(_gguf_identity(gguf)))
        if target.exists():
            shutil.rmtree(target)  # a stale conversion of an older file of the same name
        staging.chmod(0o755)
        staging.rename(target)  # atomic: a crash never leaves a half-written folder under the real name
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def weights_storage(source: GeneratorSource) -> str:
    """How the source stores its projections: `4-bit`, `quantized` or `float` (`projection_storage`);
    `auto` never picks a format that would keep less than that (`engine.weights.choice`)."""
    if source.kind is not SourceKind.GGUF_FILE or not Path(source.location).is_file():
        return "float"
    return projection_storage(Path(source.location))


def _stored_weights(source: GeneratorSource, folder: Path) -> dict[str, SourceWeight]:
    if source.kind is SourceKind.GGUF_FILE and Path(source.location).is_file():
        try:
            return dict(read_gguf_weights(Path(source.location)))
        except UnsupportedGguf as reason:
            logger.info("%s; quantising the converted float weights instead", reason)
    return dict(read_safetensors(folder))


def read_config(folder: Path) -> ModelConfig:
    hf_config = json.loads((folder / "config.json").read_text())
    generation = folder / "generation_config.json"
    generation_eos = json.loads(generation.read_text()).get("eos_token_id") if generation.exists() else None
    return ModelConfig.from_hf(hf_config, generation_eos)


def read_safetensors(folder: Path) -> dict[str, torch.Tensor]:
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no .safetensors files in {folder}")
    weights: dict[str, torch.Tensor] = {}
    for file in files:
        weights.update(load_file(file))
    return weights


def load_tokenizer(folder: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(folder, local_files_only=True)


def _gguf_identity(gguf: Path) -> dict[str, Any]:
    return {"gguf": gguf.name, "size": gguf.stat().st_size}


def _is_converted_from(target: Path, gguf: Path) -> bool:
    record = target / _SOURCE_RECORD
    if not record.is_file():
        return False
    # With the GGUF gone, a complete conversion still serves; with it present, it must be the same file.
    return not gguf.is_file() or json.loads(record.read_text()) == _gguf_identity(gguf)
