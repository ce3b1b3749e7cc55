"""How the step loop is sized (`EngineConfig`), and the one refusal it raises before scheduling anything.

Knows numbers only: the loop (`engine/engine.py`) reads them; the scheduler's own settings are
`SchedulerConfig`, carried here.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from engine.model.native_decode import DecodeKernel
from engine.scheduler import SchedulerConfig

BURST_TOKENS = 8
"""Most tokens a lone greedy sequence decodes in one native call (`engine.burst`): the Python of a
step and the hand-off of its text to the event loop's thread are paid once per 8 tokens (one stream through
`AsyncEngineClient` on 2 AVX2 cores: 136 tok/s against 117 with single steps), and a request that arrives
meanwhile waits at most 8 steps longer to start."""


class ContextLengthExceeded(ValueError):
    """The prompt leaves no room for a single output token in the model's context (or the KV pool)."""

    def __init__(self, num_prompt_tokens: int, max_model_len: int) -> None:
        super().__init__(
            f"This model's maximum context length is {max_model_len} tokens; "
            f"the prompt has {num_prompt_tokens} tokens, leaving no room for a completion."
        )
        self.num_prompt_tokens = num_prompt_tokens
        self.max_model_len = max_model_len


@dataclass(frozen=True, slots=True)
class EngineConfig:
    num_blocks: int = 1024
    """KV blocks in the pool: with `block_size`, the tokens all running requests can hold together."""
    block_size: int = 16
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    max_model_len: int | None = None
    """Prompt + output tokens per request; None: the model's context (both capped by the pool)."""
    decode_kernel: DecodeKernel = "auto"
    """Decode steps of an int4 model: `auto` runs them as one native call where it builds, else torch's ops;
    `native` requires it; `torch` never uses it (engine.model.native_decode)."""
    burst_tokens: int = BURST_TOKENS
    """Most tokens a lone greedy sequence decodes in one native call (`engine.burst`); 1: never."""
