"""ONNX Runtime for the embedder and the verifier: exported once from the installed weights, then cached.

Both models are small BERT encoders run one short text (or pair) at a time, where torch's per-op overhead
is most of the cost: measured here, one MiniLM embedding took 13.3 ms on torch and 3.8 ms on ONNX Runtime
(identical vectors, cosine 1.0000), one verifier pair 15.4 ms and 6.9 ms (bench/gateway/bench_hit_path.py).

The export runs at first start from the weights on this disk (never a hub), with torch's TorchScript-based
exporter, and is written next to the GGUF conversion under the model directory, in a file named after the
sha256 of the weights it came from: new weights get a new file, and a file is never half-written (a temporary
file is renamed into place, so concurrent starts are safe). When `onnxruntime` is not installed, or the
model cannot be exported, callers fall back to torch and log why.

This module knows ONNX (export, int8 dynamic quantisation, sessions); it knows nothing about pooling,
thresholds or the cache.
"""

from __future__ import annotations

import hashlib
import importlib.util
import logging
import os
import tempfile
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
import numpy.typing as npt
import platformdirs

logger = logging.getLogger("kvgate.semantic")

Runtime = Literal["auto", "onnx", "torch"]
RUNTIMES: tuple[str, ...] = ("auto", "onnx", "torch")
# Part of every exported file's name: bump it when the export itself changes, so old files are not reused.
EXPORT_VERSION = 1
_OPSET = 17
ENCODER_INPUTS = ("input_ids", "attention_mask", "token_type_ids")


@dataclass(frozen=True, slots=True)
class RuntimeChoice:
    """Which runtime a model runs on, and why (logged once at load, shown in `/healthz`)."""

    runtime: Literal["onnx", "torch"]
    reason: str


def choose_runtime(requested: str) -> RuntimeChoice:
    """`auto`: ONNX Runtime when it is installed, else torch; `onnx`: ONNX Runtime or an error; `torch`."""
    if requested not in RUNTIMES:
        raise ValueError(f"inference runtime must be one of {', '.join(RUNTIMES)}, got {requested!r}")
    if requested == "torch":
        return RuntimeChoice("torch", "torch asked for")
    missing = onnx_missing()
    if missing is None:
        return RuntimeChoice("onnx", "onnxruntime installed")
    if requested == "onnx":
        raise RuntimeError(f"KVGATE_INFERENCE_RUNTIME=onnx but {missing}")
    return RuntimeChoice("torch", missing)


def onnx_missing() -> str | None:
    """Why ONNX Runtime cannot be used here, or None when it can."""
    try:
        import onnxruntime  # noqa: F401
    except ImportError as error:
        return f"onnxruntime is not installed ({error}); pip install onnxruntime onnx"
    # The exporter and the quantiser need onnx; serving does not import it (with its protobuf and ml_dtypes,
    # about 55 MB of a process), so it is only looked for here.
    if importlib.util.find_spec("onnx") is None:
        return "onnx is not installed (the exporter needs it); pip install onnx"
    return None


def default_export_dir() -> Path:
    """Where exports go when the caller names no folder: the gateway's model directory (KVGATE_MODEL_DIR)."""
    model_dir = os.environ.get("KVGATE_MODEL_DIR")
    base = Path(model_dir) if model_dir else Path(platformdirs.user_cache_dir("kvgate")) / "models"
    return base / "onnx"


def weights_digest(*paths: Path) -> str:
    """A short sha256 over the weight files an export comes from (names the exported file)."""
    digest = hashlib.sha256(f"kvgate-onnx-v{EXPORT_VERSION}".encode())
    for path in paths:
        with path.open("rb") as weights:
            while chunk := weights.read(1 << 20):
                digest.update(chunk)
    return digest.hexdigest()[:16]


class OnnxEncoder:
    """One exported encoder on ONNX Runtime: its input arrays in (cast to the types it declares), its single
    output array out."""

    def __init__(
        self, path: Path, threads: int = 1, shared: Mapping[str, npt.NDArray[np.float32]] | None = None
    ) -> None:
        """`shared`: initializers given from memory the caller owns, by name, in place of the file's copies
        (a table several sessions share: `word_table.py`); they must equal what the file holds."""
        import onnxruntime as ort

        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        options.log_severity_level = 3  # warnings about unused initialisers are noise here
        # Idle intra-op threads sleep instead of spinning: on a few cores a spinning pool takes the core the
        # event loop (or the engine) needs. Measured through HTTP on 2 cores, a verified semantic hit took
        # 31 ms with spinning and 15 ms without.
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        # No memory arena: it keeps the high-water mark of every batch shape it has seen. After 10 s of 32
        # concurrent misses a reverse-proxy process held 549 MB with it and 527 MB without (issue 46), at the
        # same throughput; without it, freed activations go back to malloc, which the heap trimmer returns.
        options.enable_cpu_mem_arena = False
        # ONNX Runtime reads these arrays in place: they are kept alive as long as the session.
        self._shared = [ort.OrtValue.ortvalue_from_numpy(array) for array in (shared or {}).values()]
        for name, value in zip(shared or {}, self._shared, strict=True):
            options.add_initializer(name, value)
        self.path = path
        self._session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
        # Token arrays are int64; word vectors (the multilingual verifier's first input) float32.
        self._inputs = [
            (node.name, np.float32 if node.type == "tensor(float)" else np.int64)
            for node in self._session.get_inputs()
        ]

    def run(self, batch: Mapping[str, npt.NDArray[Any]]) -> npt.NDArray[np.float32]:
        feed = {name: np.asarray(batch[name], dtype=dtype) for name, dtype in self._inputs}
        output: npt.NDArray[np.float32] = self._session.run(None, feed)[0]
        return output


def exported(path: Path, build: Callable[[Path], None]) -> Path:
    """`path` when it exists, else written by `build(temporary path)` and renamed into place."""
    if path.is_file():
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    descriptor, temporary = tempfile.mkstemp(prefix=path.name, suffix=".part", dir=path.parent)
    os.close(descriptor)
    try:
        build(Path(temporary))
        os.chmod(temporary, 0o644)  # mkstemp's 0600 would hide it from other users of a shared model dir
        os.replace(temporary, path)
    finally:
        Path(temporary).unlink(missing_ok=True)
    return path


def export_encoder(
    module: Any, sample: Mapping[str, Any], path: Path, output_name: str, output_axes: Mapping[int, str]
) -> None:
    """Export a torch module taking (input_ids, attention_mask, token_type_ids) with dynamic batch and length."""
    import torch

    axes = {name: {0: "batch", 1: "tokens"} for name in ENCODER_INPUTS} | {output_name: dict(output_axes)}
    with warnings.catch_warnings(), torch.inference_mode():
        warnings.simplefilter("ignore")  # tracer warnings about shape-dependent Python branches
        torch.onnx.export(
            module.eval(),
            tuple(sample[name] for name in ENCODER_INPUTS),
            str(path),
            dynamo=False,
            input_names=list(ENCODER_INPUTS),
            output_names=[output_name],
            dynamic_axes=axes,
            opset_version=_OPSET,
        )


def quantize_int8(source: Path, target: Path) -> None:
    """Dynamic int8 quantisation of the MatMul weights (activations quantised on the fly, per batch)."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    root = logging.getLogger()
    previous, root.disabled = root.disabled, True  # it logs pre-processing advice on the root logger
    try:
        quantize_dynamic(str(source), str(target), weight_type=QuantType.QInt8)
    finally:
        root.disabled = previous
