"""An embeddings request's flow, per input: each input's exact key -> the inputs not stored go to the backend
in one batch -> each new vector is stored -> the answer is assembled in the request's order.

A batch of 100 inputs of which 90 were seen sends only the 10 new ones on. `model`, `dimensions`,
`encoding_format` and every other field are part of each input's key (`semantic/store/scope.py`, endpoint
`embeddings`); inputs are compared exactly, never semantically. In reverse-proxy mode the upstream embeds;
with the engine, kvgate's own embedder (the one its cache runs) does, under its own name. The stored item is
the embedding as the backend sent it (a float list, or base64 when that was asked).
"""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import json
import struct
import time
from dataclasses import dataclass, field
from typing import Any

from gateway.api.errors import InvalidRequest, NotFound
from gateway.api.ids import random_hex
from gateway.api.objects import EmbeddingRequest
from gateway.backends.upstream import UpstreamBackend
from gateway.fleet.backend import FleetBackend
from gateway.observability.stats import NO_LANGUAGE
from gateway.service import CompletionService
from semantic import CacheControl, Lookup, RequestScope, build_scope, language_of

ENDPOINT = "embeddings"
# Inputs looked up at once: a batch of thousands must not take every connection of the store's pool.
CONCURRENT_LOOKUPS = 16


@dataclass(frozen=True, slots=True)
class EmbeddingsCall:
    request: EmbeddingRequest
    tenant: str
    control: CacheControl = field(default_factory=CacheControl)
    tags: tuple[str, ...] = ()
    request_id: str = field(default_factory=lambda: random_hex(12))


@dataclass(frozen=True, slots=True)
class EmbeddingsAnswer:
    whole: dict[str, Any]
    result: str  # "exact_hit" (every input stored), "miss" (some computed) or "bypass"
    cached: int  # inputs answered from the cache
    total: int


class EmbeddingsService:
    """Answers embeddings requests input by input from the cache, the rest from the backend in one batch."""

    def __init__(self, completions: CompletionService) -> None:
        self.completions = completions  # its cache, backend, stats, metrics and fail-open store access

    async def answer(self, call: EmbeddingsCall) -> EmbeddingsAnswer:
        request, service = call.request, self.completions
        upstream = service.backend if isinstance(service.backend, UpstreamBackend | FleetBackend) else None
        if upstream is not None and not upstream.serves_model(request.model):
            raise NotFound(
                f"The model '{request.model}' does not exist.", param="model", code="model_not_found"
            )
        if upstream is None:
            self._check_local(request)
        inputs = request.inputs
        if not inputs or any(item in ("", []) for item in inputs):
            raise InvalidRequest("Every input must be a non-empty text or token array.", param="input")
        scopes = [self._scope(call, item) for item in inputs]
        lookups: list[Lookup | None] = []
        for start in range(
            0, len(scopes), CONCURRENT_LOOKUPS
        ):  # a few at a time: the store's connections are shared
            window = scopes[start : start + CONCURRENT_LOOKUPS]
            lookups += await asyncio.gather(*(service.store.lookup(scope, call.control) for scope in window))
        stored = [_stored_item(lookup) for lookup in lookups]
        missing = [index for index, item in enumerate(stored) if item is None]
        sent: dict[str, Any] = {}
        if missing:
            started = time.monotonic()
            batch = [inputs[index] for index in missing]
            sent = await (
                self._upstream(upstream, request, batch) if upstream else self._local(request, batch)
            )
            items = sorted(sent.get("data") or [], key=lambda item: int(item.get("index", 0)))
            if len(items) != len(missing):
                raise InvalidRequest("The backend answered a different number of embeddings.", param="input")
            seconds = time.monotonic() - started
            for index, item in zip(missing, items, strict=True):
                stored[index] = item["embedding"]
                raw = json.dumps({"embedding": item["embedding"], "model": sent.get("model"), "s": seconds})
                await service.store.insert(
                    scopes[index], raw, call.control, tags=call.tags, exact_only="an embedding"
                )
        cached = 0 if call.control.bypass else len(inputs) - len(missing)
        model = sent.get("model") or _stored_model(lookups) or request.model
        usage = sent.get("usage") or {"prompt_tokens": 0, "total_tokens": 0}
        whole = {
            "object": "list",
            "data": [
                {"object": "embedding", "index": index, "embedding": embedding}
                for index, embedding in enumerate(stored)
            ],
            "model": model,
            "usage": usage,
        }
        result = "bypass" if call.control.bypass else ("exact_hit" if not missing else "miss")
        answer = EmbeddingsAnswer(whole, result, cached, len(inputs))
        # One request, one language: its first input's (an input of token ids has none).
        language = language_of(inputs[0]) if isinstance(inputs[0], str) else NO_LANGUAGE
        service.stats.record(
            call.tenant,
            request.model,
            result,
            0,
            0.0,
            scope_id=scopes[0].scope_id,
            route=ENDPOINT,
            language=language,
        )
        service.metrics.requests.labels(ENDPOINT, call.tenant, request.model, result).inc()
        service.metrics.requests_by_language.labels(language, result).inc()
        return answer

    def _scope(self, call: EmbeddingsCall, item: str | list[int]) -> RequestScope:
        body = call.request.model_dump(exclude_unset=True, exclude={"input"})
        body["prompt"] = item if isinstance(item, str) else json.dumps(item)
        scope = build_scope(
            body,
            tenant=call.tenant,
            embedder=self.completions.cache.scope_embedder,
            secret=self.completions.scope_secret,
            endpoint=ENDPOINT,
        )
        return dataclasses.replace(scope, semantic_refusal="embeddings are compared exactly")

    async def _upstream(
        self,
        upstream: UpstreamBackend | FleetBackend,
        request: EmbeddingRequest,
        batch: list[str | list[int]],
    ) -> dict[str, Any]:
        body = request.model_dump(exclude_unset=True)
        body["input"] = batch
        return await upstream.embed(body)

    def _check_local(self, request: EmbeddingRequest) -> None:
        embedder = self.completions.cache.embedder
        if request.model != embedder.name:
            raise NotFound(
                f"The model '{request.model}' does not exist; embeddings here come from '{embedder.name}'.",
                param="model",
                code="model_not_found",
            )
        if request.dimensions is not None and request.dimensions != embedder.dimension:
            raise InvalidRequest(
                f"'{embedder.name}' gives {embedder.dimension} dimensions.",
                param="dimensions",
                code="unsupported_parameter",
            )

    async def _local(self, request: EmbeddingRequest, batch: list[str | list[int]]) -> dict[str, Any]:
        """kvgate's own embedder (the cache's), on its inference thread."""
        if any(not isinstance(item, str) for item in batch):
            raise InvalidRequest(
                "Token arrays are not accepted here: send text.", param="input", code="unsupported_parameter"
            )
        batcher = self.completions.cache.batcher
        embeddings = await asyncio.gather(*(batcher.embed(str(item)) for item in batch))
        data = []
        tokens = 0
        for index, embedding in enumerate(embeddings):
            if embedding.vector is None:
                raise InvalidRequest(
                    f"Input {index} has {embedding.num_tokens} tokens, over the embedder's "
                    f"{self.completions.cache.embedder.max_tokens}.",
                    param="input",
                    code="context_length_exceeded",
                )
            tokens += embedding.num_tokens
            vector = [float(value) for value in embedding.vector.reshape(-1)]
            encoded: Any = vector
            if request.encoding_format == "base64":
                encoded = base64.b64encode(struct.pack(f"<{len(vector)}f", *vector)).decode()
            data.append({"object": "embedding", "index": index, "embedding": encoded})
        return {
            "object": "list",
            "data": data,
            "model": request.model,
            "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
        }


def _stored_item(lookup: Lookup | None) -> Any:
    if lookup is None or not lookup.hit or lookup.entry is None:
        return None
    return json.loads(lookup.entry.response)["embedding"]


def _stored_model(lookups: list[Lookup | None]) -> str | None:
    for lookup in lookups:
        if lookup is not None and lookup.entry is not None:
            return str(json.loads(lookup.entry.response).get("model") or "") or None
    return None
