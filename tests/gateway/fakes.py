"""A small scripted backend for the gateway's own tests (the real engine is tested in tests/integration)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from gateway.api.errors import InvalidRequest
from gateway.backends.protocol import Finished, GenerationEvent, GenerationRequest, TextDelta

MODEL = "fake-model"


@dataclass
class ScriptedBackend:
    """Answers 'echo: <last turn>' word by word; counts calls and aborts; can be slowed down."""

    delay_s: float = 0.0
    finish_reason: str = "stop"
    context_tokens: int = 512
    name: str = "scripted"
    keep_calls: bool = True
    models_mode: str = "engine"
    passes_through: bool = False
    calls: list[GenerationRequest] = field(default_factory=list)
    aborted: list[str] = field(default_factory=list)
    active: set[str] = field(default_factory=set)

    async def generate(self, request: GenerationRequest) -> AsyncIterator[GenerationEvent]:
        prompt = request.messages[-1]["content"] if request.messages else request.prompt or ""
        prompt_tokens = len(prompt.split()) + 3
        if prompt_tokens > self.context_tokens:
            raise InvalidRequest(
                f"This model's maximum context length is {self.context_tokens} tokens.",
                param="messages",
                code="context_length_exceeded",
            )
        if self.keep_calls:
            self.calls.append(request)
        self.active.add(request.request_id)
        words = f"echo: {prompt}".split(" ")
        try:
            for index, word in enumerate(words):
                if self.delay_s:
                    await asyncio.sleep(self.delay_s)
                yield TextDelta(word if index == 0 else " " + word)
            yield Finished(self.finish_reason, prompt_tokens, len(words), cached_tokens=2)  # type: ignore[arg-type]
        finally:
            self.active.discard(request.request_id)

    async def abort(self, request_id: str) -> None:
        self.aborted.append(request_id)

    def served_models(self) -> list[str]:
        return [MODEL]

    def serves_model(self, model: str) -> bool:
        return model in self.served_models()

    def max_context_tokens(self) -> int | None:
        return self.context_tokens
