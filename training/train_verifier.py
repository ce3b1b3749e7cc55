"""Fine-tune the semantic cache's verifier (a MiniLM cross-encoder) on CPU and write its shipped weights.

    .venv/bin/python training/train_verifier.py --probe         # time a few batches, write nothing
    .venv/bin/python training/train_verifier.py --steps 4200 --minutes 70 --out /tmp/v/stage1.safetensors
    .venv/bin/python training/train_verifier.py --resume /tmp/v/stage1.safetensors --stage rubric \
        --steps 2000 --minutes 45 --learning-rate 2e-5 --threads 1 --out /tmp/v/stage2.safetensors
    .venv/bin/python training/train_verifier.py --resume /tmp/v/stage2.safetensors --stage rewordings \
        --steps 1500 --minutes 40 --learning-rate 2e-5 --threads 1 --out /tmp/v/stage3.safetensors
    .venv/bin/python training/train_verifier.py --minutes 0 --steps 4200    # exactly reproducible, steps only

The shipped weights come from two runs (docs/benchmarks.md has their loss and time): the first from the
packaged all-MiniLM-L6-v2 on every source (`training_pairs`), the second from the first's weights on rubric
labels only (`rubric_pairs`); its step-1000 checkpoint (`stage2.step1000.safetensors`), the one that scored
best on the calibration parts, ships. With --minutes the learning-rate schedule decays by whichever of steps or time runs out first,
so a slower machine trains fewer steps; --minutes 0 makes the run depend only on the seed. A checkpoint is
written every 500 steps beside --out (`NAME.stepN.safetensors`).

Data (read from ../shared/data/, never shipped), the labels aligned with the cache's rubric
(`training_pairs`): the train parts of the reviewed Quora sample and of the adversarial pairs
(`semantic/pair_sets.py`), raw Quora pairs taught as soft targets (`soft_targets`: P(rubric label |
Quora label, how the texts' words differ), counted on the reviewed train part), the pairs Quora's labels
imply, MRPC's train part, and minimal pairs made from Quora train texts and task requests
(`training/minimal_pairs.py`). No text of a calibration or test part is seen here. Each pair is shown in a
random order (a, b) or (b, a). The word embeddings stay frozen, so only the rest ships (fp16, 21 MB).
"""

from __future__ import annotations

import argparse
import json
import random
import re
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from evaluation.pair_sets import (
    ADVERSARIAL_FILE,
    CHATBOT_FILE,
    MRPC_FILE,
    QQP_FILE,
    REVIEWED_FILE,
    LabelledPair,
    file_part,
    held_out_texts,
    load_pairs,
    text_groups,
)
from semantic.embedding.embedder_source import packaged_model_dir
from semantic.rule.profiles import VERIFIER_WEIGHTS as WEIGHTS_FILE
from semantic.verifier.minilm import (
    load_base_classifier,
    load_tokenizer,
    load_trained_weights,
    save_trained_weights,
)
from semantic.verifier.pair_classifier import FROZEN_PREFIX
from training.minimal_pairs import minimal_pairs, task_pairs
from training.training_loop import Example, Schedule, fine_tune

DATA_DIR = Path(__file__).resolve().parents[2] / "shared" / "data"
SEED = 20240610
# English pairs written for training only (2026-12-05): see `written_stage_pairs`.
WRITTEN_FILE = Path(__file__).resolve().parent / "data" / "english_written.jsonl"


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--data-dir", type=Path, default=DATA_DIR)
    parser.add_argument("--out", type=Path, default=WEIGHTS_FILE)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--steps", type=int, default=900, help="optimiser steps (batch-size pairs each)")
    parser.add_argument(
        "--minutes",
        type=float,
        default=22.0,
        help="wall-time budget: the schedule decays by whichever of steps or time runs out first "
        "(0: steps only, exactly reproducible)",
    )
    parser.add_argument("--learning-rate", type=float, default=5e-5)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--probe", action="store_true", help="time 5 batches and exit")
    parser.add_argument("--resume", type=Path, help="start from these weights instead of the base model")
    parser.add_argument(
        "--skip-batches",
        type=int,
        default=0,
        help="continue the seeded batch stream after this many batches (with --resume)",
    )
    parser.add_argument(
        "--no-implied", action="store_true", help="train on the labelled pairs only (see implied_pairs)"
    )
    parser.add_argument(
        "--unfreeze-embeddings",
        action="store_true",
        help="train the word embeddings too (they then ship in the weights file: ~44 MB fp16 instead of 21)",
    )
    parser.add_argument(
        "--reviewed-repeats",
        type=int,
        default=2,
        help="times the reviewed Quora train part is shown in the rewordings and written stages",
    )
    parser.add_argument(
        "--stage",
        choices=("paraphrase", "rubric", "rewordings", "written"),
        default="paraphrase",
        help="paraphrase: every source, raw Quora for volume (the first stage, from the base model); "
        "rubric: only pairs labelled on the rubric, reviewed pairs weighted up (the second stage, --resume); "
        "rewordings: the chatbot rewordings and hard negatives with the rubric's pairs (the third stage, --resume); "
        "written: the third stage's pairs and the English pairs written for training (`WRITTEN_FILE`, --resume)",
    )
    args = parser.parse_args()

    random.seed(SEED)
    np.random.seed(SEED)
    torch.manual_seed(SEED)
    torch.set_num_threads(args.threads)

    if args.stage == "rubric":
        examples = rubric_pairs(args.data_dir)
    elif args.stage == "rewordings":
        examples = rewording_pairs(args.data_dir, reviewed_repeats=args.reviewed_repeats)
    elif args.stage == "written":
        examples = written_stage_pairs(args.data_dir, reviewed_repeats=args.reviewed_repeats)
    else:
        examples = training_pairs(args.data_dir, transitive=not args.no_implied)
    soft = soft_targets(args.data_dir)
    print(f"raw Quora labels taught as P(rubric 1): {soft}", flush=True)
    print(f"{len(examples)} training pairs; {args.steps} steps of {args.batch_size}", flush=True)
    base = packaged_model_dir()
    tokenizer = load_tokenizer(base)
    model = load_base_classifier(base)
    if args.resume is not None:
        load_trained_weights(model, args.resume)
    for name, parameter in model.named_parameters():
        parameter.requires_grad = args.unfreeze_embeddings or not name.startswith(FROZEN_PREFIX)
    schedule = Schedule(
        steps=5 if args.probe else args.steps,
        batch_size=args.batch_size,
        learning_rate=args.learning_rate,
        minutes=0.0 if args.probe else args.minutes,
        max_tokens=args.max_tokens,
        skip_batches=args.skip_batches,
    )

    def checkpoint(step: int) -> None:
        if not args.probe:
            path = args.out.with_suffix(f".step{step}.safetensors")
            save_trained_weights(model, path, args.unfreeze_embeddings)

    started = time.perf_counter()
    fine_tune(
        model,
        tokenizer,
        [Example(pair.a, pair.b, training_target(pair, soft)) for pair in examples],
        schedule,
        random.Random(SEED),
        on_checkpoint=checkpoint,
        log=lambda line: print(line, flush=True),
    )
    if args.probe:
        return
    save_trained_weights(model, args.out, args.unfreeze_embeddings)
    minutes = (time.perf_counter() - started) / 60
    print(f"wrote {args.out} ({args.out.stat().st_size / 2**20:.1f} MiB) after {minutes:.1f} min", flush=True)


def training_target(pair: LabelledPair, soft: dict[tuple[int, str], float]) -> float:
    """What a pair teaches: its label, or for a raw Quora pair P(rubric label | Quora label, overlap)."""
    if pair.kind == RAW_QUORA:
        return soft.get((pair.label, overlap_bucket(pair.a, pair.b)), float(pair.label))
    return float(pair.label)


RAW_QUORA = "quora-raw"
# Candidates of each chatbot lookup the third stage learns from (the cache judges 3: `CacheConfig.judged`).
LOOKUP_CANDIDATES = 3


def training_pairs(data_dir: Path, transitive: bool = True, seed: int = SEED) -> list[LabelledPair]:
    """Everything the verifier learns from; no text of a calibration or test part (`held_out_texts`).

    - reviewed Quora train part (rubric labels, shown twice) and adversarial train part (shown three times);
    - raw Quora pairs not in the reviewed sample, kind `quora-raw` (soft targets, `soft_targets`), and with
      `transitive` the pairs their labels imply; any Quora group touching a held-out text is left out;
    - MRPC's train part;
    - minimal pairs made from Quora train texts and task requests (`training/minimal_pairs.py`).
    """
    rng = random.Random(seed)
    quora, group_of, tainted = quora_groups(data_dir)
    reviewed = {frozenset((pair.a, pair.b)) for pair in load_pairs(data_dir / REVIEWED_FILE)}
    raw = [
        LabelledPair(pair.a, pair.b, pair.label, RAW_QUORA)
        for pair in quora
        if group_of[pair.a] not in tainted and frozenset((pair.a, pair.b)) not in reviewed
    ]
    implied = [LabelledPair(p.a, p.b, p.label, RAW_QUORA) for p in implied_pairs(raw)] if transitive else []
    reviewed_train = file_part(data_dir / REVIEWED_FILE, "train")
    adversarial_train = file_part(data_dir / ADVERSARIAL_FILE, "train")
    mrpc = file_part(data_dir / MRPC_FILE, "train")
    texts = sorted({text for pair in raw for text in (pair.a, pair.b)})
    made = minimal_pairs(rng.sample(texts, min(len(texts), 16000)), rng) + task_pairs(rng, 3000)
    return raw + implied + 2 * reviewed_train + 3 * adversarial_train + mrpc + made


def rubric_pairs(data_dir: Path, seed: int = SEED) -> list[LabelledPair]:
    """The second stage's pairs: only labels given on the cache's rubric, none from raw Quora.

    The first stage (`training_pairs`) learns paraphrase from Quora's volume, whose labels are looser than
    the rubric; this stage aligns the scores with the rubric at a lower learning rate: the reviewed train
    part four times, the adversarial train part three times, and fresh minimal pairs and task requests (a
    different draw than the first stage's, from the same train texts).
    """
    rng = random.Random(seed + 1)
    quora, group_of, tainted = quora_groups(data_dir)
    texts = sorted({text for pair in quora if group_of[pair.a] not in tainted for text in (pair.a, pair.b)})
    reviewed_train = file_part(data_dir / REVIEWED_FILE, "train")
    adversarial_train = file_part(data_dir / ADVERSARIAL_FILE, "train")
    made = minimal_pairs(rng.sample(texts, min(len(texts), 8000)), rng) + task_pairs(rng, 2000)
    return 4 * reviewed_train + 3 * adversarial_train + made


def rewording_pairs(
    data_dir: Path,
    seed: int = SEED,
    lookup_candidates_k: int = LOOKUP_CANDIDATES,
    reviewed_repeats: int = 2,
) -> list[LabelledPair]:
    """The third stage's pairs: real rewordings and their hard negatives, beside what the second stage learnt.

    The chatbot set's train part (hand-written rewordings of a product assistant's questions: rephrase,
    synonym, voice, keyword queries, context, abbreviation, typo, filler, formality; against related
    questions and minimal edits) is shown four times; the candidates its wordings meet as lookups in one
    scope holding the part (`lookup_candidates`: mostly the nearest stored prompt of another question)
    twice; the reviewed Quora and adversarial train parts twice each, and a fresh draw of minimal pairs and
    task requests, so that what the second stage refuses (minimal edits, Quora's near-misses) stays
    refused while the rewordings are learnt.
    """
    rng = random.Random(seed + 2)
    quora, group_of, tainted = quora_groups(data_dir)
    texts = sorted({text for pair in quora if group_of[pair.a] not in tainted for text in (pair.a, pair.b)})
    chatbot_train = file_part(data_dir / CHATBOT_FILE, "train")
    reviewed_train = file_part(data_dir / REVIEWED_FILE, "train")
    adversarial_train = file_part(data_dir / ADVERSARIAL_FILE, "train")
    made = minimal_pairs(rng.sample(texts, min(len(texts), 4000)), rng) + task_pairs(rng, 1000)
    # Lookups in the chatbot set's scope only: the reviewed Quora sample holds many unlabelled duplicates of
    # one question (its nearest stored prompt is often a paraphrase no pair names), so its lookups would
    # teach true paraphrases as negatives.
    looked_up = lookup_candidates(chatbot_train, lookup_candidates_k)
    return (
        4 * chatbot_train + reviewed_repeats * reviewed_train + 2 * adversarial_train + 2 * looked_up + made
    )


def written_stage_pairs(
    data_dir: Path, path: Path = WRITTEN_FILE, seed: int = SEED, reviewed_repeats: int = 2
) -> list[LabelledPair]:
    """The `written` stage's pairs: the third stage's, and the English pairs written for training only.

    `WRITTEN_FILE` holds rewordings and hard negatives in subjects the development sets do not have (no text
    of a calibration or test part: `tests/training/test_written_pairs.py`), in the chatbot families and in
    Quora's style, where the third stage had only the chatbot set's ~1,700 train pairs. They are shown four
    times, and the candidates their wordings meet as lookups in one scope holding them twice.
    """
    written = load_pairs(path)
    return (
        rewording_pairs(data_dir, seed, reviewed_repeats=reviewed_repeats)
        + 4 * written
        + 2 * lookup_candidates(written, LOOKUP_CANDIDATES)
    )


def lookup_candidates(pairs: list[LabelledPair], k: int) -> list[LabelledPair]:
    """What a lookup meets (`semantic/scope_lookups.py`): every `a` of a train part stored in one scope, each
    new `b` against its k nearest, labelled by the part's paraphrase groups. Mostly hard negatives: the
    nearest stored prompt of another question, often ranked above the stored wording of the same one."""
    from evaluation.scope_lookups import populated_scope, scope_lookups
    from semantic.embedding.embedder import SentenceEmbedder
    from semantic.embedding.embedder_source import DEFAULT_EMBEDDER_NAME, resolve_embedder

    embedder = SentenceEmbedder(resolve_embedder(DEFAULT_EMBEDDER_NAME))
    scope = populated_scope(pairs)
    lookups = scope_lookups(
        scope,
        embedder.embed(list(scope.stored)),
        embedder.embed([pair.b for pair in scope.queries]),
        k,
    )
    return [
        LabelledPair(candidate, lookup.query, int(paraphrase), "lookup")
        for lookup in lookups
        for candidate, paraphrase in zip(lookup.candidates, lookup.paraphrase, strict=True)
    ]


def quora_groups(data_dir: Path) -> tuple[list[LabelledPair], dict[str, str], set[str]]:
    """Raw Quora pairs, each text's group, and the groups that touch a calibration or test text (never
    trained on)."""
    quora = load_pairs(data_dir / QQP_FILE)
    group_of = text_groups(quora)
    tainted = {group_of[text] for text in held_out_texts(data_dir) if text in group_of}
    return quora, group_of, tainted


def soft_targets(data_dir: Path) -> dict[tuple[int, str], float]:
    """(Quora label, `overlap_bucket`) -> P(rubric label 1), counted on the reviewed sample's train part.

    A raw Quora label is taught as that probability, not as a certainty: on the reviewed train part a Quora
    "duplicate" whose texts share every content word is a rubric duplicate 94% of the time, one whose texts
    differ by six or more content words 50% of the time (B often asks for more).
    """
    train = {frozenset((pair.a, pair.b)) for pair in file_part(data_dir / REVIEWED_FILE, "train")}
    counts: dict[tuple[int, str], list[int]] = {}
    with (data_dir / REVIEWED_FILE).open(encoding="utf-8") as lines:
        for line in lines:
            row = json.loads(line)
            if frozenset((row["a"], row["b"])) in train:
                key = (int(row["quora_label"]), overlap_bucket(row["a"], row["b"]))
                counts.setdefault(key, [0, 0])[int(row["label"])] += 1
    # One pseudo-count each way keeps a small bucket from teaching 0 or 1 outright.
    return {key: (ones + 1) / (zeros + ones + 2) for key, (zeros, ones) in counts.items()}


_STOP_WORDS = frozenset(
    ["a", "an", "the", "of", "to", "in", "on", "for", "is", "are", "was", "were", "do", "does", "did", "how",
     "what", "why", "which", "who", "when", "where", "i", "my", "me", "you", "your", "it", "this", "that",
     "be", "can", "should", "will", "would", "and", "or", "with", "from", "by", "at", "as"]
)  # fmt: skip


def overlap_bucket(first: str, second: str) -> str:
    """How the two texts' content words differ: none, one contains the other (+1-2 or +3 words), or neither
    (1-2, 3-5 or 6+ words in one text only)."""
    one, other = (
        {word for word in re.findall(r"[a-z0-9]+", text.lower()) if word not in _STOP_WORDS}
        for text in (first, second)
    )
    differing = len(one ^ other)
    if differing == 0:
        return "same"
    if one <= other or other <= one:
        return "contains+1-2" if differing <= 2 else "contains+3"
    return "neither1-2" if differing <= 2 else "neither3-5" if differing <= 5 else "neither6+"


def implied_pairs(pairs: list[LabelledPair], max_group: int = 6) -> list[LabelledPair]:
    """Pairs the labels imply but the file does not hold: inside a small group of texts joined by
    duplicate labels every two texts are duplicates, and a text that is not a duplicate of one member is
    a duplicate of none. Groups over `max_group` texts are skipped: a chain of noisy labels drifts.
    """
    groups: dict[str, list[str]] = {}
    group_of = text_groups(pair for pair in pairs if pair.label == 1)
    for text, group in group_of.items():
        groups.setdefault(group, []).append(text)
    small = {key: sorted(members) for key, members in groups.items() if len(members) <= max_group}
    seen = {frozenset((pair.a, pair.b)) for pair in pairs}
    implied: list[LabelledPair] = []

    def add(a: str, b: str, label: int) -> None:
        key = frozenset((a, b))
        if a != b and key not in seen:
            seen.add(key)
            implied.append(LabelledPair(a, b, label))

    for members in sorted(small.values()):
        for index, first in enumerate(members):
            for second in members[index + 1 :]:
                add(first, second, 1)
    for pair in pairs:
        if pair.label == 0:
            for text, other in ((pair.a, pair.b), (pair.b, pair.a)):
                for member in small.get(group_of[text], []) if text in group_of else []:
                    add(member, other, 0)
    return implied


if __name__ == "__main__":
    main()
