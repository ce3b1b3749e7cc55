"""Choosing the next token from logits: greedy, temperature, top-k, top-p, with per-request seeds.

Each request samples from its own row with its own `torch.Generator`, so a seeded request draws the same
tokens whether it runs alone or batched with others. When to stop is `engine.stopping`'s business.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch


@dataclass(frozen=True, slots=True)
class SamplingParams:
    """How one request picks tokens and when it stops. temperature 0 means greedy."""

    temperature: float = 1.0
    top_k: int | None = None  # keep only the k most likely tokens; None keeps all
    top_p: float = 1.0  # keep the smallest set of most likely tokens whose probability reaches top_p
    seed: int | None = None  # None: a fresh random seed per request
    max_tokens: int = 256
    stop_token_ids: tuple[int, ...] = ()  # in addition to the model's eos ids (unless ignore_eos)
    stop: tuple[str, ...] = ()  # stop strings; the text returned ends before the first one
    ignore_eos: bool = False
    grammar: str | None = (
        None  # a spec the output must follow, as JSON text (engine.grammar); None: free text
    )

    def __post_init__(self) -> None:
        if self.temperature < 0:
            raise ValueError("temperature must be >= 0")
        if self.top_k is not None and self.top_k <= 0:
            raise ValueError("top_k must be positive (None disables it)")
        if not 0 < self.top_p <= 1:
            raise ValueError("top_p must be in (0, 1]")
        if self.max_tokens <= 0:
            raise ValueError("max_tokens must be positive")
        if any(not text for text in self.stop):
            raise ValueError("stop strings must be non-empty")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0 or self.top_k == 1


class RequestSampler:
    """Draws one request's tokens; holds the request's random generator across steps."""

    def __init__(self, params: SamplingParams) -> None:
        self.params = params
        self.generator = torch.Generator()
        if params.seed is None:
            self.generator.seed()
        else:
            self.generator.manual_seed(params.seed)

    def sample(self, logits: torch.Tensor) -> int:
        """(vocab,) float32 logits -> the next token id."""
        if self.params.greedy:
            return int(logits.argmax())
        probs = token_probabilities(logits, self.params.temperature, self.params.top_k, self.params.top_p)
        return int(torch.multinomial(probs.cpu(), 1, generator=self.generator))


def sample_batch(logits: torch.Tensor, samplers: Sequence[RequestSampler]) -> list[int]:
    """(R, vocab) logits, one sampler per row -> R token ids. Greedy rows share one argmax."""
    if logits.shape[0] != len(samplers):
        raise ValueError(f"{logits.shape[0]} logits rows for {len(samplers)} samplers")
    argmax = logits.argmax(dim=-1).tolist()
    return [
        argmax[row] if sampler.params.greedy else sampler.sample(logits[row])
        for row, sampler in enumerate(samplers)
    ]


def token_probabilities(
    logits: torch.Tensor, temperature: float, top_k: int | None, top_p: float
) -> torch.Tensor:
    """(vocab,) logits -> (vocab,) probabilities after temperature, top-k and top-p (in that order)."""
    scaled = logits.float() / temperature
    if top_k is not None and top_k < scaled.shape[-1]:
        scaled = mask_top_k(scaled, top_k)
    if top_p < 1.0:
        scaled = mask_top_p(scaled, top_p)
    return torch.softmax(scaled, dim=-1)


def mask_top_k(logits: torch.Tensor, k: int) -> torch.Tensor:
    """Set all but the k largest logits to -inf (ties at the k-th value are kept)."""
    kth_largest = torch.topk(logits, k).values[..., -1:]
    return logits.masked_fill(logits < kth_largest, float("-inf"))


def mask_top_p(logits: torch.Tensor, p: float) -> torch.Tensor:
    """Keep the most likely tokens until their probability reaches p (the token crossing p is kept)."""
    sorted_logits, order = torch.sort(logits, descending=True)
    sorted_probs = torch.softmax(sorted_logits, dim=-1)
    # A token is dropped when the tokens before it already reach p; the most likely one is always kept.
    drop_sorted = (sorted_probs.cumsum(dim=-1) - sorted_probs) >= p
    drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
    return logits.masked_fill(drop, float("-inf"))
