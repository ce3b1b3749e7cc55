"""One request's state as the engine sees it: token ids, progress through them, and how it ends.

There is no prefill phase and no decode phase. A sequence has `num_tokens` tokens (prompt + output) and
`num_computed_tokens` of them have K/V in the cache; every step computes some of the gap, and when the gap
is closed the last token's logits give the next output token, which opens a gap of one again. A preempted
sequence simply drops back to `num_computed_tokens = 0` and catches up the same way (mostly from cache).

This module knows nothing of blocks, tensors or text streams; the scheduler and the engine move a sequence
between states and fill in its fields.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from enum import Enum
from typing import Literal

from engine.sampler import SamplingParams


class SequenceStatus(Enum):
    WAITING = "waiting"  # not holding blocks: new, or preempted (it recomputes what the cache lost)
    RUNNING = "running"  # holds blocks for all its tokens and is scheduled every step it fits
    FINISHED = "finished"  # blocks released; `finish_reason` says why


FinishReason = Literal["stop", "length", "abort"]
"""Why a sequence ended, in OpenAI's words plus vLLM's "abort": "stop" is a stop token or string; "length"
is max_tokens, or the model's context / KV pool leaving no room for another token; "abort" is a cancel."""


@dataclass(eq=False, slots=True)
class Sequence:
    """A request's token-level state. Identity is the object (and `request_id`, unique per engine)."""

    request_id: str
    prompt_token_ids: list[int]
    sampling: SamplingParams
    cache_salt: str | None = None
    """Tenant namespace: only requests with the same salt share cached prefix blocks."""
    priority: int = 0
    """Higher is served first among waiting requests, and preempted last among running ones."""
    max_total_tokens: int | None = None
    """Prompt + output cap from the model's context and the KV pool; reaching it ends with LENGTH."""
    arrival_time: float = field(default_factory=time.monotonic)
    arrival_index: int = 0
    """Order of arrival at the scheduler: the tie-breaker everywhere (older first)."""
    output_token_ids: list[int] = field(default_factory=list)
    num_computed_tokens: int = 0
    """Leading tokens whose K/V are in the cache."""
    num_cached_prompt_tokens: int | None = None
    """Prompt tokens served from the prefix cache at first admission (None until admitted)."""
    status: SequenceStatus = SequenceStatus.WAITING
    finish_reason: FinishReason | None = None
    num_preemptions: int = 0
    num_times_passed_over: int = 0
    """Admission rounds in which a later request went ahead of this one (for aging)."""
    first_token_time: float | None = None
    last_token_time: float | None = None

    def __post_init__(self) -> None:
        if not self.prompt_token_ids:
            raise ValueError("a request needs at least one prompt token")

    # Sizes --------------------------------------------------------------------------------------

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.output_token_ids)

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_token_ids) + len(self.output_token_ids)

    @property
    def num_uncomputed_tokens(self) -> int:
        """Tokens still to compute before the next token can be sampled (1 while decoding)."""
        return self.num_tokens - self.num_computed_tokens

    @property
    def is_prefilling(self) -> bool:
        """More than one token to compute: a new prompt, a chunked prompt, or a recompute after preemption."""
        return self.num_uncomputed_tokens > 1

    def token_ids(self, start: int = 0, end: int | None = None) -> list[int]:
        """Prompt and output tokens in [start, end), without building the whole list when not needed."""
        end = self.num_tokens if end is None else end
        num_prompt = len(self.prompt_token_ids)
        if end <= num_prompt:
            return self.prompt_token_ids[start:end]
        if start >= num_prompt:
            return self.output_token_ids[start - num_prompt : end - num_prompt]
        return self.prompt_token_ids[start:] + self.output_token_ids[: end - num_prompt]

    # State changes ------------------------------------------------------------------------------

    def append_output_token(self, token_id: int, now: float) -> None:
        """Record a sampled token; its K/V is computed in a later step."""
        self.output_token_ids.append(token_id)
        if self.first_token_time is None:
            self.first_token_time = now
        self.last_token_time = now

    def reached_length_limit(self) -> bool:
        """Whether max_tokens or the total-token cap leaves no room for another token."""
        if self.num_output_tokens >= self.sampling.max_tokens:
            return True
        return self.max_total_tokens is not None and self.num_tokens >= self.max_total_tokens

    @property
    def is_finished(self) -> bool:
        return self.status is SequenceStatus.FINISHED
