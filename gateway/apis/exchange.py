"""What the pipeline and an API's adapter hand each other: the request as read (`Exchange`), the answer as
sent (`Reply`), and what an adapter is (`Api`).

The pipeline (`pipeline.py`) does what every API does alike: the caller, the body, the span, admission,
the cache headers, the metric and the access line. An adapter does what only its API knows: its request
model, what is refused up front, how it is answered and rendered, and its error shape.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar

from fastapi.exceptions import RequestValidationError
from starlette.datastructures import Headers
from starlette.requests import Request
from starlette.responses import Response

from gateway.api.errors import KvgateError
from gateway.traffic.ratelimit import Admission, RateLimiter
from semantic import CacheControl

RequestT = TypeVar("RequestT")


@dataclass(frozen=True, slots=True)
class Exchange(Generic[RequestT]):
    """One request as the pipeline read it, for the adapter to answer."""

    http: Request
    request: RequestT
    tenant: str
    request_id: str
    control: CacheControl
    tags: tuple[str, ...]
    priority: int
    admission: Admission
    charged: bool
    """Admission was charged before the adapter ran; else the adapter charges it once a call costs."""

    @property
    def state(self) -> Any:
        """The app's services (`app.state`: service, embeddings, settings, ...)."""
        return self.http.app.state

    @property
    def admit(self) -> Admission | None:
        """What to call when the request turns out to need the backend: None when already charged."""
        return None if self.charged else self.admission


@dataclass(slots=True)
class Reply:
    """What was answered, for the headers, the metric, the span and the access line."""

    response: Response
    cache: str
    """`exact-hit`, `semantic-hit`, `miss`, `bypass` (or `error`, set by the pipeline)."""
    similarity: float | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    finish_reason: str | None = None
    prompt: str | None = None
    """The prompt for the access line, only when the operator asked for prompts in logs."""


class Api(Protocol[RequestT]):
    """One API's adapter, as the pipeline drives it."""

    @property
    def route(self) -> str:
        """The route's label in metrics, stats and the access log (`chat`, `messages`, ...)."""
        ...

    @property
    def operation(self) -> str:
        """The span's GenAI operation (`chat`, `text_completion`, `embeddings`, ...)."""
        ...

    @property
    def free_hits(self) -> bool:
        """A hit is not charged to the rate limit (unless `KVGATE_RATE_LIMIT_COUNT_HITS`): the adapter charges
        once a request needs the backend."""
        ...

    def credentials(self, headers: Headers) -> str | None:
        """The `Authorization` value that names the tenant."""
        ...

    async def parse(self, http: Request) -> RequestT:
        """The body as this API's request model; raises `RequestValidationError` or `KvgateError`."""
        ...

    def model(self, request: RequestT) -> str: ...

    def check(self, request: RequestT, state: Any) -> None:
        """Refuse up front, before anything is charged, what this request cannot be answered with."""
        ...

    def span_attributes(self, request: RequestT) -> dict[str, Any]:
        """`gen_ai.request.*` attributes (max_tokens, temperature, ...)."""
        ...

    def cost(self, request: RequestT, limiter: RateLimiter) -> int:
        """Tokens charged to the tenant's limit: an estimate, cheap and pessimistic."""
        ...

    async def serve(self, exchange: Exchange[RequestT]) -> Reply: ...

    def error(self, error: KvgateError) -> Response:
        """A kvgate error in this API's own shape."""
        ...

    def invalid(self, error: RequestValidationError) -> Response:
        """A body that does not parse, in this API's own shape (400)."""
        ...
