"""Which build of the native decode step runs fastest on this CPU: measured at first start, then kept.

A build is an instruction set (AVX2, or AVX-512 VNNI on 256-bit registers, where the CPU has it) and a form
of the integer dot product (`engine/model/native/decode_step.c`'s header): byte pairs or 16-bit. Every build
sums the same integers exactly; which one is fastest depends on the CPU's execution ports (on one AVX2 part
the widening is free, on another it queues behind the shuffles; on Zen 4 a VNNI instruction is two 256-bit
halves), so it is never assumed. The first time a model of given dimensions starts on a CPU, each build
decodes a few steps of that model, alone and 16 rows together, over a scratch KV cache of its own, in
alternating rounds; the build with the least time (the geometric mean of the two) wins. The choice and its
figures are written beside the builds (`decode_forms.json`), keyed by CPU, source, model dimensions and
threads, so later starts read it instead of measuring again; `/healthz` shows it (`engine.weights.decode`).
"""

from __future__ import annotations

import ctypes
import json
import logging
import math
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import torch

from engine.model.attention import KVCache
from engine.model.llama import LlamaModel
from engine.model.native_build import DOT_FORMS, build_dir, cpu_isas, load_decode_library, source_digest
from engine.model.paging import PagingMetadata, SequenceChunk, build_paging_metadata

logger = logging.getLogger("kvgate.engine")

CHOICES_FILE = "decode_forms.json"
PROBE_BATCHES = (1, 16)
"""Rows per measured step: one stream alone, and a busy server's batch."""
PROBE_CONTEXT = 64
"""Tokens of context each measured row attends over."""
ROUNDS = 5
STEPS_PER_ROUND = {1: 6, 16: 2}


class Decoder(Protocol):
    def decode(self, input_ids: torch.Tensor, metadata: PagingMetadata) -> torch.Tensor: ...


DecoderFactory = Callable[[ctypes.CDLL, "FormChoice", KVCache], Decoder]
"""(library, build, KV cache) -> a decoder of the model being measured (engine.model.native_decode)."""


@dataclass(frozen=True)
class FormChoice:
    """The build that decodes (instruction set and dot-product form), and what each build measured (µs per
    step by rows, keyed `"<isa> <form>"`; empty if not measured)."""

    isa: str
    form: str
    step_us: dict[str, dict[str, float]] = field(default_factory=dict, hash=False)
    measured_now: bool = field(
        default=False, hash=False
    )  # measured by this start, not read from an earlier one

    @property
    def name(self) -> str:
        return f"{self.isa} {self.form}"

    def describe(self) -> str:
        if not self.step_us:
            return f"{self.isa}, {self.form} dots"
        figures = "; ".join(
            f"{build} " + " / ".join(f"{us / 1000:.1f}" for us in by_rows.values())
            for build, by_rows in self.step_us.items()
        )
        rows = " / ".join(next(iter(self.step_us.values())).keys())
        return f"{self.isa}, {self.form} dots, measured ms a step at {rows} rows: {figures}"


def choose_form(
    model: LlamaModel,
    block_size: int,
    threads: int,
    make_decoder: DecoderFactory,
    directory: Path | None = None,
    isas: list[str] | None = None,
) -> tuple[ctypes.CDLL, FormChoice] | None:
    """This CPU's fastest build for `model` and its library, measured once per key and then read; None where
    nothing builds. A build that is alone in building is taken without measuring. `isas`: the instruction
    sets to consider (this CPU's by default)."""
    directory = directory or build_dir()
    isas = cpu_isas() if isas is None else isas
    key = _key(model, threads)
    kept = _read_choices(directory).get(key)
    if kept is not None and kept.get("isa") in isas and kept.get("form") in DOT_FORMS:
        library = load_decode_library(kept["isa"], cache_dir=directory, form=kept["form"])
        if library is not None:
            return library, FormChoice(kept["isa"], kept["form"], kept.get("step_us", {}))
    libraries = {
        FormChoice(isa, form): library
        for isa in isas
        for form in DOT_FORMS
        if (library := load_decode_library(isa, cache_dir=directory, form=form)) is not None
    }
    if not libraries:
        return None
    if len(libraries) == 1:
        build, library = next(iter(libraries.items()))
        return library, build
    step_us = measure_forms(libraries, model, block_size, make_decoder)
    best = min(libraries, key=lambda build: math.prod(step_us[build.name].values()))
    choice = FormChoice(best.isa, best.form, step_us, measured_now=True)
    _write_choice(directory, key, choice)
    logger.info("native decode step: %s", choice.describe())
    return libraries[best], choice


def measure_forms(
    libraries: dict[FormChoice, ctypes.CDLL], model: LlamaModel, block_size: int, make_decoder: DecoderFactory
) -> dict[str, dict[str, float]]:
    """Median µs per decode step of each build, by rows, over a scratch KV cache; builds alternate by round
    so that a slow moment of the machine falls on all of them."""
    blocks_per_row = -(-(PROBE_CONTEXT + 1) // block_size)
    scratch = KVCache.allocate(model.config, max(PROBE_BATCHES) * blocks_per_row, block_size)
    decoders = {build.name: make_decoder(library, build, scratch) for build, library in libraries.items()}
    samples: dict[str, dict[int, list[float]]] = {
        name: {rows: [] for rows in PROBE_BATCHES} for name in decoders
    }
    for rows in PROBE_BATCHES:
        chunks = [
            SequenceChunk([row + 1], PROBE_CONTEXT, range(row * blocks_per_row, (row + 1) * blocks_per_row))
            for row in range(rows)
        ]
        metadata = build_paging_metadata(chunks, block_size)
        ids = torch.tensor([chunk.token_ids[0] for chunk in chunks])
        for decoder in decoders.values():
            decoder.decode(ids, metadata)  # warm: threads started, pages touched
        for _ in range(ROUNDS):
            for name, decoder in decoders.items():
                started = time.perf_counter()
                for _ in range(STEPS_PER_ROUND[rows]):
                    decoder.decode(ids, metadata)
                elapsed = time.perf_counter() - started
                samples[name][rows].append(elapsed / STEPS_PER_ROUND[rows] * 1e6)
    return {
        name: {str(rows): round(statistics.median(times), 1) for rows, times in by_rows.items()}
        for name, by_rows in samples.items()
    }


def _key(model: LlamaModel, threads: int) -> str:
    config = model.config
    dimensions = (
        f"{config.hidden_size}x{config.intermediate_size}x{config.num_layers}x{config.num_heads}"
        f"x{config.num_kv_heads}x{config.vocab_size}"
    )
    return f"{_cpu_name()}|{source_digest()}|{dimensions}|{threads} threads"


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.partition(":")[2].strip()
    except OSError:
        pass
    return "unknown cpu"


def _read_choices(directory: Path) -> dict[str, dict]:  # type: ignore[type-arg]
    try:
        choices = json.loads((directory / CHOICES_FILE).read_text())
    except (OSError, ValueError):
        return {}
    return choices if isinstance(choices, dict) else {}


def _write_choice(directory: Path, key: str, choice: FormChoice) -> None:
    """Add `choice` under `key`, written whole and renamed into place (a reader never sees half a file).
    Choices measured on an older source are dropped: their builds are gone (native_build)."""
    current = f"|{source_digest()}|"
    choices = {kept: entry for kept, entry in _read_choices(directory).items() if current in kept}
    choices[key] = {"isa": choice.isa, "form": choice.form, "step_us": choice.step_us}
    try:
        directory.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile("w", dir=directory, suffix=".json", delete=False) as partial:
            json.dump(choices, partial, indent=1, sort_keys=True)
        os.replace(partial.name, directory / CHOICES_FILE)
    except OSError as error:
        logger.warning("native decode step: could not keep the measured choice (%s)", error)
