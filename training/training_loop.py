"""One fine-tuning run of the verifier's network: batches, learning-rate schedule, optimiser, checkpoints.

Shared by `training/train_verifier.py` (this machine's CPU) and `training/train_on_device.py` (a lent GPU):
both hand it (a, b, target) examples and say when to checkpoint; it knows nothing of where the examples came
from. Needs torch and transformers only.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from transformers import PreTrainedTokenizerBase

from semantic.verifier.minilm import encode_pairs
from semantic.verifier.pair_classifier import PairClassifier


@dataclass(frozen=True, slots=True)
class Example:
    """One training pair: `target` is P(b may be answered with a's response), 0 or 1 or a soft label."""

    a: str
    b: str
    target: float
    # Examples sharing a `group` >= 0 are the candidates one query met (`query_groups`): the listwise term
    # ranks them against each other. -1: a lone pair.
    group: int = -1


@dataclass(frozen=True, slots=True)
class Schedule:
    """How long and how fast: linear warm-up over 5% of `steps`, then linear decay to 0.

    With `minutes` > 0 the decay follows whichever of steps or wall time runs out first (a slower machine
    trains fewer steps); 0 makes a run depend only on the seed.
    """

    steps: int
    batch_size: int = 32
    learning_rate: float = 5e-5
    minutes: float = 0.0
    max_tokens: int = 64
    skip_batches: int = 0
    checkpoint_every: int = 500
    # With a weight > 0, each batch also pays for every (paraphrase, non-paraphrase) pair of its examples
    # whose logits are less than `ranking_margin` apart: confident negatives are pushed below confident
    # positives instead of both saturating at the top (docs/benchmarks.md, the multilingual verifier).
    ranking_weight: float = 0.0
    ranking_margin: float = 1.0
    # The cross-entropy's targets are pulled `label_smoothing` away from 0 and 1 (0.05: 0.05 and 0.95), so the
    # loss stops rewarding logits beyond ~logit(0.95) = 2.9 and the top of the scale is left to the ranking.
    label_smoothing: float = 0.0
    # With a weight > 0, batches keep each query's candidates together (`grouped_batches`) and pay, per
    # query that met both a paraphrase and a non-paraphrase, the softmax cross-entropy of its paraphrases
    # among all its candidates: what the cache serves is a lookup's best candidate, so it is that ranking
    # which must put a paraphrase first.
    listwise_weight: float = 0.0


def fine_tune(
    model: PairClassifier,
    tokenizer: PreTrainedTokenizerBase | Any,
    examples: list[Example],
    schedule: Schedule,
    rng: random.Random,
    *,
    device: torch.device | None = None,
    on_checkpoint: Callable[[int], None] | None = None,
    log: Callable[[str], None] = print,
    encode: Callable[[Any, Sequence[tuple[str, str]], int], dict[str, torch.Tensor]] = encode_pairs,
) -> int:
    """Train the parameters of `model` that require grad; returns the steps taken.

    Each example is shown in a random order (a, b) or (b, a); binary cross-entropy on the target. On CUDA
    the forward pass runs in bf16 autocast (the weights and the optimiser stay fp32); on a CPU, only when
    `bf16_is_faster` times it faster on the first batch (AMX: 1.6x; AVX2-only parts emulate bf16 and are
    slower). `on_checkpoint(step)`
    is called every `schedule.checkpoint_every` steps before the last (the caller has the final weights).
    `encode` turns (a, b) pairs into the network's inputs (default: the MiniLM tokenizer's `[CLS] a [SEP] b`).
    """
    device = device or torch.device("cpu")
    trainable = [parameter for parameter in model.parameters() if parameter.requires_grad]
    optimizer = torch.optim.AdamW(trainable, lr=schedule.learning_rate, weight_decay=0.01)
    warmup = max(1, schedule.steps // 20)
    model.train()
    make_batches = grouped_batches if schedule.listwise_weight > 0 else length_grouped_batches
    batches = make_batches(examples, schedule.batch_size, schedule.skip_batches + schedule.steps, rng)[
        schedule.skip_batches :
    ]
    autocast = device.type == "cuda"
    if device.type == "cpu" and batches:
        first = [(ex.a, ex.b) for ex in batches[0]]
        autocast = bf16_is_faster(model, encode(tokenizer, first, schedule.max_tokens))
        log(
            f"CPU forward and backward in {'bf16 autocast' if autocast else 'fp32'} (timed on the first batch)"
        )
    started = time.perf_counter()
    running = 0.0
    taken = 0
    for step, chunk in enumerate(batches):
        progress = step / schedule.steps
        if schedule.minutes > 0:
            progress = max(progress, (time.perf_counter() - started) / (60 * schedule.minutes))
        if progress >= 1.0:
            log(f"time budget reached after {step} steps")
            break
        for group in optimizer.param_groups:
            group["lr"] = schedule.learning_rate * min((step + 1) / warmup, 1.0 - progress)
        texts = [(ex.a, ex.b) if rng.random() < 0.5 else (ex.b, ex.a) for ex in chunk]
        batch = {
            key: value.to(device) for key, value in encode(tokenizer, texts, schedule.max_tokens).items()
        }
        labels = torch.tensor([ex.target for ex in chunk], device=device)
        with torch.autocast(device_type=device.type, dtype=torch.bfloat16, enabled=autocast):
            logits = model(**batch)
        loss = pair_loss(logits.float(), labels, schedule)
        if schedule.listwise_weight > 0:
            groups = torch.tensor([ex.group for ex in chunk], device=device)
            loss = loss + schedule.listwise_weight * listwise_loss(logits.float(), labels, groups)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(trainable, 1.0)
        optimizer.step()
        taken = step + 1
        running = 0.98 * running + 0.02 * loss.item() if step else loss.item()
        if step % 50 == 0 or taken == schedule.steps:
            elapsed = time.perf_counter() - started
            log(
                f"step {taken}/{schedule.steps} loss {running:.4f} {elapsed / taken:.3f}s/step "
                f"eta {elapsed / taken * (schedule.steps - taken) / 60:.1f} min"
            )
        if on_checkpoint is not None and taken % schedule.checkpoint_every == 0 and taken < schedule.steps:
            on_checkpoint(taken)
            model.train()
    model.eval()
    return taken


def bf16_is_faster(model: PairClassifier, batch: dict[str, torch.Tensor], passes: int = 3) -> bool:
    """Time a forward and backward pass of `batch` on the CPU in fp32 and in bf16 autocast (best of
    `passes` each, after one warm-up); True when bf16 is at least 10% faster. Gradients are cleared after.

    Measured rather than assumed, as the engine's weights format is (`engine/weights/choice.py`): on a Xeon
    with AMX a MiniLM step took 0.25 s against 0.41 s; on AVX2-only parts bf16 matmuls are emulated.
    """

    def best(enabled: bool) -> float:
        timings = []
        for _ in range(passes + 1):
            started = time.perf_counter()
            with torch.autocast(device_type="cpu", dtype=torch.bfloat16, enabled=enabled):
                logits = model(**batch)
            logits.float().sum().backward()
            timings.append(time.perf_counter() - started)
        model.zero_grad(set_to_none=True)
        return min(timings[1:])

    return best(True) < 0.9 * best(False)


def pair_loss(logits: torch.Tensor, targets: torch.Tensor, schedule: Schedule) -> torch.Tensor:
    """Binary cross-entropy on the (smoothed) targets, plus the ranking term when the schedule has one."""
    smoothed = targets * (1.0 - 2.0 * schedule.label_smoothing) + schedule.label_smoothing
    loss = torch.nn.functional.binary_cross_entropy_with_logits(logits, smoothed)
    if schedule.ranking_weight > 0:
        loss = loss + schedule.ranking_weight * ranking_loss(logits, targets, schedule.ranking_margin)
    return loss


def ranking_loss(logits: torch.Tensor, targets: torch.Tensor, margin: float) -> torch.Tensor:
    """Mean hinge over every (positive, negative) pair of the batch: `margin` - (positive - negative) logit."""
    positives, negatives = logits[targets >= 0.5], logits[targets < 0.5]
    if positives.numel() == 0 or negatives.numel() == 0:
        return logits.sum() * 0.0
    return torch.relu(margin - (positives[:, None] - negatives[None, :])).mean()


def listwise_loss(logits: torch.Tensor, targets: torch.Tensor, groups: torch.Tensor) -> torch.Tensor:
    """Mean over the batch's query groups holding both labels of -log(P(a paraphrase | the group's softmax))."""
    losses = []
    for group in torch.unique(groups[groups >= 0]):
        members = groups == group
        scores, positive = logits[members], targets[members] >= 0.5
        if bool(positive.any()) and not bool(positive.all()):
            losses.append(torch.logsumexp(scores, 0) - torch.logsumexp(scores[positive], 0))
    if not losses:
        return logits.sum() * 0.0
    return torch.stack(losses).mean()


def query_groups(examples: Sequence[Example], first_id: int = 0) -> list[Example]:
    """The same examples, those whose `b` (the query) met two or more distinct candidates given one group id
    per query, from `first_id` on; duplicate (a, b) pairs of a query are kept once. Others stay lone (-1)."""
    candidates: dict[str, dict[str, Example]] = {}
    for example in examples:
        candidates.setdefault(example.b, {}).setdefault(example.a, example)
    grouped: list[Example] = []
    lone = [ex for ex in examples if len(candidates[ex.b]) < 2]
    for index, members in enumerate(group for group in candidates.values() if len(group) >= 2):
        grouped.extend(Example(ex.a, ex.b, ex.target, first_id + index) for ex in members.values())
    return grouped + lone


def grouped_batches(
    examples: list[Example], batch_size: int, steps: int, rng: random.Random
) -> list[list[Example]]:
    """`steps` batches of about `batch_size` examples in which each query group stays whole (a batch closes
    once it holds `batch_size` or more), in random order; depends only on the seed."""
    units: list[list[Example]] = [[ex] for ex in examples if ex.group < 0]
    by_group: dict[int, list[Example]] = {}
    for example in examples:
        if example.group >= 0:
            by_group.setdefault(example.group, []).append(example)
    units.extend(by_group.values())
    batches: list[list[Example]] = []
    current: list[Example] = []
    while len(batches) < steps:
        order = units[:]
        rng.shuffle(order)
        for unit in order:
            current.extend(unit)
            if len(current) >= batch_size:
                batches.append(current)
                current = []
                if len(batches) == steps:
                    break
    return batches


def length_grouped_batches(
    examples: list[Example], batch_size: int, steps: int, rng: random.Random
) -> list[list[Example]]:
    """`steps` batches of similar-length pairs (less padding: ~2x faster on CPU), in random order.

    The pairs are shuffled, cut into windows of 64 batches, sorted by length inside each window,
    and the resulting batches shuffled again; the sequence depends only on the seed.
    """
    needed = steps * batch_size
    stream: list[Example] = []
    while len(stream) < needed:
        epoch = examples[:]
        rng.shuffle(epoch)
        stream.extend(epoch)
    stream = stream[:needed]
    window = 64 * batch_size
    batches: list[list[Example]] = []
    for start in range(0, needed, window):
        group = sorted(stream[start : start + window], key=lambda ex: len(ex.a) + len(ex.b))
        batches.extend(group[offset : offset + batch_size] for offset in range(0, len(group), batch_size))
    rng.shuffle(batches)
    return batches
