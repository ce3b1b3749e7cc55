"""`kvgate calibrate`: fit the English profile's calibration on labelled pairs files and write it.

The embedder and the shipped verifier score every pair, the guards and near-duplicates are marked as the rule
reads them, and `fit_calibration` (`semantic/rule/calibration_fit.py`) fits the combiner and a threshold per
target. The pairs are scored as the shipped calibration's rule scores them: with its second opinion
(`semantic/rule/second_opinion.py`) where it has one. With the hits reported through `/admin/feedback`
(`evaluation/reported_pairs.py`), every one reported wrong is then refused.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

from evaluation.pair_sets import file_part
from evaluation.probes import default_embedder
from evaluation.reported_pairs import refuse_reported, reported_pairs
from semantic.guards.language import pair_refusal
from semantic.guards.near_duplicate import near_duplicate_reason
from semantic.guards.registry import GUARDS_BY_NAME, first_veto
from semantic.rule.calibrated_rule import PairScorer
from semantic.rule.calibration import DEFAULT_TARGET_FALSE_HIT_RATE, Calibration, file_sha256
from semantic.rule.calibration_fit import (
    DEFAULT_GUARDS,
    MIN_LANGUAGE_PAIRS,
    fit_calibration,
    measured_languages,
)
from semantic.rule.loading import shipped_verifier
from semantic.rule.profiles import ENGLISH, MULTILINGUAL
from semantic.rule.second_opinion import SecondOpinion, SecondOpinionSettings


def calibrate(
    paths: Sequence[Path],
    out: Path,
    *,
    part: str = "all",
    low_cosine: float | None = None,
    guards: tuple[str, ...] = DEFAULT_GUARDS,
    limit: int | None = None,
    on_progress: Callable[[int, int], None] | None = None,
    feedback: Path | None = None,
) -> Path:
    """Fit the rule's target -> threshold map on labelled pairs files (`part` of each) and write it to `out`.

    The verifier scores every pair above a loose cosine floor, so the fit sees the whole uncertain band.
    `low_cosine` defaults to the shipped calibration's gate. `feedback` is a file of reported hits (the
    gateway's `feedback.jsonl`, read whole): its pairs join the fit, then every fitted threshold is raised
    above the pairs reported wrong, so that the calibration written refuses each of them (`refuse_reported`).
    """
    pairs = [pair for path in paths for pair in file_part(path, part, limit)]
    reported = reported_pairs(feedback) if feedback is not None else []
    reported_wrong = np.array([False] * len(pairs) + [pair.label == 0 for pair in reported], dtype=bool)
    pairs += reported
    shipped = Calibration.load(ENGLISH.calibration)
    gate = low_cosine if low_cosine is not None else shipped.low_cosine
    embedder = default_embedder()
    # The shipped rule's scorer: the English verifier, with the second opinion where the shipped one has it.
    verifier: PairScorer = shipped_verifier(ENGLISH)
    if shipped.second_opinion is not None:
        settings = SecondOpinionSettings.from_json(shipped.second_opinion)
        verifier = SecondOpinion(verifier, shipped_verifier(MULTILINGUAL), settings)
    similarities = np.zeros(len(pairs), dtype=np.float32)
    probabilities = np.zeros(len(pairs), dtype=np.float32)
    for start in range(0, len(pairs), 256):
        chunk = pairs[start : start + 256]
        stored, looked_up = (
            embedder.embed([pair.a for pair in chunk]),
            embedder.embed([pair.b for pair in chunk]),
        )
        cosines = (stored * looked_up).sum(axis=1)
        similarities[start : start + len(chunk)] = cosines
        reach = [index for index, cosine in enumerate(cosines) if cosine >= gate]
        scored = verifier.probabilities([(chunk[index].b, chunk[index].a) for index in reach])
        probabilities[[start + index for index in reach]] = scored
        if on_progress is not None:
            on_progress(start + len(chunk), len(pairs))
    chosen = tuple(GUARDS_BY_NAME[name] for name in guards)
    languages = measured_languages([(pair.a, pair.b, pair.label) for pair in pairs])
    if not languages:
        raise ValueError(
            f"no language has {MIN_LANGUAGE_PAIRS} positive and {MIN_LANGUAGE_PAIRS} negative pairs in these "
            "files: too few to calibrate"
        )
    # Pairs the served rule will refuse for their language compete for no threshold.
    vetoed = np.array(
        [
            pair_refusal(pair.b, pair.a, languages) is not None
            or first_veto(pair.b, pair.a, chosen) is not None
            for pair in pairs
        ]
    )
    near = np.array([near_duplicate_reason(pair.b, pair.a) is not None for pair in pairs])
    labels = np.array([pair.label for pair in pairs])
    fitted_on: dict[str, object] = {"files": [path.name for path in paths], "part": part, "pairs": len(pairs)}
    if feedback is not None:
        fitted_on["feedback"] = {
            "file": feedback.name,
            "pairs": len(reported),
            "wrong": int(reported_wrong.sum()),
        }
    calibration = fit_calibration(
        similarities,
        probabilities,
        vetoed,
        labels,
        near_duplicates=near,
        low_cosine=gate,
        guards=guards,
        verifier_sha256=file_sha256(ENGLISH.weights),
        fitted_on=fitted_on,
        languages=languages,
        combiner_target=DEFAULT_TARGET_FALSE_HIT_RATE,
        second_opinion=shipped.second_opinion,
    )
    judged = (similarities >= gate) & ~vetoed
    calibration = refuse_reported(
        calibration, similarities, probabilities, judged, near, labels, reported_wrong
    )
    return calibration.save(out)
