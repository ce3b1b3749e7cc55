"""Reported hits in calibration: the pairs of a feedback file, and a fitted calibration made to refuse every
pair reported wrong.

A feedback file (`feedback.jsonl` in the gateway's data dir, written by `/admin/feedback`) is a pairs file:
`a` the stored prompt, `b` the prompt it was served for, `label` 0 when the hit was reported wrong, 1 when
right. `kvgate calibrate` fits on its pairs with the others, then `refuse_reported` raises each fitted point's
threshold above the highest combined score of the pairs reported wrong: what a person saw served wrongly is
refused at every target, whatever the fit's counts allowed. Knows the calibration's scores; nothing about
Redis or HTTP.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import numpy.typing as npt

from evaluation.pair_sets import LabelledPair, load_pairs
from semantic.rule.calibration import Calibration, CalibrationPoint
from semantic.rule.calibration_fit import MIN_CALIBRATION_HITS, combined_scores


def reported_pairs(path: Path) -> list[LabelledPair]:
    """The distinct pairs of a feedback file, in file order: a hit reported many times teaches the fit once."""
    return list(dict.fromkeys(load_pairs(path)))


def refuse_reported(
    calibration: Calibration,
    similarities: npt.NDArray[np.float32],
    probabilities: npt.NDArray[np.float32],
    judged: npt.NDArray[np.bool_],
    near_duplicates: npt.NDArray[np.bool_],
    labels: npt.NDArray[np.int_],
    reported_wrong: npt.NDArray[np.bool_],
) -> Calibration:
    """`calibration` with every point's threshold above the combined score of each row `reported_wrong`.

    `judged` marks the rows the rule scores (past the cosine gate, the guards and the language check); a row
    reported wrong outside it is refused already. A raised point is measured again on these rows (hits at
    or above its new threshold, near-duplicates included) and dropped when it serves fewer than
    MIN_CALIBRATION_HITS or more wrong hits than its target allows. Raises `ValueError` when a row reported
    wrong is a near-duplicate (served without the verifier: no threshold refuses it) or no point is left.
    """
    unrefusable = np.flatnonzero(reported_wrong & judged & near_duplicates)
    if len(unrefusable):
        raise ValueError(
            f"{len(unrefusable)} pair(s) reported wrong are near-duplicates, which the rule serves without the "
            "verifier: no threshold can refuse them (the gateway's veto still does, per tenant). Leave the "
            "feedback out (--no-feedback) or remove those lines from it."
        )
    scores = combined_scores(calibration, similarities, probabilities, judged, near_duplicates)
    wrong = reported_wrong & judged
    if not wrong.any():
        return calibration
    bar = float(np.nextafter(scores[wrong].max(), np.inf))  # the rule serves a score >= its threshold
    served = scores >= bar
    hits = int(served.sum())
    wrong_hits = int((served & (labels == 0)).sum())
    rate = wrong_hits / hits if hits else 0.0
    recall = int((served & (labels == 1)).sum()) / max(int(labels.sum()), 1)
    points: list[CalibrationPoint] = []
    for point in calibration.points:
        if point.threshold >= bar:
            points.append(point)
        elif hits >= MIN_CALIBRATION_HITS and rate <= point.target:
            points.append(CalibrationPoint(point.target, bar, round(rate, 5), round(recall, 5), hits))
    if not points:
        raise ValueError(
            "refusing the pairs reported wrong leaves no target that these pairs can show is met: "
            f"{hits} hits above the highest score of a pair reported wrong ({bar:.4f})"
        )
    return dataclasses.replace(calibration, points=tuple(points))
