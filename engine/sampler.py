"""Choosing the next token from logits: penalties and bias, then greedy, temperature, top-k, top-p, with
per-request seeds.

Each request samples from its own row with its own `torch.Generator`, so a seeded request draws the same
tokens whether it runs alone or batched with others. The choices of an `n > 1` request are forked from one
parent: choice `i` of a seeded request draws from `seed + i` (distinct streams, each reproducible); without a
seed each choice seeds itself afresh. Frequency / presence penalties and logit bias (`engine.penalties`) are
applied to a copy of the rows that ask for them, so rows without them are untouched and cost nothing more;
log-probabilities (`engine.logprobs`) are read from the raw logits, before any of this. When to stop is
`engine.stopping`'s business.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from engine.penalties import TokenCounts, apply_penalties

MAX_N = 16
"""Choices per request at most (each holds its own KV blocks once it diverges)."""
MAX_LOGPROBS = 20
"""Alternatives per token at most (OpenAI's bound for `top_logprobs`)."""
MAX_LOGIT_BIAS = 100.0


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
    n: int = 1  # choices, forked from one prefill of the prompt
    logprobs: int | None = None  # alternatives reported per token (0: the chosen token only); None: none
    presence_penalty: float = 0.0  # subtracted once from every token already generated
    frequency_penalty: float = 0.0  # subtracted per occurrence of a token already generated
    logit_bias: tuple[tuple[int, float], ...] = ()  # (token id, bias) added to the logits
    grammar: str | None = None  # a spec the output must follow, as JSON text (engine.grammar); None: free

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
        if not 1 <= self.n <= MAX_N:
            raise ValueError(f"n must be in [1, {MAX_N}]")
        if self.logprobs is not None and not 0 <= self.logprobs <= MAX_LOGPROBS:
            raise ValueError(f"logprobs must be in [0, {MAX_LOGPROBS}]")
        for penalty in (self.presence_penalty, self.frequency_penalty):
            if not -2.0 <= penalty <= 2.0:
                raise ValueError("presence_penalty and frequency_penalty must be in [-2, 2]")
        for token_id, bias in self.logit_bias:
            if token_id < 0 or not -MAX_LOGIT_BIAS <= bias <= MAX_LOGIT_BIAS:
                raise ValueError(f"logit_bias needs token ids >= 0 and biases in [-100, 100], got {token_id}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0 or self.top_k == 1

    @property
    def adjusts_logits(self) -> bool:
        """Whether penalties or a bias change this request's logits before it samples."""
        return bool(self.presence_penalty or self.frequency_penalty or self.logit_bias)


class RequestSampler:
    """Draws one choice's tokens; holds its random generator and the counts its penalties need."""

    def __init__(self, params: SamplingParams, choice_index: int = 0) -> None:
        self.params = params
        self.generator = torch.Generator()
        if params.seed is None:
            self.generator.seed()
        else:
            self.generator.manual_seed(params.seed + choice_index)
        self.counts = TokenCounts()

    def sample(self, logits: torch.Tensor) -> int:
        """(vocab,) float32 logits -> the next token id (penalties and bias applied to a copy first)."""
        if self.params.adjusts_logits:
            logits = apply_penalties(logits.clone(), self.params, self.counts)
        if self.params.greedy:
            return int(logits.argmax())
        probs = token_probabilities(logits, self.params.temperature, self.params.top_k, self.params.top_p)
        return int(torch.multinomial(probs.cpu(), 1, generator=self.generator))

    def record(self, token_id: int) -> None:
        """A token this choice generated (what the penalties count)."""
        if self.params.presence_penalty or self.params.frequency_penalty:
            self.counts.add(token_id)


def sample_batch(logits: torch.Tensor, samplers: Sequence[RequestSampler]) -> list[int]:
    """(R, vocab) logits, one sampler per row -> R token ids. Greedy rows without penalties or bias share
    one argmax; `logits` is never modified."""
    if logits.shape[0] != len(samplers):
        raise ValueError(f"{logits.shape[0]} logits rows for {len(samplers)} samplers")
    argmax = logits.argmax(dim=-1).tolist()
    return [
        argmax[row]
        if sampler.params.greedy and not sampler.params.adjusts_logits
        else sampler.sample(logits[row])
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
