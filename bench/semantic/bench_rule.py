"""Measure the decision rule on held-out pairs, piece by piece, and (optionally) write the shipped calibration.

    .venv/bin/python bench/semantic/bench_rule.py                       # report only
    .venv/bin/python bench/semantic/bench_rule.py --write-calibration   # also refit semantic/rule/calibration.json

Splits are those of `evaluation.pair_sets`: the calibration is fitted on the `calibration` parts of the
reviewed Quora sample and the adversarial pairs together; every figure is reported on their `test` parts
and on mrpc `test`, none of which the verifier trained on. Prints, per split: what each guard, the
verifier and their combination reach at 95% precision; then the calibrated rule at each target next to a
plain cosine threshold; then latency.
Cosines (per split) and verifier scores (per split and weights file) are cached under bench/out/.
"""

from __future__ import annotations

import argparse
import hashlib
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import numpy.typing as npt
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from evaluation.pair_sets import (
    CALIBRATION_SETS,
    DEV_SPLIT,
    LOOKUP_CALIBRATION_SETS,
    MRPC_FILE,
    LabelledPair,
    file_part,
)
from evaluation.probes import PairOutcome, default_embedder
from evaluation.scope_lookups import populated_scope, scope_lookups
from evaluation.scoring import recall_at_precision, roc_auc, score_outcomes
from semantic.guards.near_duplicate import near_duplicate_reason
from semantic.guards.registry import ALL_GUARDS, GUARDS_BY_NAME, Guard
from semantic.rule.calibrated_rule import CalibratedRule, PairScorer
from semantic.rule.calibration import DEFAULT_TARGET_FALSE_HIT_RATE, Calibration, file_sha256
from semantic.rule.calibration_fit import (
    DEFAULT_GUARDS,
    DEFAULT_SET_BOUNDS,
    fit_calibration,
    set_false_hit_rates,
)
from semantic.rule.profiles import ENGLISH, MULTILINGUAL, SHIPPED_CALIBRATION
from semantic.rule.profiles import VERIFIER_WEIGHTS as WEIGHTS_FILE
from semantic.rule.second_opinion import SecondOpinion, SecondOpinionSettings
from semantic.rule.verdict import Verdict

DATA_DIR = Path(__file__).resolve().parents[3] / "shared" / "data"
CACHE_DIR = Path(__file__).resolve().parents[1] / "out"
LOW_COSINE = 0.5
REPORTED = ("reviewed/test", "adversarial/test", "chatbot/test", "mrpc/test")
# Candidates of each lookup in a populated scope that the calibration sees: the cache judges this many
# (`CacheConfig.judged`).
LOOKUP_CANDIDATES = 3
Floats = npt.NDArray[np.float64]


class Features:
    """Per pair of one split: label, cosine, verifier probability (0 below the cosine gate), guard vetoes."""

    def __init__(self, pairs: list[LabelledPair], cosines: Floats, probabilities: Floats) -> None:
        self.pairs = pairs
        self.labels = np.array([pair.label for pair in pairs])
        self.cosines = cosines
        self.probabilities = probabilities

    def vetoed(self, guards: Sequence[Guard]) -> npt.NDArray[np.bool_]:
        return np.array([any(guard.differs(pair.b, pair.a) for guard in guards) for pair in self.pairs])

    def near_duplicates(self) -> npt.NDArray[np.bool_]:
        return np.array([near_duplicate_reason(pair.b, pair.a) is not None for pair in self.pairs])

    def __add__(self, other: Features) -> Features:
        return Features(
            self.pairs + other.pairs,
            np.concatenate([self.cosines, other.cosines]),
            np.concatenate([self.probabilities, other.probabilities]),
        )


class MemoScorer:
    """Serves precomputed verifier probabilities to the real rule code (keyed by (query, candidate))."""

    name = "memo"

    def __init__(self, features: Features) -> None:
        self.table = {
            (pair.b, pair.a): float(p) for pair, p in zip(features.pairs, features.probabilities, strict=True)
        }

    def probabilities(
        self, pairs: Sequence[tuple[str, str]], batch_size: int = 64
    ) -> npt.NDArray[np.float32]:
        return np.array([self.table[pair] for pair in pairs], dtype=np.float32)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--data-dir", type=Path, default=DATA_DIR)
    parser.add_argument("--weights", type=Path, default=WEIGHTS_FILE)
    parser.add_argument("--write-calibration", action="store_true")
    parser.add_argument(
        "--calibration-out", type=Path, help="also write the fitted calibration here (to read a checkpoint)"
    )
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument(
        "--no-second-opinion",
        action="store_true",
        help="the English verifier alone (the default asks the multilingual one where it is unsure: "
        "semantic/rule/second_opinion.py)",
    )
    parser.add_argument(
        "--guards",
        default=",".join(DEFAULT_GUARDS),
        help=f"comma-separated guards the calibrated rule applies (of {', '.join(GUARDS_BY_NAME)})",
    )
    args = parser.parse_args()
    guard_names = tuple(name for name in args.guards.split(",") if name)
    unknown = set(guard_names) - GUARDS_BY_NAME.keys()
    if unknown:
        raise SystemExit(f"unknown guards {sorted(unknown)}")
    torch.set_num_threads(args.threads)

    verifier: PairScorer = ENGLISH.verifier(args.weights)
    sha = file_sha256(args.weights)
    opinion = None if args.no_second_opinion else SecondOpinionSettings(file_sha256(MULTILINGUAL.weights))
    # Cached scores are keyed by what produced them: the weights, and the second opinion's settings.
    key = sha if opinion is None else hashlib.sha256(f"{sha} {opinion}".encode()).hexdigest()
    if opinion is not None:
        verifier = SecondOpinion(verifier, MULTILINGUAL.verifier(threads=args.threads), opinion)
    splits = {
        f"{name}/{part}": file_part(args.data_dir / file, part)
        for name, file in CALIBRATION_SETS
        for part in ("calibration", "test")
    }
    splits["mrpc/test"] = file_part(args.data_dir / MRPC_FILE, "test")
    features = {name: cached_features(name, pairs, verifier, key) for name, pairs in splits.items()}
    lookups = {
        name: cached_lookup_features(name, splits[f"{name}/calibration"], verifier, key)
        for name in LOOKUP_CALIBRATION_SETS
    }

    for name in REPORTED:
        report_components(name, features[name], guard_names)

    pair_features = sum(
        (features[f"{name}/calibration"] for name, _ in CALIBRATION_SETS[1:]),
        features[f"{CALIBRATION_SETS[0][0]}/calibration"],
    )
    lookup_features, lookup_groups = Features([], np.zeros(0), np.zeros(0)), np.zeros(0, dtype=int)
    for name in LOOKUP_CALIBRATION_SETS:
        found, groups = lookups[name]
        lookup_groups = np.concatenate(
            [lookup_groups, groups + (lookup_groups.max() + 1 if len(lookup_groups) else 0)]
        )
        lookup_features = lookup_features + found
    calibration_features = pair_features + lookup_features
    groups = np.concatenate([np.full(len(pair_features.pairs), -1), lookup_groups])
    sets = np.array(
        [name for name, _ in CALIBRATION_SETS for _ in features[f"{name}/calibration"].pairs]
        + [name for name in LOOKUP_CALIBRATION_SETS for _ in lookups[name][0].pairs]
    )
    guards = tuple(GUARDS_BY_NAME[guard] for guard in guard_names)
    vetoed, near = calibration_features.vetoed(guards), calibration_features.near_duplicates()
    calibration = fit_calibration(
        calibration_features.cosines,
        calibration_features.probabilities,
        vetoed,
        calibration_features.labels,
        near_duplicates=near,
        low_cosine=LOW_COSINE,
        guards=guard_names,
        verifier_sha256=sha,
        fitted_on={
            "files": [file for _, file in CALIBRATION_SETS],
            "part": "calibration",
            "split": DEV_SPLIT,
            "pairs": len(pair_features.pairs),
            "lookups": len(np.unique(lookup_groups)),
            "lookup_candidates": LOOKUP_CANDIDATES,
            "set_bounds": DEFAULT_SET_BOUNDS,
        },
        lookups=groups,
        combiner_target=DEFAULT_TARGET_FALSE_HIT_RATE,
        sets=sets,
        set_bounds=DEFAULT_SET_BOUNDS,
        second_opinion=None if opinion is None else opinion.to_json(),
    )
    by_set = set_false_hit_rates(
        calibration,
        calibration_features.cosines,
        calibration_features.probabilities,
        (calibration_features.cosines >= LOW_COSINE) & ~vetoed,
        near,
        calibration_features.labels,
        sets,
        groups,
        DEFAULT_TARGET_FALSE_HIT_RATE,
    )
    calibration.fitted_on["at_default_target"] = {
        name: {"hits": hits, "wrong": wrong} for name, (hits, wrong) in by_set.items()
    }
    print(
        f"\ncalibration ({', '.join(f'{name}/calibration' for name, _ in CALIBRATION_SETS)}: "
        f"{len(pair_features.pairs)} pairs, and {len(np.unique(lookup_groups))} lookups in their populated scopes):"
    )
    print(
        f"  at the default target {DEFAULT_TARGET_FALSE_HIT_RATE}, per set (bound): "
        + ", ".join(
            f"{name} {wrong}/{hits} wrong ({DEFAULT_SET_BOUNDS[name] * DEFAULT_TARGET_FALSE_HIT_RATE:.3f})"
            for name, (hits, wrong) in by_set.items()
        )
    )
    for point in calibration.points:
        print(
            f"  target {point.target:.3f}: threshold {point.threshold:.4f}  fhr {point.false_hit_rate:.4f}  "
            f"recall {point.recall:.3f}  hits {point.hits}"
        )
    if args.write_calibration:
        print(f"wrote {calibration.save(SHIPPED_CALIBRATION)}")
    if args.calibration_out is not None:
        print(f"wrote {calibration.save(args.calibration_out)}")

    for name in REPORTED:
        report_rule(name, features[name], calibration)
    report_latency(verifier, calibration, features["reviewed/test"])


def cached_features(name: str, pairs: list[LabelledPair], verifier: PairScorer, sha: str) -> Features:
    """Cosines (cached per split) and verifier probabilities (cached per split and weights) of one split.

    The verifier only scores pairs at or above the cosine gate: the rule never asks it about the others.
    """
    stem = name.replace("/", "-")
    cosines = _cached(CACHE_DIR / f"cosines-{stem}.npy", lambda: _cosines(pairs))
    if len(cosines) != len(pairs):
        raise SystemExit(f"bench/out/cosines-{stem}.npy is from another split: delete bench/out/")
    band = np.flatnonzero(cosines >= LOW_COSINE)

    def probabilities() -> Floats:
        scores = np.zeros(len(pairs))
        scores[band] = verifier.probabilities([(pairs[index].b, pairs[index].a) for index in band])
        return scores

    return Features(pairs, cosines, _cached(CACHE_DIR / f"verifier-{stem}-{sha[:12]}.npy", probabilities))


def cached_lookup_features(
    name: str, pairs: list[LabelledPair], verifier: PairScorer, sha: str
) -> tuple[Features, npt.NDArray[np.int_]]:
    """The candidates of every lookup in the populated scope of `pairs` (`evaluation/scope_lookups.py`), as
    (candidate, query) pairs labelled by paraphrase groups, and each row's lookup id."""
    scope = populated_scope(pairs)
    embedder = default_embedder()
    lookups = scope_lookups(
        scope,
        embedder.embed(list(scope.stored)),
        embedder.embed([pair.b for pair in scope.queries]),
        LOOKUP_CANDIDATES,
    )
    rows = [
        LabelledPair(candidate, lookup.query, int(paraphrase), lookup.kind)
        for lookup in lookups
        for candidate, paraphrase in zip(lookup.candidates, lookup.paraphrase, strict=True)
    ]
    groups = np.array([index for index, lookup in enumerate(lookups) for _ in lookup.candidates], dtype=int)
    features = cached_features(f"lookups-{name}", rows, verifier, sha)
    return features, groups


def _cached(path: Path, compute: Callable[[], Floats]) -> Floats:
    if path.exists():
        cached: Floats = np.load(path, allow_pickle=False)
        return cached
    started = time.perf_counter()
    values = np.asarray(compute(), dtype=np.float64)
    path.parent.mkdir(parents=True, exist_ok=True)
    np.save(path, values, allow_pickle=False)
    print(f"computed {path.name} in {time.perf_counter() - started:.0f}s", flush=True)
    return values


def _cosines(pairs: list[LabelledPair]) -> Floats:
    embedder = default_embedder()
    stored, looked_up = embedder.embed([pair.a for pair in pairs]), embedder.embed([pair.b for pair in pairs])
    return np.asarray((stored * looked_up).sum(axis=1), dtype=np.float64)


def report_components(name: str, features: Features, chosen: tuple[str, ...]) -> None:
    """Recall at 95% / 90% precision and AUC of each signal alone and combined (vetoed pairs score -1)."""
    labels, cosines, probabilities = features.labels, features.cosines, features.probabilities
    print(f"\n{name}: {len(labels)} pairs, {labels.sum()} positive")
    print(f"  {'signal':44s} {'AUC':>6s} {'R@P.95':>7s} {'R@P.90':>7s}  vetoes pos / neg")
    rows: list[tuple[str, Floats, npt.NDArray[np.bool_] | None]] = [("cosine", cosines, None)]
    for guard in ALL_GUARDS:
        rows.append((f"cosine + {guard.name} guard", cosines, features.vetoed((guard,))))
    gated = np.where(cosines >= LOW_COSINE, probabilities, 0.0)
    rows.append((f"verifier (cosine gate {LOW_COSINE})", gated, None))
    for guard in ALL_GUARDS:
        rows.append((f"verifier + {guard.name} guard", gated, features.vetoed((guard,))))
    for names in dict.fromkeys([DEFAULT_GUARDS, chosen]):
        guards = tuple(GUARDS_BY_NAME[guard] for guard in names)
        rows.append((f"verifier + {'+'.join(names)}", gated, features.vetoed(guards)))
    for label, scores, vetoed in rows:
        if vetoed is not None:
            scores = np.where(vetoed, -1.0, scores)
        vetoes = (
            "" if vetoed is None else f"  {vetoed[labels == 1].mean():.3f} / {vetoed[labels == 0].mean():.3f}"
        )
        print(
            f"  {label:44s} {roc_auc(scores, labels):6.4f} {recall_at_precision(scores, labels, 0.95):7.3f} "
            f"{recall_at_precision(scores, labels, 0.90):7.3f}{vetoes}"
        )


def report_rule(name: str, features: Features, calibration: Calibration) -> None:
    """The calibrated rule at each target, next to the plain cosine threshold with the same recall."""
    print(f"\n{name}: calibrated rule (gate {calibration.low_cosine}, guards {'+'.join(calibration.guards)})")
    for target in [point.target for point in calibration.points]:  # every target the calibration claims
        rule = CalibratedRule(MemoScorer(features), calibration, target)
        questions = [(pair.b, pair.a) for pair in features.pairs]
        verdicts = rule.judge_many(questions, features.cosines.tolist())
        outcomes = [
            PairOutcome(float(cos), verdict) for cos, verdict in zip(features.cosines, verdicts, strict=True)
        ]
        report = score_outcomes(features.pairs, outcomes, target)
        plain = report.baseline_precision_at_same_recall
        verified = lookup_path_agrees(rule, questions, features.cosines.tolist(), verdicts)
        print(
            f"  target {target:.3f}: precision {report.precision:.4f} recall {report.recall:.4f} "
            f"fhr {report.false_hit_rate:.4f} auc {report.auc:.4f} hits {report.hits} | cosine: recall at "
            f"this precision {report.baseline_recall_at_same_precision:.4f}, precision at this recall {plain:.4f}"
            f" | verifier runs on {verified}/{len(questions)} lookups"
        )


def lookup_path_agrees(
    rule: CalibratedRule, questions: list[tuple[str, str]], cosines: list[float], verdicts: list[Verdict]
) -> int:
    """Decide each pair as a lookup does (`quick_verdict`, then the verifier only when undecided); exit if
    any decision differs from `judge_many`'s. Returns how many pairs needed the verifier."""
    verified = 0
    for (query, candidate), cosine, verdict in zip(questions, cosines, verdicts, strict=True):
        quick = rule.quick_verdict(query, candidate, cosine)
        if quick is None:
            verified += 1
            quick = rule.judge(query, candidate, cosine)
        if quick.hit != verdict.hit:
            raise SystemExit(f"the lookup path decides {(query, candidate)} otherwise than judge_many")
    return verified


def report_latency(verifier: PairScorer, calibration: Calibration, features: Features) -> None:
    """Wall time of one `judge` call on pairs that reach the verifier (the slow path of a semantic hit);
    with a second opinion, apart for the pairs it was asked on and the others."""
    rule = CalibratedRule(verifier, calibration)
    band = [index for index in np.flatnonzero(features.cosines >= calibration.low_cosine)[:160]]
    timings: dict[bool, list[float]] = {False: [], True: []}
    for count, index in enumerate(band):
        pair = features.pairs[index]
        asked_before = verifier.asked if isinstance(verifier, SecondOpinion) else 0
        started = time.perf_counter()
        rule.judge(pair.b, pair.a, float(features.cosines[index]))
        elapsed = (time.perf_counter() - started) * 1000
        if count >= 10:  # warm-up
            asked = isinstance(verifier, SecondOpinion) and verifier.asked > asked_before
            timings[asked].append(elapsed)
    print(f"\njudge() through the verifier, {torch.get_num_threads()} threads:")
    for asked, label in ((False, "the English verifier alone"), (True, "with the second opinion")):
        if timings[asked]:
            print(
                f"  {label}: {len(timings[asked])} pairs, p50 {np.percentile(timings[asked], 50):.1f} ms, "
                f"p99 {np.percentile(timings[asked], 99):.1f} ms"
            )


if __name__ == "__main__":
    main()
