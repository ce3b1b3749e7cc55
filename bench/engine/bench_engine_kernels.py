"""Microseconds of one projection of SmolLM2-135M in each weights format, per shape, batch and thread count.

    .venv/bin/python bench/engine/bench_engine_kernels.py [--threads 1 2] [--batches 1 16 64]

The same `make_projection` modules the engine runs (random weights; speed does not depend on values), best of
5 rounds. The shapes are a layer's four projections (q/k/v fused, o, gate/up fused, down) and the tied head,
which is int8 in the int4 format. Read it with `torch.backends.cpu.get_cpu_capability()`, printed first:
which format wins is a property of the CPU (see engine/weights/choice.py).
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Sequence

import torch

from engine.weights.formats import WEIGHTS_FORMATS, make_projection

SHAPES = {
    "qkv": (576, 960),
    "o": (576, 576),
    "gate_up": (576, 3072),
    "down": (1536, 576),
    "head": (576, 49152),
}


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 16, 64])
    args = parser.parse_args(argv)
    print(f"cpu capability: {torch.backends.cpu.get_cpu_capability()}, torch {torch.__version__}\n")
    print("| threads | batch | projection | " + " | ".join(f"{f} µs" for f in WEIGHTS_FORMATS) + " | best |")
    print("|---" * (4 + len(WEIGHTS_FORMATS)) + "|")
    for threads in args.threads:
        torch.set_num_threads(threads)
        for batch in args.batches:
            totals = dict.fromkeys(WEIGHTS_FORMATS, 0.0)
            for name, (in_features, out_features) in SHAPES.items():
                weight = torch.randn(out_features, in_features) * 0.02
                x = torch.randn(batch, in_features)
                row = {}
                for weights_format in WEIGHTS_FORMATS:
                    stored = "int8" if name == "head" and weights_format == "int4" else weights_format
                    row[weights_format] = best_us(make_projection([weight], None, stored), x)
                    # A decode step runs each layer projection 30 times and the head once.
                    totals[weights_format] += row[weights_format] * (1 if name == "head" else 30)
                print_row(threads, batch, name, row)
            print_row(threads, batch, "**one step's matmuls**", totals)


def print_row(threads: int, batch: int, name: str, row: dict[str, float]) -> None:
    cells = " | ".join(f"{row[f]:.0f}" for f in WEIGHTS_FORMATS)
    print(f"| {threads} | {batch} | {name} | {cells} | {min(row, key=row.__getitem__)} |")


@torch.inference_mode()
def best_us(projection: torch.nn.Module, x: torch.Tensor) -> float:
    repeats = max(3, int(2e5 / (x.shape[0] * projection(x).shape[1])))
    best = float("inf")
    for _ in range(5):
        started = time.perf_counter()
        for _ in range(repeats):
            projection(x)
        best = min(best, (time.perf_counter() - started) / repeats)
    return best * 1e6


if __name__ == "__main__":
    main()
