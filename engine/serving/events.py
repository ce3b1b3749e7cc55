"""What an engine stream yields and how it fails: `TextDelta`s, then one `Finished`; `EngineStopped`, `EngineError`.

Torch-free, so that whoever only reads a stream (the gateway's backends, the engine process's workers) can
name its events without loading the model's code. `Finished` is also the gateway's: every backend, the engine
or an upstream, ends its stream with one (`gateway.backends.protocol`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # engine.logprobs imports torch; a TextDelta only carries its results
    from engine.logprobs import TokenLogprob


class EngineError(RuntimeError):
    """The step loop failed while this request was in it (the request is freed, the engine carries on)."""


class EngineStopped(RuntimeError):
    """The client was shut down (or never started)."""


@dataclass(frozen=True, slots=True)
class TextDelta:
    text: str
    """New text; may be "" while a character or a possible stop string is held back."""
    token_ids: tuple[int, ...]
    index: int = 0
    """The choice this text belongs to (0 .. n-1)."""
    logprobs: tuple[TokenLogprob, ...] = ()
    """The tokens this text is made of, with their logprobs (when the request asked for them)."""


@dataclass(frozen=True, slots=True)
class Finished:
    """How an answer ended and what it cost: the last event of every stream."""

    finish_reason: str
    """As its producer said it: the engine's "stop", "length" or "abort" (the first choice's, the only one's
    for n = 1); an upstream's "stop", "length", "tool_calls", "content_filter", ..."""
    prompt_tokens: int
    completion_tokens: int
    """Every choice's, added up."""
    cached_tokens: int = 0
    """Prompt tokens served from the prefix cache instead of being computed."""
    finish_reasons: tuple[str, ...] = ()
    """Every choice's, by index, when there are several (empty means `(finish_reason,)`)."""

    @property
    def choice_finish_reasons(self) -> tuple[str, ...]:
        return self.finish_reasons or (self.finish_reason,)


EngineEvent = TextDelta | Finished
