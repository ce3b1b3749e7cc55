"""Train several verifier recipes side by side on one lent GPU and keep the checkpoints that calibrate best,
for either language profile (`--profile english`, the MiniLM verifier; `--profile multilingual`, the
multilingual-e5-small one).

    # here: the bundle (examples, calibration rows, base weights), then on the GPU machine:
    .venv/bin/python training/export_device_bundle.py --profile english --out .device-bundle
    python3 training/train_on_device.py --profile english --bundle .device-bundle --out "$OUT" --minutes 6.5

Each recipe (`training/device_profiles.py`) runs in its own process on the same GPU (a small encoder at batch
32-64 leaves most of it idle). Every `--eval-every` steps a process scores the bundle's calibration rows with
its current weights and calibrates on them as the profile's shipped calibration is fitted
(`training/evaluators.py`); only calibration parts are read, the test parts stay for `kvgate eval-pairs`
here. The best checkpoint of each recipe is kept; the best `--keep` of all come back under `--out`, cut into
pieces under 16 MiB (`cat NAME.part-* > NAME`), with `metrics.jsonl` (every evaluation) and `train.log`.

Needs torch, transformers, tokenizers, safetensors, numpy, regex and scikit-learn: the GPU image has them.
"""

from __future__ import annotations

import argparse
import functools
import gzip
import json
import random
import sys
import time
from pathlib import Path

import torch
from safetensors.torch import load_file

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from semantic.verifier.int8_weights import read_int8_weights
from semantic.verifier.pair_classifier import FROZEN_PREFIX, PairClassifier
from training.device_profiles import DEVICE_PROFILES, ENGLISH_DEVICE, DeviceProfile
from training.device_runs import checkpoint_keeper, run_recipes
from training.training_loop import Example, Schedule, fine_tune, query_groups

SEED = 20240610


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--profile", choices=sorted(DEVICE_PROFILES), default=ENGLISH_DEVICE.language.name)
    parser.add_argument("--bundle", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--minutes", type=float, help="training time of each recipe (default: the profile's)")
    parser.add_argument("--steps", type=int, default=100_000, help="upper bound on each stage's steps")
    parser.add_argument("--eval-every", type=int)
    parser.add_argument("--keep", type=int)
    parser.add_argument("--recipes", help="comma-separated (default: every recipe of the profile)")
    parser.add_argument(
        "--start", type=Path, help="the weights `from_start` recipes start from (default: shipped)"
    )
    parser.add_argument("--threads", type=int, default=2, help="torch threads of each recipe process")
    parser.add_argument("--recipe", help="run this one recipe in this process (what the parent starts)")
    parser.add_argument("--work", type=Path)
    parser.add_argument(
        "--eval-rows", type=int, default=0, help="evaluate on this many rows (0: all; a dry run)"
    )
    args = parser.parse_args()
    profile = DEVICE_PROFILES[args.profile]
    defaults = {
        "minutes": profile.minutes,
        "eval_every": profile.eval_every,
        "keep": profile.keep,
        "recipes": ",".join(profile.recipes),
        "start": profile.language.weights,
        "work": profile.work,
    }
    for option, value in defaults.items():
        if getattr(args, option) is None:
            setattr(args, option, value)
    if args.recipe:
        run_recipe(args, profile)
    else:
        run_recipes(
            __file__,
            args,
            ("profile", "bundle", "minutes", "steps", "eval_every", "work", "eval_rows", "start", "threads"),
        )


def run_recipe(args: argparse.Namespace, profile: DeviceProfile) -> None:
    name: str = args.recipe
    recipe = profile.recipes[name]
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    torch.set_num_threads(args.threads)  # several recipes share the machine's cores
    rng = random.Random(SEED)
    began = time.perf_counter()
    torch.manual_seed(SEED)
    base_dir = args.bundle / "base"
    tokenizer = profile.tokenizer(base_dir)
    model = bundled_classifier(base_dir, args.start if recipe.from_start else None, profile).to(device)
    for parameter_name, parameter in model.named_parameters():
        parameter.requires_grad = not parameter_name.startswith(FROZEN_PREFIX)
    evaluator = profile.evaluator(args.bundle, tokenizer, args.eval_rows)
    steps_before = 0

    def log(line: str) -> None:
        print(f"[{name} {time.perf_counter() - began:6.1f}s] {line}", flush=True)

    evaluate = checkpoint_keeper(
        name,
        args.work,
        lambda: evaluator.measure(model, device),
        lambda path: profile.save_weights(model, path),
        log,
    )

    evaluate(0)
    for stage in recipe.stages:
        examples: list[Example] = []
        for stage_name in stage.examples:
            shown = read_examples(args.bundle, stage_name)
            if stage.listwise_weight > 0:  # group ids stay distinct across the stage's files and repeats
                shown = query_groups(shown, first_id=1 + max((ex.group for ex in examples), default=-1))
            examples += shown
        profile.check_examples(args.bundle, tokenizer, examples)
        schedule = Schedule(
            steps=args.steps,
            batch_size=stage.batch_size,
            learning_rate=stage.learning_rate,
            minutes=args.minutes * stage.share,
            max_tokens=profile.max_tokens,
            checkpoint_every=args.eval_every,
            ranking_weight=stage.ranking_weight,
            ranking_margin=stage.ranking_margin,
            label_smoothing=stage.label_smoothing,
            listwise_weight=stage.listwise_weight,
        )
        log(
            f"stage {'+'.join(stage.examples)}: {len(examples)} examples, lr {stage.learning_rate}, bs {stage.batch_size}"
        )
        offset = steps_before
        taken = fine_tune(
            model,
            tokenizer,
            examples,
            schedule,
            rng,
            device=device,
            on_checkpoint=functools.partial(lambda offset, step: evaluate(offset + step), offset),
            log=log,
            encode=profile.encode,
        )
        steps_before += taken
        evaluate(steps_before)


def bundled_classifier(
    base_dir: Path, weights: Path | None, profile: DeviceProfile = ENGLISH_DEVICE
) -> PairClassifier:
    """The classifier from the bundle's base weights (word-embedding rows of the used tokens only, others
    zero), with `weights` (trained, every tensor but the word embeddings, stored as the profile stores them)
    laid over it. A bundle may leave the base encoder's weights out when `weights` is given: they hold every
    one of them."""
    from transformers import BertConfig

    model = PairClassifier(BertConfig.from_pretrained(str(base_dir), local_files_only=True))
    if (base_dir / "encoder.safetensors").is_file():
        # fp16 tensors, or int8 rows with a scale per row: `read_int8_weights` reads either as float32.
        encoder = read_int8_weights(base_dir / "encoder.safetensors")
        missing, _ = model.encoder.load_state_dict(encoder, strict=False)
        if [name for name in missing if "word_embeddings" not in name and not name.endswith("position_ids")]:
            raise ValueError(f"bundle lacks {missing[:3]}")
    elif weights is None:
        raise ValueError(f"{base_dir} holds no encoder.safetensors: give trained weights to start from")
    rows = load_file(str(base_dir / "word_embeddings.safetensors"))
    with torch.no_grad():
        table = model.encoder.embeddings.word_embeddings.weight
        table.zero_()
        table[rows["ids"]] = rows["rows"].float() * rows["scales"][:, None]
    if weights is not None:
        profile.load_weights(model, weights)
    return model


def read_examples(bundle: Path, stage: str) -> list[Example]:
    with gzip.open(bundle / "examples" / f"{stage}.jsonl.gz", "rt", encoding="utf-8") as lines:
        return [Example(a, b, float(target)) for a, b, target in map(json.loads, lines)]


if __name__ == "__main__":
    main()
