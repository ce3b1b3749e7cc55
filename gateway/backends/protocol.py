"""What answers a cache miss: the in-process engine or an upstream server, behind one protocol.

A backend turns a `GenerationRequest` into a stream of `TextDelta`s that ends with one `Finished`.
The service never knows which backend it is talking to.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

FinishReason = Literal["stop", "length"]


@dataclass(frozen=True, slots=True)
class GenerationRequest:
    """One completion to compute. `messages` for chat, `prompt` for legacy completions."""

    request_id: str
    tenant: str
    model: str
    messages: list[dict[str, str]] | None
    prompt: str | None
    max_tokens: int | None
    temperature: float
    top_p: float
    seed: int | None
    stop: list[str]
    priority: int = 0
    body: dict[str, Any] = field(default_factory=dict)
    """The client's original JSON body, for a backend that passes requests through unchanged."""


@dataclass(frozen=True, slots=True)
class TextDelta:
    text: str


@dataclass(frozen=True, slots=True)
class Finished:
    finish_reason: FinishReason
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int = 0


GenerationEvent = TextDelta | Finished


class Backend(Protocol):
    """The engine or upstream as the gateway sees it."""

    name: str

    @property
    def models_mode(self) -> str:
        """How `served_models` is known: `engine`, or reverse-proxy mode's `allow-list`, `discovered`,
        `pass-through` (shown in `/healthz`)."""
        ...

    def generate(self, request: GenerationRequest) -> AsyncIterator[GenerationEvent]:
        """Yield text as it is produced, then exactly one `Finished`. Raises `KvgateError` subclasses."""
        ...

    async def abort(self, request_id: str) -> None:
        """Stop a running request and free what it holds; a no-op for one that already ended."""
        ...

    def served_models(self) -> list[str]:
        """Model names this backend lists (`GET /v1/models`)."""
        ...

    def serves_model(self, model: str) -> bool:
        """May a request for `model` go to this backend? (A pass-through upstream takes any name.)"""
        ...

    def max_context_tokens(self) -> int | None:
        """Prompt + completion token limit, when the backend knows it."""
        ...
