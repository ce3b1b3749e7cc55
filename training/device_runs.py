"""Recipes run side by side on one lent GPU: a process per recipe, then the best checkpoints cut into pieces
that come back from the machine. Used by `train_on_device.py`, for
either language profile; each recipe process writes `<work>/<recipe>.log`,
`<work>/<recipe>.metrics.jsonl` (one row per evaluation: recipe, step, score, ...) and keeps its best
weights in `<work>/<recipe>.best.safetensors`.
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

PIECE_BYTES = 15 * 2**20  # what comes back from the device machine must be under 16 MiB a file


def run_recipes(script: str, args: argparse.Namespace, options: tuple[str, ...]) -> None:
    """Run `script --recipe NAME` for each of `args.recipes` at once (passing `options` and --out), wait,
    and copy every metric and the best `args.keep` checkpoints to `args.out`."""
    args.work.mkdir(parents=True, exist_ok=True)
    args.out.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    names = args.recipes.split(",")
    processes = []
    for name in names:
        command = [sys.executable, script, "--recipe", name, "--out", str(args.out)]
        for option in options:
            command += [f"--{option.replace('_', '-')}", str(getattr(args, option))]
        with (args.work / f"{name}.log").open("w") as log:
            processes.append(subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT))
    codes = [process.wait() for process in processes]
    log_path = args.out / "train.log"
    log_path.write_text(
        "".join((args.work / f"{name}.log").read_text() for name in names)
        + f"recipes exited {codes} after {(time.perf_counter() - started) / 60:.1f} min\n"
    )
    metrics = [
        json.loads(line)
        for name in names
        if (path := args.work / f"{name}.metrics.jsonl").is_file()
        for line in path.read_text().splitlines()
    ]  # this run's recipes only: an earlier run's files may lie in the same --work
    (args.out / "metrics.jsonl").write_text("".join(json.dumps(row) + "\n" for row in metrics))
    keep_best(metrics, args.work, args.out, args.keep)
    print(log_path.read_text()[-6000:], flush=True)
    if any(codes):
        raise SystemExit(f"a recipe failed: exit codes {codes}")


def keep_best(metrics: list[dict[str, object]], work: Path, out: Path, keep: int) -> None:
    """Each recipe's best-scored evaluation; the `keep` best of those copied to `out` in pieces."""
    best: dict[str, dict[str, object]] = {}
    for row in metrics:
        recipe = str(row["recipe"])
        if recipe not in best or float(row["score"]) > float(best[recipe]["score"]):  # type: ignore[arg-type]
            best[recipe] = row
    for row in sorted(best.values(), key=lambda row: -float(row["score"]))[:keep]:  # type: ignore[arg-type]
        data = (work / f"{row['recipe']}.best.safetensors").read_bytes()
        for index, offset in enumerate(range(0, len(data), PIECE_BYTES)):
            piece = out / f"{row['recipe']}.step{row['step']}.safetensors.part-{index}"
            piece.write_bytes(data[offset : offset + PIECE_BYTES])
        print(f"kept {row['recipe']} step {row['step']}: {json.dumps(row)}", flush=True)


def checkpoint_keeper(
    name: str,
    work: Path,
    measure: Callable[[], dict[str, float]],
    save: Callable[[Path], None],
    log: Callable[[str], None],
) -> Callable[[int], None]:
    """`evaluate(step)` for one recipe process: `measure()` the current weights, append the row to
    `<work>/<name>.metrics.jsonl`, and `save` them as `<work>/<name>.best.safetensors` when they score best."""
    work.mkdir(parents=True, exist_ok=True)
    metrics_path = work / f"{name}.metrics.jsonl"
    metrics_path.unlink(missing_ok=True)
    best_score = -math.inf

    def evaluate(step: int) -> None:
        nonlocal best_score
        found = measure()
        row = {"recipe": name, "step": step, **found}
        with metrics_path.open("a") as lines:
            lines.write(json.dumps(row) + "\n")
        log(json.dumps(row))
        if found["score"] > best_score:
            best_score = found["score"]
            save(work / f"{name}.best.safetensors")

    return evaluate
