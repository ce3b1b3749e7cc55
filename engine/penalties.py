"""OpenAI's frequency and presence penalties and `logit_bias`, applied to one request's row of logits.

    logits[t] -= count[t] * frequency_penalty + (count[t] > 0) * presence_penalty   (generated tokens only)
    logits[t] += logit_bias[t]

`count` covers the tokens this choice has generated, not the prompt (OpenAI's definition). The sampler
applies these to a copy of the row, only for requests that set them; log-probabilities are read before.
"""

from __future__ import annotations

from typing import Protocol

import torch


class PenaltyParams(Protocol):
    """What the penalties read of a request's sampling parameters (`engine.sampler.SamplingParams`): named
    here, not imported, so that the sampler may import this module and not the other way round."""

    @property
    def presence_penalty(self) -> float: ...

    @property
    def frequency_penalty(self) -> float: ...

    @property
    def logit_bias(self) -> tuple[tuple[int, float], ...]: ...


class TokenCounts:
    """How often each token id was generated, kept as a dict (a choice generates few distinct tokens)."""

    __slots__ = ("_counts",)

    def __init__(self) -> None:
        self._counts: dict[int, int] = {}

    def add(self, token_id: int) -> None:
        self._counts[token_id] = self._counts.get(token_id, 0) + 1

    def __len__(self) -> int:
        return len(self._counts)

    def tensors(self, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """(token ids, counts) as int64 and float32 tensors."""
        ids = torch.tensor(list(self._counts), dtype=torch.int64, device=device)
        counts = torch.tensor(list(self._counts.values()), dtype=torch.float32, device=device)
        return ids, counts


def apply_penalties(logits: torch.Tensor, params: PenaltyParams, counts: TokenCounts) -> torch.Tensor:
    """(vocab,) logits, changed in place and returned: penalties over `counts`, then the bias."""
    if counts and (params.frequency_penalty or params.presence_penalty):
        ids, occurrences = counts.tensors(logits.device)
        penalty = occurrences * params.frequency_penalty + params.presence_penalty
        logits.index_add_(0, ids, -penalty.to(logits.dtype))
    if params.logit_bias:
        vocab_size = logits.shape[-1]
        known = [(token_id, bias) for token_id, bias in params.logit_bias if token_id < vocab_size]
        if known:
            ids = torch.tensor([token_id for token_id, _ in known], dtype=torch.int64, device=logits.device)
            biases = torch.tensor([bias for _, bias in known], dtype=logits.dtype, device=logits.device)
            logits.index_add_(0, ids, biases)
    return logits
