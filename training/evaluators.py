"""How the device trainer scores a checkpoint on a bundle's calibration rows, per profile.

- English (`CalibrationEvaluator`): fits the calibration exactly as `bench/semantic/bench_rule.py
  --write-calibration` does (`fit_calibration`, combiner chosen for the 2% target) and reads, at that target's
  threshold, precision and recall on each calibration set and the share of chatbot lookups served a
  paraphrase (`selection_score` weighs them).
- Multilingual (`LanguageEvaluator`): places one threshold where, in every language, at most 2% of its hits
  would be wrong (`fit_shared_threshold`), and reads each language's recall there; the score is the mean
  recall over the languages, less the share of lookups served a non-paraphrase.

Only calibration parts are in a bundle: the test parts stay for `kvgate eval-pairs`.
"""

from __future__ import annotations

import gzip
import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import load_file

from semantic.rule.calibration import DEFAULT_TARGET_FALSE_HIT_RATE
from semantic.rule.calibration_fit import DEFAULT_GUARDS, fit_calibration
from semantic.rule.language_thresholds import MIN_COSINE, fit_shared_threshold
from semantic.verifier.e5_torch import encode_e5_pairs
from semantic.verifier.minilm import encode_pairs
from semantic.verifier.pair_classifier import PairClassifier
from training.training_loop import Example

# The selection score of weights on which no calibration target can be fitted: below any fitted one.
UNFIT_SCORE = -100.0
# The English rows are scored from this cosine up, as bench_rule.py scores them.
ENGLISH_GATE = 0.5
TARGET = 0.02


def gated_probabilities(
    model: PairClassifier,
    device: torch.device,
    tokenizer: Any,
    encode: Callable[[Any, Sequence[tuple[str, str]], int], dict[str, torch.Tensor]],
    pairs: Sequence[tuple[str, str]],
    cosines: np.ndarray,
    gate: float,
) -> np.ndarray:
    """P(same) for each (query=b, candidate=a) row whose cosine reaches `gate` (0 below it), 256 rows a
    batch in order of length."""
    model.eval()
    scores = np.zeros(len(pairs))
    band = sorted(
        np.flatnonzero(cosines >= gate), key=lambda index: len(pairs[index][0]) + len(pairs[index][1])
    )
    with torch.inference_mode():
        for start in range(0, len(band), 256):
            chunk = band[start : start + 256]
            batch = encode(tokenizer, [(pairs[index][1], pairs[index][0]) for index in chunk], 96)
            logits = model(**{key: value.to(device) for key, value in batch.items()}).float()
            scores[chunk] = torch.sigmoid(logits).cpu().numpy()
    return scores


def known_tokens(bundle: Path, tokenizer: Any) -> torch.Tensor:
    """Which token ids have their word-embedding row in the bundle."""
    known = torch.zeros(tokenizer.vocab_size, dtype=torch.bool)
    known[load_file(str(bundle / "base" / "word_embeddings.safetensors"))["ids"]] = True
    return known


def check_known(tokenizer: Any, known: torch.Tensor, examples: list[Example]) -> None:
    """Every token the examples use has its embedding row in the bundle (else it would read zeros)."""
    texts = sorted({text for example in examples for text in (example.a, example.b)})
    for start in range(0, len(texts), 4096):
        for ids in tokenizer(texts[start : start + 4096])["input_ids"]:
            if not bool(known[torch.tensor(ids)].all()):
                raise ValueError("a training text uses a token whose embedding is not in the bundle")


class CalibrationEvaluator:
    """Fits the English calibration on the bundle's rows with a model's scores and reads what it serves."""

    def __init__(self, bundle: Path, tokenizer: Any, known: torch.Tensor, limit: int) -> None:
        with gzip.open(bundle / "calibration.jsonl.gz", "rt", encoding="utf-8") as lines:
            self.pairs = [tuple(json.loads(line)) for line in lines]
        arrays = np.load(bundle / "calibration.npz")
        self.labels = arrays["labels"]
        self.cosines = arrays["cosines"]
        self.vetoed = arrays["vetoed"]
        self.near = arrays["near_duplicates"]
        self.group = arrays["group"]
        self.set = arrays["set"]
        self.set_names = [str(name) for name in arrays["set_names"]]
        self.has_paraphrase = arrays["has_paraphrase"]
        if limit:
            keep = np.arange(len(self.pairs)) < limit
            self.pairs = self.pairs[:limit]
            self.labels, self.cosines, self.vetoed, self.near, self.group, self.set = (
                values[keep]
                for values in (self.labels, self.cosines, self.vetoed, self.near, self.group, self.set)
            )
        self.tokenizer = tokenizer
        check_known(tokenizer, known, [Example(a, b, 0.0) for a, b in self.pairs])

    def measure(self, model: PairClassifier, device: torch.device) -> dict[str, float]:
        probabilities = gated_probabilities(
            model, device, self.tokenizer, encode_pairs, self.pairs, self.cosines, ENGLISH_GATE
        )
        try:
            calibration = fit_calibration(
                self.cosines,
                probabilities.astype(np.float32),
                self.vetoed,
                self.labels,
                near_duplicates=self.near,
                low_cosine=ENGLISH_GATE,
                guards=DEFAULT_GUARDS,
                verifier_sha256="",
                fitted_on={},
                lookups=self.group,
                combiner_target=DEFAULT_TARGET_FALSE_HIT_RATE,
            )
        except ValueError:  # no target met on these rows (a dry run's few rows, or a broken checkpoint)
            return {"threshold": float("inf"), "score": UNFIT_SCORE}
        threshold = calibration.threshold_for(DEFAULT_TARGET_FALSE_HIT_RATE)
        eligible = (self.cosines >= ENGLISH_GATE) & ~self.vetoed
        scores = np.full(len(self.labels), -np.inf)
        for index in np.flatnonzero(eligible):
            scores[index] = (
                2.0
                if self.near[index]
                else calibration.combine(float(self.cosines[index]), float(probabilities[index]))
            )
        hits = scores >= threshold
        found: dict[str, float] = {
            "threshold": round(float(threshold), 5),
            "combiner_cosine": calibration.combiner[0],
        }
        for set_index, set_name in enumerate(self.set_names):
            rows = self.set == set_index
            if not rows.any():
                continue
            if set_name.startswith("lookups-"):
                served = right = 0
                lookups = np.unique(self.group[rows])
                for lookup in lookups:
                    members = np.flatnonzero(self.group == lookup)
                    best = members[np.argmax(scores[members])]
                    if hits[best]:
                        served += 1
                        right += int(self.labels[best])
                with_paraphrase = int(self.has_paraphrase[lookups].sum())
                found[f"{set_name}/served_right"] = round(right / max(with_paraphrase, 1), 4)
                found[f"{set_name}/wrong"] = round((served - right) / max(served, 1), 4)
            else:
                labels = self.labels[rows]
                set_hits = hits[rows]
                found[f"{set_name}/precision"] = round(
                    float(labels[set_hits].mean()) if set_hits.any() else 1.0, 4
                )
                found[f"{set_name}/recall"] = round(float(set_hits[labels == 1].mean()), 4)
        found["score"] = round(selection_score(found), 5)
        return found


def selection_score(found: dict[str, float]) -> float:
    """Chatbot recall first (issue 34), lookups, Quora and adversarial recall after; precision below each
    set's bar (Quora 0.955, chatbot 0.99, adversarial 0.98, lookups 1% wrong) costs 20 per point."""
    score = found.get("chatbot/recall", 0.0) + 0.5 * found.get("lookups-chatbot/served_right", 0.0)
    score += 0.5 * found.get("reviewed/recall", 0.0) + 0.5 * found.get("adversarial/recall", 0.0)
    for key, bar in (
        ("reviewed/precision", 0.955),
        ("chatbot/precision", 0.99),
        ("adversarial/precision", 0.98),
    ):
        score -= 20 * max(0.0, bar - found.get(key, 1.0))
    score -= 20 * max(0.0, found.get("lookups-chatbot/wrong", 0.0) - 0.01)
    return score


class LanguageEvaluator:
    """Scores the calibration rows, fits a threshold per language, reads recall and lookups served wrong."""

    def __init__(self, bundle: Path, tokenizer: Any, limit: int) -> None:
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

    def measure(self, model: PairClassifier, device: torch.device) -> dict[str, float]:
        scores = gated_probabilities(
            model, device, self.tokenizer, encode_e5_pairs, self.pairs, self.cosines, MIN_COSINE
        )
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
        found["score"] = round(float(np.mean(recalls)) - 0.05 * wrong_lookups, 5) if recalls else UNFIT_SCORE
        return found
