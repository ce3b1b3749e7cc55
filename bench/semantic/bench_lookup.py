"""One semantic lookup's own cost, embedding + rule, for the rule of a git revision and for the working tree's.

    .venv/bin/python bench/semantic/bench_lookup.py --baseline-rev 78a1e68

Both rules are loaded side by side in one process, on the same runtime and threads as the gateway's
defaults, and take turns on the same lookups: each embeds `b` (one text, as a lookup does) and judges it
against `a` the way the cache does (`quick_verdict`, then the verifier only when that is undecided), at
the default target. Lookups are pairs of the development sets' test parts with cosine at or above the
rule's gate, so each is a lookup that found a candidate; the verifier runs where the rule needs it.
Prints p50 / p90 per rule and the ratio, and how often each rule's verifier ran. The working tree runs as
the gateway serves it: the language-routed embedder and rule (`semantic/language_routing.py`,
the multilingual profile, `semantic/rule/profiles.py`); these English lookups stay with the English models.
"""

from __future__ import annotations

import argparse
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from evaluation.pair_sets import ADVERSARIAL_FILE, REVIEWED_FILE, LabelledPair, file_part
from evaluation.probes import default_embedder
from semantic.embedding.embedder import Embedder
from semantic.language_routing import served_embedder
from semantic.rule.calibrated_rule import CalibratedRule
from semantic.rule.calibration import DEFAULT_TARGET_FALSE_HIT_RATE, Calibration
from semantic.rule.language_routed_rule import LanguageRoutedRule, multilingual_languages
from semantic.rule.loading import load_served_rule
from semantic.rule.profiles import ENGLISH
from semantic.rule.verdict import HitRule

DATA_DIR = Path(__file__).resolve().parents[3] / "shared" / "data"
REPO = Path(__file__).resolve().parents[2]


def rule_at(revision: str, workdir: Path) -> CalibratedRule:
    """The shipped rule as it was at `revision`: its calibration and its verifier weights."""
    weights = workdir / "verifier.safetensors"
    calibration = workdir / "calibration.json"
    for path, name in ((weights, "semantic/rule/verifier_weights/verifier.safetensors"),
                       (calibration, "semantic/rule/calibration.json")):  # fmt: skip
        path.write_bytes(subprocess.run(["git", "show", f"{revision}:{name}"], cwd=REPO, check=True,
                                        capture_output=True).stdout)  # fmt: skip
    return CalibratedRule(ENGLISH.verifier(weights), Calibration.load(calibration))


def english_calibration(rule: HitRule) -> Calibration:
    english = rule.english if isinstance(rule, LanguageRoutedRule) else rule
    if not isinstance(english, CalibratedRule):
        raise TypeError(f"{rule.name} has no English calibration")
    return english.calibration


def time_lookup(
    embedder: Embedder, rule: HitRule, pair: LabelledPair, stored: np.ndarray
) -> tuple[float, bool]:
    started = time.perf_counter()
    vector = embedder.embed([pair.b])[0]
    similarity = float(vector @ stored)
    verdict = rule.quick_verdict(pair.b, pair.a, similarity)
    verified = verdict is None
    if verified:
        rule.judge_many([(pair.b, pair.a)], [similarity])
    return time.perf_counter() - started, verified


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--baseline-rev", required=True, help="git revision whose shipped rule is the baseline"
    )
    parser.add_argument("--data-dir", type=Path, default=DATA_DIR)
    parser.add_argument("--lookups", type=int, default=300)
    args = parser.parse_args()

    embedder = default_embedder()
    with tempfile.TemporaryDirectory() as workdir:
        served = load_served_rule()
        rules: dict[str, HitRule] = {f"{args.baseline_rev} (baseline)": rule_at(args.baseline_rev, Path(workdir)),
                                     "working tree": served}  # fmt: skip
        embedders: dict[str, Embedder] = {
            f"{args.baseline_rev} (baseline)": embedder,
            "working tree": served_embedder(embedder, multilingual_languages(served)),
        }
        pairs = file_part(args.data_dir / REVIEWED_FILE, "test") + file_part(
            args.data_dir / ADVERSARIAL_FILE, "test"
        )
        stored = embedder.embed([pair.a for pair in pairs])
        looked_up = embedder.embed([pair.b for pair in pairs])
        cosines = (stored * looked_up).sum(axis=1)
        gate = min(english_calibration(rule).low_cosine for rule in rules.values())
        candidates = [index for index in range(len(pairs)) if cosines[index] >= gate]
        chosen = random.Random(3).sample(candidates, min(args.lookups, len(candidates)))
        timings: dict[str, list[float]] = {name: [] for name in rules}
        verified: dict[str, int] = {name: 0 for name in rules}
        for name, rule in rules.items():  # warm-up: first calls build sessions and caches
            for index in chosen[:10]:
                time_lookup(embedders[name], rule, pairs[index], stored[index])
        for index in chosen:
            for name, rule in rules.items():
                seconds, ran = time_lookup(embedders[name], rule, pairs[index], stored[index])
                timings[name].append(seconds * 1000)
                verified[name] += ran
    print(f"{len(chosen)} lookups with a candidate at cosine >= {gate} (test parts), target "
          f"{DEFAULT_TARGET_FALSE_HIT_RATE}, embedder {embedder.runtime.runtime}")  # fmt: skip
    p50 = {}
    for name, values in timings.items():
        p50[name] = float(np.percentile(values, 50))
        print(f"  {name:28s} p50 {p50[name]:6.2f} ms  p90 {np.percentile(values, 90):6.2f} ms  "
              f"verifier ran on {verified[name]}/{len(chosen)}")  # fmt: skip
    baseline, current = p50.values()
    print(f"  ratio working tree / baseline (p50): {current / baseline:.3f}")


if __name__ == "__main__":
    main()
