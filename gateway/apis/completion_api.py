"""What the four completion APIs (chat, legacy completions, Responses, Messages) share: one flow through
the service, the cache headers, what the access line and the span read of the answer. Each API's adapter
subclasses `CompletionApi` and says what differs: its request model, refusals, scope, generation, storage
rule, rendering and error shape."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, ClassVar, Generic, TypeVar

from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel
from starlette.datastructures import Headers
from starlette.requests import Request
from starlette.responses import Response

from gateway.answers import StoredAnswer, storable
from gateway.api.errors import KvgateError, validation_error_body
from gateway.apis.exchange import Exchange, Reply
from gateway.apis.request_body import parse_body
from gateway.backends.protocol import Backend, Finished, GenerationEvent, GenerationRequest
from gateway.service import CachedAnswer, CompletionCall, CompletionService, LiveAnswer
from gateway.traffic.ratelimit import RateLimiter
from semantic import CacheControl

Body = TypeVar("Body", bound=BaseModel)
BACKEND_HEADER = "x-kvgate-backend"


class CompletionApi(ABC, Generic[Body]):
    """An API answered from the cache or by a generation (`CompletionService`)."""

    route: ClassVar[str]
    operation: ClassVar[str]
    endpoint: ClassVar[str | None] = None
    body: ClassVar[type[BaseModel]]
    free_hits: ClassVar[bool] = True
    chat_format: ClassVar[bool] = True
    """An entry of the first stored format is read as a chat completion (else as a text completion)."""

    # --- the pipeline's side -----------------------------------------------------------------------------

    def credentials(self, headers: Headers) -> str | None:
        return headers.get("authorization")

    async def parse(self, http: Request) -> Body:
        parsed: Body = await parse_body(http, self.body)  # type: ignore[arg-type]
        return parsed

    def model(self, request: Body) -> str:
        return str(request.model)  # type: ignore[attr-defined]

    def check(self, request: Body, state: Any) -> None:
        self.refuse(request, state.service.backend)

    def span_attributes(self, request: Body) -> dict[str, Any]:
        return {
            "max_tokens": request.max_new_tokens,  # type: ignore[attr-defined]
            "temperature": getattr(request, "temperature", None),
            "top_p": getattr(request, "top_p", None),
            "seed": getattr(request, "seed", None),
        }

    def cost(self, request: Body, limiter: RateLimiter) -> int:
        """Prompt characters / 4 + the completion budget: cheap, pessimistic, good enough for a limit."""
        budget = request.max_new_tokens or limiter.default_max_tokens  # type: ignore[attr-defined]
        return self.prompt_characters(request) // 4 + budget

    async def serve(self, exchange: Exchange[Body]) -> Reply:
        service: CompletionService = exchange.state.service
        request = exchange.request
        call = CompletionCall(
            request,
            exchange.tenant,
            self,
            self.control(request, exchange.control),
            exchange.tags,
            exchange.request_id,
            exchange.priority,
            exchange.admit,
            self.upstream_headers(exchange.http.headers, service.backend),
        )
        moves = service.cache.epochs.moves  # before the lookup: a copy of what it read must predate any move
        answer = await service.answer(call)
        reply = await self.render(request, answer, exchange.state)
        memo = getattr(exchange.state, "exact_memo", None)
        if memo is not None and isinstance(answer, CachedAnswer):
            memo.learn(self, exchange, answer, await exchange.http.body(), moves)
        return reply

    async def render(self, request: Body, answer: CachedAnswer | LiveAnswer, state: Any) -> Reply:
        """The answer as this API sends it, with the cache headers and what the access line reads."""
        headers = self.cache_headers(answer)
        response = await self.respond(request, answer, headers)
        if isinstance(answer, LiveAnswer) and answer.flight.answered_by is not None:
            response.headers[BACKEND_HEADER] = answer.flight.answered_by  # known once the answer began
        reply = Reply(
            response, headers["x-kvgate-cache"], answer.lookup.similarity if answer.lookup else None
        )
        finished = _finished(answer, state.tracing.enabled)
        if finished is not None:
            reply.prompt_tokens, reply.completion_tokens, reply.finish_reason = finished
        if state.service.log_prompts:
            reply.prompt = self.last_turn(request)
        return reply

    def error(self, error: KvgateError) -> Response:
        return JSONResponse(error.body(), status_code=error.status_code, headers=error.headers)

    def invalid(self, error: RequestValidationError) -> Response:
        return JSONResponse(validation_error_body(error), status_code=400)

    # --- the service's side (`service.RequestKind`) ------------------------------------------------------

    def scope_body(self, request: Body) -> tuple[dict[str, Any], str | None]:
        return request.model_dump(exclude_unset=True), None

    def storable(self, whole: dict[str, Any], store_truncated: bool) -> tuple[bool, bool]:
        return storable(whole, store_truncated), self.plain_text(whole)

    def stored(self, raw: str, model: str) -> StoredAnswer:
        return StoredAnswer.from_json(raw, chat=self.chat_format, model=model)

    # --- what each API says ------------------------------------------------------------------------------

    def refuse(self, request: Body, backend: Backend) -> None:
        """Raise `InvalidRequest` for what the backend cannot honour (an upstream decides for itself)."""

    def control(self, request: Body, control: CacheControl) -> CacheControl:
        """The request's cache controls, as this API allows them."""
        return control

    def upstream_headers(self, headers: Headers, backend: Backend) -> dict[str, str]:
        """Headers an upstream needs for this API besides kvgate's own."""
        return {}

    def cache_headers(self, answer: CachedAnswer | LiveAnswer) -> dict[str, str]:
        if isinstance(answer, LiveAnswer):
            headers = {"x-kvgate-cache": answer.result.replace("_", "-")}
            if answer.shadowed:
                headers["x-kvgate-shadow"] = "semantic-hit"
            return headers
        lookup = answer.lookup
        headers = {"x-kvgate-cache": lookup.kind.value.replace("_", "-")}
        if lookup.entry is not None:
            headers["x-kvgate-entry-id"] = lookup.entry.entry_id
        if lookup.kind.value == "semantic_hit" and lookup.similarity is not None:
            headers["x-kvgate-similarity"] = f"{lookup.similarity:.4f}"
        return headers

    @abstractmethod
    def prompt_characters(self, request: Body) -> int: ...

    @abstractmethod
    def last_turn(self, request: Body) -> str:
        """The text the access line shows when prompts are logged."""

    @abstractmethod
    def plain_text(self, whole: dict[str, Any]) -> bool:
        """May this answer serve a reworded request (plain text: no tools, logprobs, several choices)?"""

    @abstractmethod
    def generation(self, call: CompletionCall) -> GenerationRequest: ...

    @abstractmethod
    def whole_of(self, events: list[GenerationEvent], finished: Finished, model: str) -> dict[str, Any]: ...

    @abstractmethod
    async def respond(
        self, request: Body, answer: CachedAnswer | LiveAnswer, headers: dict[str, str]
    ) -> Response: ...


def _finished(answer: CachedAnswer | LiveAnswer, traced: bool) -> tuple[int, int, str | None] | None:
    """Tokens and finish reason, when known by now (not for a live stream still running). A stored answer's
    finish reason is read from its object only for a span that records it."""
    if isinstance(answer, CachedAnswer):
        stored = answer.answer
        return stored.prompt_tokens, stored.completion_tokens, stored.finish_reason if traced else None
    finished = answer.flight.finished
    if finished is None:
        return None
    return finished.prompt_tokens, finished.completion_tokens, finished.finish_reason
