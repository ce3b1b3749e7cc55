"""The engine as a gateway backend: chat template, sampling parameters, context limits.

Adapts an `engine.EngineClient`, the engine in this process or the engine process behind `kvgate serve
--workers N` (`engine.build_engine` makes either), to the `Backend` protocol. The tenant is the engine's
cache salt, so KV prefixes are shared only within a tenant (prompt-cache timing attacks are real). An
engine that cannot be reached answers 503 `engine_unavailable`.

A plain answer (one choice of text, no logprobs) streams as `TextDelta`s; one with several choices,
logprobs or tool calls as OpenAI chunks (`gateway/api/choice_chunks.py`), which the routes relay or fold as
they do an upstream's. `response_format` and forced tool calls become a grammar the engine decodes under
(`structured_outputs.py`); every choice follows it on its own.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, Literal

from prometheus_client import CollectorRegistry

from engine import (
    DEFAULT_GENERATOR_NAME,
    ContextLengthExceeded,
    EngineClient,
    EngineStopped,
    LocalEngineConfig,
    RemoteEngineConfig,
    SamplingParams,
    WeightsChoice,
    build_engine,
    register_engine_metrics,
)
from gateway.api.choice_chunks import ChoiceChunks
from gateway.api.errors import InvalidRequest, ServiceUnavailable
from gateway.backends.protocol import Chunk, Finished, GenerationEvent, GenerationRequest, TextDelta
from gateway.backends.structured_outputs import OutputPlan, plan_output
from gateway.runtime.settings import Settings

ENGINE_CONNECT_TIMEOUT_S = 60.0


class EngineBackend:
    """Misses answered by kvgate's own paged-KV engine."""

    name = "engine"
    passes_through = False
    models_mode = "engine"

    def __init__(self, client: EngineClient, model_name: str, default_max_tokens: int) -> None:
        self.client = client
        self.model_name = model_name
        self.default_max_tokens = default_max_tokens

    @classmethod
    def load(cls, settings: Settings) -> EngineBackend:
        """Load the configured generator (converting a GGUF once) and start the engine's step loop."""
        client = build_engine(local_engine_config(settings))
        return cls(client, client.model_name, settings.default_max_tokens)

    @classmethod
    def remote(cls, settings: Settings, socket_path: Path) -> EngineBackend:
        """The engine process at `socket_path` (connected by `start()`, in the app's event loop)."""
        client = build_engine(RemoteEngineConfig(socket_path))
        return cls(client, served_model_name(settings), settings.default_max_tokens)

    async def start(self) -> None:
        """Reach the engine process (nothing to do for an in-process one)."""
        await self.client.connect(timeout_s=ENGINE_CONNECT_TIMEOUT_S)

    @property
    def weights(self) -> WeightsChoice | None:
        """How the engine stores its weights and why (`/healthz` shows it); for the engine process, what
        it said when this worker last connected (it chooses again when it is restarted)."""
        description = self.client.info.get("weights")
        return None if description is None else WeightsChoice.from_description(description)

    @property
    def available(self) -> bool:
        """Can a miss reach the engine now? (The engine process may be restarting.)"""
        return self.client.connected

    async def refresh_metrics(self) -> None:
        """Read the engine process's metrics now, before a scrape (in process they are always current)."""
        await self.client.refresh_metrics()

    async def generate(self, request: GenerationRequest) -> AsyncIterator[GenerationEvent]:
        plan = OutputPlan([])
        if request.messages is not None:
            plan = (
                plan_output(request.body, request.messages)
                if request.path is None
                else OutputPlan(request.messages)
            )
            token_ids = await asyncio.to_thread(self.client.encode_chat, plan.messages)
            param = "messages"
        else:
            token_ids = await asyncio.to_thread(self.client.encode_prompt, request.prompt or "")
            param = "prompt"
        room = self.client.max_model_len - len(token_ids)
        if room <= 0:
            raise _too_long(len(token_ids), self.client.max_model_len, param)
        max_tokens = min(request.max_tokens or self.default_max_tokens, room)
        tokenizer: Any = self.client.tokenizer  # a transformers tokenizer: its length is the vocabulary's
        vocab_size = len(tokenizer)
        if any(not 0 <= token_id < vocab_size for token_id in request.logit_bias):
            raise InvalidRequest(
                f"logit_bias token ids must be in [0, {vocab_size}).",
                param="logit_bias",
                code="invalid_value",
            )
        sampling = _sampling_params(request, max_tokens, plan.grammar)
        chunks = None
        if request.n > 1 or request.logprobs is not None or plan.tool_call:
            chat = request.messages is not None
            chunks = ChoiceChunks(chat, request.model, request.n, tool_calls=plan.tool_call)
        opening = chunks.opening() if chunks is not None else []
        try:
            events = self.client.generate(
                request.request_id,
                token_ids,
                sampling=sampling,
                cache_salt=request.tenant,
                priority=request.priority,
            )
            async for event in events:
                while opening:  # after the engine took the request: an error before it stays a plain 4xx/5xx
                    yield Chunk(opening.pop(0))
                if isinstance(event, Finished):
                    if event.finish_reason == "abort":
                        raise ServiceUnavailable("The engine stopped this request.", code="engine_aborted")
                    reasons = [_reason(reason) for reason in event.choice_finish_reasons]
                    if chunks is not None:
                        for finish in chunks.finish(reasons):
                            yield Chunk(finish)
                        yield Chunk(chunks.usage(_usage(event)))
                    reason: Literal["stop", "length", "tool_calls"] = reasons[0]
                    if plan.tool_call and reason == "stop":
                        reason = "tool_calls"
                    # what the service sees: the first choice's reason, in OpenAI's words
                    yield Finished(reason, event.prompt_tokens, event.completion_tokens, event.cached_tokens)
                elif chunks is not None:
                    logprobs = event.logprobs if request.logprobs is not None else None
                    for chunk in chunks.text(event.index, event.text, logprobs):
                        yield Chunk(chunk)
                elif event.text:
                    yield TextDelta(event.text)
        except ContextLengthExceeded as error:
            raise _too_long(len(token_ids), self.client.max_model_len, param) from error
        except ValueError as error:  # a grammar the engine cannot compile (engine.grammar.GrammarError)
            if plan.grammar is None:
                raise
            raise InvalidRequest(
                str(error), param="tools" if plan.tool_call else "response_format"
            ) from error
        except EngineStopped as error:
            raise ServiceUnavailable(
                "The engine is not available right now; retry shortly.",
                code="engine_unavailable",
                headers={"Retry-After": "2"},
            ) from error

    def register_metrics(self, registry: CollectorRegistry) -> None:
        """Export the engine's series (prefix cache, KV usage, queues, TTFT, ITL) on the gateway's registry."""
        register_engine_metrics(registry, lambda: self.client.metrics)

    async def abort(self, request_id: str) -> None:
        await self.client.abort(request_id)

    def served_models(self) -> list[str]:
        return [self.model_name]

    def serves_model(self, model: str) -> bool:
        return model == self.model_name

    def max_context_tokens(self) -> int | None:
        return self.client.max_model_len

    async def close(self) -> None:
        await self.client.shutdown()


def local_engine_config(settings: Settings) -> LocalEngineConfig:
    """The in-process engine the settings describe (`engine.build_engine` loads it)."""
    return LocalEngineConfig(
        generator=settings.generator,
        model_dir=settings.model_dir,
        model_name=served_model_name(settings),
        weights=settings.engine_weights,
        decode=settings.engine_decode,
        kv_cache_tokens=settings.kv_cache_tokens,
        kv_block_size=settings.kv_block_size,
        max_num_seqs=settings.engine_max_num_seqs,
    )


def served_model_name(settings: Settings) -> str:
    """The name clients put in `model`: the setting, else the default's name or the file/folder name."""
    if settings.served_model_name:
        return settings.served_model_name
    if settings.generator == DEFAULT_GENERATOR_NAME:
        return DEFAULT_GENERATOR_NAME
    path = Path(settings.generator)
    return path.stem if path.suffix == ".gguf" else path.name or settings.generator


def _sampling_params(request: GenerationRequest, max_tokens: int, grammar: str | None) -> SamplingParams:
    return SamplingParams(
        temperature=request.temperature,
        top_p=request.top_p,
        seed=request.seed,
        max_tokens=max_tokens,
        stop=tuple(request.stop),
        n=request.n,
        logprobs=request.logprobs,
        presence_penalty=request.presence_penalty,
        frequency_penalty=request.frequency_penalty,
        logit_bias=tuple(sorted(request.logit_bias.items())),
        grammar=grammar,
    )


def _reason(engine_reason: str) -> Literal["stop", "length"]:
    return "length" if engine_reason == "length" else "stop"


def _usage(finished: Finished) -> dict[str, Any]:
    """The engine's token counts as OpenAI's `usage` object (carried by the answer's last chunk)."""
    return {
        "prompt_tokens": finished.prompt_tokens,
        "completion_tokens": finished.completion_tokens,
        "total_tokens": finished.prompt_tokens + finished.completion_tokens,
        "prompt_tokens_details": {"cached_tokens": finished.cached_tokens},
    }


def _too_long(prompt_tokens: int, limit: int, param: str) -> InvalidRequest:
    return InvalidRequest(
        f"This model's maximum context length is {limit} tokens; the prompt has {prompt_tokens}.",
        param=param,
        code="context_length_exceeded",
    )
