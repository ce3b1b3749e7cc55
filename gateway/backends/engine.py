"""The engine as a gateway backend: chat template, sampling parameters, context limits.

Adapts `engine.serving.client.AsyncEngineClient` (the engine in this process) or `engine.serving.remote_client.
RemoteEngineClient` (the engine process behind `kvgate serve --workers N`) to the `Backend` protocol. The
tenant is the engine's cache salt, so KV prefixes are shared only within a tenant (prompt-cache timing
attacks are real). An engine that cannot be reached answers 503 `engine_unavailable`.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, Literal

from prometheus_client import CollectorRegistry

from engine.engine import ContextLengthExceeded, EngineConfig
from engine.metrics import register_engine_metrics
from engine.sampler import SamplingParams
from engine.scheduler import SchedulerConfig
from engine.serving.client import AsyncEngineClient, EngineStopped
from engine.serving.client import Finished as EngineFinished
from engine.serving.client import Usage as EngineUsage
from engine.serving.remote_client import RemoteEngineClient
from engine.weights.choice import WeightsChoice, choose_weights
from engine.weights.loader import ensure_hf_folder, load_model, load_tokenizer, read_config, weights_storage
from engine.weights.model_files import DEFAULT_GENERATOR_NAME, resolve_generator
from gateway.api.errors import InvalidRequest, ServiceUnavailable
from gateway.backends.protocol import Chunk, Finished, GenerationEvent, GenerationRequest, TextDelta
from gateway.backends.structured_outputs import OutputPlan, plan_output
from gateway.backends.tool_call_chunks import ToolCallChunks
from gateway.runtime.settings import Settings

logger = logging.getLogger("kvgate.engine")

ENGINE_CONNECT_TIMEOUT_S = 60.0


class EngineBackend:
    """Misses answered by kvgate's own paged-KV engine."""

    name = "engine"
    passes_through = False
    models_mode = "engine"

    def __init__(
        self,
        client: AsyncEngineClient | RemoteEngineClient,
        model_name: str,
        default_max_tokens: int,
        weights: WeightsChoice | None = None,
    ) -> None:
        self.client = client
        self.model_name = model_name
        self.default_max_tokens = default_max_tokens
        self._weights = weights

    @classmethod
    def load(cls, settings: Settings) -> EngineBackend:
        """Load the configured generator (converting a GGUF once) and start the engine's step loop."""
        client, weights, _ = start_engine(settings)
        return cls(client, client.model_name, settings.default_max_tokens, weights)

    @classmethod
    def remote(cls, settings: Settings, socket_path: Path) -> EngineBackend:
        """The engine process at `socket_path` (connected by `start()`, in the app's event loop)."""
        client = RemoteEngineClient(socket_path, load_tokenizer)
        return cls(client, served_model_name(settings), settings.default_max_tokens)

    async def start(self) -> None:
        """Reach the engine process (nothing to do for an in-process one)."""
        if isinstance(self.client, RemoteEngineClient):
            await self.client.connect(timeout_s=ENGINE_CONNECT_TIMEOUT_S)

    @property
    def weights(self) -> WeightsChoice | None:
        """How the engine stores its weights and why (`/healthz` shows it); for the engine process, what
        it said when this worker last connected (it chooses again when it is restarted)."""
        if isinstance(self.client, RemoteEngineClient):
            description = self.client.info.get("weights")
            return None if description is None else WeightsChoice.from_description(description)
        return self._weights

    @property
    def available(self) -> bool:
        """Can a miss reach the engine now? (The engine process may be restarting.)"""
        return not isinstance(self.client, RemoteEngineClient) or self.client.connected

    async def refresh_metrics(self) -> None:
        """Read the engine process's metrics now, before a scrape (in process they are always current)."""
        if isinstance(self.client, RemoteEngineClient):
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
        sampling = SamplingParams(
            temperature=request.temperature,
            top_p=request.top_p,
            seed=request.seed,
            max_tokens=max_tokens,
            stop=tuple(request.stop),
            grammar=plan.grammar,
        )
        tool_call = ToolCallChunks(request.model) if plan.tool_call else None
        try:
            events = self.client.generate(
                request.request_id,
                token_ids,
                sampling=sampling,
                cache_salt=request.tenant,
                priority=request.priority,
            )
            async for event in events:
                if isinstance(event, EngineFinished):
                    usage = event.usage
                    if event.finish_reason == "abort":
                        raise ServiceUnavailable("The engine stopped this request.", code="engine_aborted")
                    reason: Literal["stop", "length", "tool_calls"] = (
                        "length" if event.finish_reason == "length" else "stop"
                    )
                    if tool_call is not None:  # the call as OpenAI's chunks, its usage with them
                        for chunk in tool_call.finish(reason == "stop", _usage_payload(usage)):
                            yield Chunk(chunk)
                        reason = "tool_calls" if reason == "stop" else reason
                    yield Finished(reason, usage.prompt_tokens, usage.completion_tokens, usage.cached_tokens)
                elif event.text and tool_call is not None:
                    for chunk in tool_call.add(event.text):
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


def start_engine(settings: Settings) -> tuple[AsyncEngineClient, WeightsChoice, Path]:
    """Load the configured generator in this process and start the engine's step loop; also returns the
    model folder (its tokenizer is the one workers use)."""
    source = resolve_generator(settings.generator, settings.model_dir)
    config = read_config(ensure_hf_folder(source, settings.model_dir))
    weights = choose_weights(settings.engine_weights, config, weights_storage(source), settings.engine_decode)
    loaded = load_model(source, settings.model_dir, weights=weights.weights)
    engine_config = EngineConfig(
        num_blocks=max(1, settings.kv_cache_tokens // settings.kv_block_size),
        block_size=settings.kv_block_size,
        scheduler=SchedulerConfig(max_num_seqs=settings.engine_max_num_seqs),
        decode_kernel=settings.engine_decode,
    )
    client = AsyncEngineClient.from_loaded(loaded, served_model_name(settings), engine_config)
    weights = dataclasses.replace(weights, decode=client.engine.runner.decode_kernel)
    logger.info("engine decode steps: %s", weights.decode)
    client.start()
    return client, weights, loaded.folder


def served_model_name(settings: Settings) -> str:
    """The name clients put in `model`: the setting, else the default's name or the file/folder name."""
    if settings.served_model_name:
        return settings.served_model_name
    if settings.generator == DEFAULT_GENERATOR_NAME:
        return DEFAULT_GENERATOR_NAME
    path = Path(settings.generator)
    return path.stem if path.suffix == ".gguf" else path.name or settings.generator


def _usage_payload(usage: EngineUsage) -> dict[str, Any]:
    """The engine's usage as OpenAI's `usage` object (carried by a tool call's last chunk)."""
    return {
        "prompt_tokens": usage.prompt_tokens,
        "completion_tokens": usage.completion_tokens,
        "total_tokens": usage.prompt_tokens + usage.completion_tokens,
        "prompt_tokens_details": {"cached_tokens": usage.cached_tokens},
    }


def _too_long(prompt_tokens: int, limit: int, param: str) -> InvalidRequest:
    return InvalidRequest(
        f"This model's maximum context length is {limit} tokens; the prompt has {prompt_tokens}.",
        param=param,
        code="context_length_exceeded",
    )
