"""`KVGATE_ENGINE_WEIGHTS=auto`: pick the weights format by timing this machine's kernels at load time.

Which format is fastest depends on the CPU, not on the model: where AVX-512 BF16/VNNI is present, torch's
int4 and int8 weight-only kernels ran a batch-1 projection 1.5-2.5x faster than float32; on AVX2-only
machines bfloat16 matmuls were measured 5x slower than float32. So `auto` never assumes: it times the
model's own widest projection (hidden -> gate+up) in every format, with the engine's thread count, cycling
through a working set larger than the CPU's caches as a decode step does, at batch 1 (the single-stream
decode step, bound by weight bytes) and at batch 16 (a busy decode step). It picks the fastest format at
batch 1 among those not slower than float32 at batch 16, preferring a format within 10% of the fastest
when it stores fewer bytes. It considers only formats that keep what the source stored (`CANDIDATES`):
int4 for a 4-bit GGUF, int8 at most for other quantised files, fp32 or bf16 for float weights. The
measurement takes about a second and is logged and shown in `/healthz`.

One case skips the timing: a 4-bit source on a machine where the native decode step builds is kept as int4,
because its decode steps then never run on torch's kernels (`choose_weights`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch

from engine.model.config import ModelConfig
from engine.model.native_build import cpu_isa, load_decode_library
from engine.model.quantized import GROUP_SIZE
from engine.weights.formats import WEIGHTS_FORMATS, WeightsFormat, make_projection

logger = logging.getLogger("kvgate.engine")

BYTES_PER_WEIGHT: dict[WeightsFormat, float] = {"fp32": 4.0, "bf16": 2.0, "int8": 1.0, "int4": 0.5}
_CLOSE_ENOUGH = 1.10
_PASSES = 5
_WORKING_SET_BYTES = 128 * 2**20


@dataclass(frozen=True, slots=True)
class WeightsChoice:
    """The format the engine runs and why: per-format microseconds of one projection at batch 1 and 16."""

    weights: WeightsFormat
    requested: str  # `auto` or the format the settings named
    batch1_us: dict[str, float]
    batch16_us: dict[str, float]
    cpu_capability: str
    reason: str
    decode: str = "torch"
    """Which code runs decode steps once the engine is built: `native (<instruction set>)` or `torch`."""

    @classmethod
    def from_description(cls, description: Mapping[str, Any]) -> WeightsChoice:
        """The choice another process made, from its `describe()` (the engine process tells workers)."""
        return cls(
            weights=description["weights"],
            requested=str(description["requested"]),
            batch1_us={str(key): float(value) for key, value in description["batch1_us"].items()},
            batch16_us={str(key): float(value) for key, value in description["batch16_us"].items()},
            cpu_capability=str(description["cpu_capability"]),
            reason=str(description["reason"]),
            decode=str(description.get("decode", "torch")),
        )

    def describe(self) -> dict[str, object]:
        return {
            "weights": self.weights,
            "requested": self.requested,
            "cpu_capability": self.cpu_capability,
            "batch1_us": self.batch1_us,
            "batch16_us": self.batch16_us,
            "reason": self.reason,
            "decode": self.decode,
        }


# What `auto` may pick, by how the source stores its projections (`engine.weights.loader.weights_storage`): never
# fewer bits than the file kept. A float model is not quantised behind the user's back; an 8-bit or
# K-quant GGUF may go to int8 (one scale per row), not to int4; only a 4-bit GGUF's codes go to int4 as
# they are.
CANDIDATES: dict[str, tuple[WeightsFormat, ...]] = {
    "float": ("fp32", "bf16"),
    "quantized": ("fp32", "bf16", "int8"),
    "4-bit": WEIGHTS_FORMATS,
}


def choose_weights(
    requested: str, config: ModelConfig, storage: str = "4-bit", decode_kernel: str = "auto"
) -> WeightsChoice:
    """`requested` is `auto` or one of `WEIGHTS_FORMATS` (then it is used as it is); `storage` is how the
    source stores its projections, which bounds what `auto` considers (`CANDIDATES`).

    With 4-bit source weights, `auto` keeps them as int4 without timing torch's kernels where the native
    decode step (`engine.model.native_decode`, `decode_kernel` not `torch`) builds on this machine: every decode
    step then runs there, not on torch's kernels (measured 1.7x llama.cpp's single stream at 1 thread on an
    AVX-512 Intel part, level with it on an AVX2 Zen 3 one: docs/benchmarks.md).
    Timing torch's kernels would answer another question, and under load it once picked int8 here."""
    if requested != "auto" and requested not in WEIGHTS_FORMATS:
        raise ValueError(f"engine weights must be auto or one of {WEIGHTS_FORMATS}, not {requested!r}")
    capability = torch.backends.cpu.get_cpu_capability()
    if requested != "auto":
        if WEIGHTS_FORMATS.index(requested) > WEIGHTS_FORMATS.index(CANDIDATES[storage][-1]):  # type: ignore[arg-type]
            logger.warning(
                "engine weights: %s requested for %s weights: quantising them at load", requested, storage
            )
        return WeightsChoice(requested, requested, {}, {}, capability, "set in the settings")  # type: ignore[arg-type]
    if storage == "4-bit" and decode_kernel != "torch":
        isa = cpu_isa()
        if isa is not None and load_decode_library(isa) is not None:
            reason = f"the source stores 4-bit projections and decode steps run natively ({isa})"
            logger.info("engine weights: int4 (%s; cpu %s)", reason, capability)
            return WeightsChoice("int4", requested, {}, {}, capability, reason)
    batch1, batch16 = measure_formats(config, CANDIDATES[storage])
    weights, reason = pick(batch1, batch16)
    reason += f"; the source stores {storage} projections, so {'/'.join(CANDIDATES[storage])} were timed"
    choice = WeightsChoice(weights, requested, batch1, batch16, capability, reason)
    logger.info(
        "engine weights: %s (%s; cpu %s, one %dx%d projection, µs at batch 1 %s, at batch 16 %s)",
        weights,
        reason,
        capability,
        config.hidden_size,
        2 * config.intermediate_size,
        batch1,
        batch16,
    )
    return choice


def pick(batch1: dict[str, float], batch16: dict[str, float]) -> tuple[WeightsFormat, str]:
    """The rule in the module docstring, on measured microseconds per format."""
    eligible = [f for f in WEIGHTS_FORMATS if f in batch1 and f in batch16 and batch16[f] <= batch16["fp32"]]
    fastest = min(eligible, key=lambda f: batch1[f])
    close = [f for f in eligible if batch1[f] <= batch1[fastest] * _CLOSE_ENOUGH]
    chosen = min(close, key=lambda f: BYTES_PER_WEIGHT[f])
    ratio = batch1["fp32"] / batch1[chosen]
    return chosen, f"measured {ratio:.2f}x float32's speed at batch 1"


def measure_formats(
    config: ModelConfig, formats: tuple[WeightsFormat, ...] = WEIGHTS_FORMATS
) -> tuple[dict[str, float], dict[str, float]]:
    """Microseconds per (hidden -> 2 * intermediate) projection, per format, at batch 1 and 16.

    Timed over a pass through several distinct copies, as a decode step passes through every layer's
    weights: one weight timed again and again would sit in the CPU's cache and flatter the formats with
    the most bytes. Copies: one per layer, at most `_WORKING_SET_BYTES` of float32 (freed afterwards).
    """
    in_features = config.hidden_size - config.hidden_size % GROUP_SIZE or GROUP_SIZE
    weight = torch.randn(2 * config.intermediate_size, in_features) * 0.02
    copies = max(2, min(config.num_layers, _WORKING_SET_BYTES // (weight.numel() * 4)))
    batch1: dict[str, float] = {}
    batch16: dict[str, float] = {}
    for weights_format in formats:
        try:
            projections = [make_projection([weight], None, weights_format) for _ in range(copies)]
        except RuntimeError as error:  # a kernel this torch build or CPU lacks
            logger.info("engine weights: %s unavailable here (%s)", weights_format, error)
            continue
        batch1[weights_format] = _time_us(projections, torch.randn(1, in_features))
        # More than 10% slower than fp32 alone, it cannot be picked: skip the (then slow) busy timing.
        if batch1[weights_format] <= _CLOSE_ENOUGH * batch1.get("fp32", float("inf")):
            batch16[weights_format] = _time_us(projections, torch.randn(16, in_features))
        del projections
    return batch1, batch16


@torch.inference_mode()
def _time_us(projections: list[torch.nn.Module], x: torch.Tensor) -> float:
    """Best of `_PASSES` passes through all copies, per projection."""
    for projection in projections:
        projection(x)
    best = float("inf")
    for _ in range(_PASSES):
        start = time.perf_counter()
        for projection in projections:
            projection(x)
        best = min(best, time.perf_counter() - start)
    return round(best / len(projections) * 1e6, 1)
