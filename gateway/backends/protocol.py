"""What answers a cache miss: the in-process engine or an upstream server, behind one protocol.

A backend turns a `GenerationRequest` into a stream of events that ends with one `Finished`: the engine
yields `TextDelta`s; an upstream yields what it sent, the `Chunk`s of a stream or one `Whole` object, so
that nothing of its answer is lost on the way to the client or the cache. The service never knows which
backend it is talking to. `Finished` is the engine's own (`engine.Finished`): one type for how an answer
ended and what it cost, whoever produced it.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any, Protocol

from engine import Finished as Finished  # re-exported: the routes and the service name it from here


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
    n: int = 1
    """Choices to generate (the engine prefills the prompt once and forks)."""
    logprobs: int | None = None
    """Alternatives per token to report with each token's logprob (0: the token's only); None: no logprobs."""
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logit_bias: dict[int, float] = field(default_factory=dict)
    """Token id -> bias added to its logit (checked by `traffic/limits.py`)."""
    body: dict[str, Any] = field(default_factory=dict)
    """The client's original JSON body, for a backend that passes requests through unchanged."""
    stream: bool = False
    """The client asked for a stream: an upstream is asked for one too, and otherwise for one JSON object."""
    path: str | None = None
    """The upstream path for another API than chat and legacy completions (`responses`, `messages`)."""
    headers: dict[str, str] = field(default_factory=dict)
    """Headers the upstream needs for this API (Anthropic's version and key)."""


@dataclass(frozen=True, slots=True)
class TextDelta:
    text: str


@dataclass(frozen=True, slots=True)
class Chunk:
    """One chunk of an upstream's stream, as it sent it."""

    payload: dict[str, Any]


@dataclass(frozen=True, slots=True)
class Whole:
    """An upstream's whole JSON answer, as it sent it."""

    payload: dict[str, Any]


@dataclass(frozen=True, slots=True)
class Routed:
    """Which backend of a pool answers: a fleet's first event (gateway/fleet/), kept by the flight for the
    response's `x-kvgate-backend` and passed to no client."""

    backend: str


GenerationEvent = TextDelta | Chunk | Whole | Finished | Routed


class Backend(Protocol):
    """The engine or upstream as the gateway sees it."""

    name: str
    passes_through: bool
    """Requests go on as the client sent them (an upstream decides what it serves); False: kvgate refuses
    up front what the backend cannot honour (`gateway/traffic/limits.py`)."""

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
