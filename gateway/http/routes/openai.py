"""The API operations as FastAPI declares them, for the OpenAPI schema and `/docs`, and `GET /v1/models`.

A POST never reaches these handlers: the same paths are served first by the pipeline's plain Starlette routes
(`gateway/apis/routes.py`); the handlers hand over to it all the same, so that either way answers alike.
"""

from __future__ import annotations

from fastapi import APIRouter, Request, Response

from gateway.api.objects import (
    ChatCompletionRequest,
    CompletionRequest,
    EmbeddingRequest,
    MessagesRequest,
    ModelCard,
    ModelList,
    ResponsesRequest,
)
from gateway.apis.chat import CHAT
from gateway.apis.completions import COMPLETIONS
from gateway.apis.embeddings import EMBEDDINGS
from gateway.apis.messages import MESSAGES
from gateway.apis.pipeline import run
from gateway.apis.responses import RESPONSES
from gateway.http.deps import CurrentTenant, ServiceDep

router = APIRouter(prefix="/v1")


@router.post("/chat/completions")
async def chat_completions(request: ChatCompletionRequest, http: Request) -> Response:
    """Create a chat completion (JSON or SSE), from the cache when it can. Headers: `Cache-Control`,
    `x-kvgate-semantic-strictness`, `x-kvgate-tags`, `x-kvgate-priority`."""
    return await run(CHAT, http)


@router.post("/completions")
async def completions(request: CompletionRequest, http: Request) -> Response:
    """Create a legacy text completion (JSON or SSE), from the cache when it can (same headers as chat)."""
    return await run(COMPLETIONS, http)


@router.post("/responses")
async def responses(request: ResponsesRequest, http: Request) -> Response:
    """Create a response (the Responses API; JSON or SSE events) in reverse-proxy mode: a stateless request
    is cached as chat is; one naming `previous_response_id` or a `conversation` passes through uncached."""
    return await run(RESPONSES, http)


@router.post("/messages")
async def messages(request: MessagesRequest, http: Request) -> Response:
    """Create a message (Anthropic's Messages API; JSON or SSE events), from the cache when it can."""
    return await run(MESSAGES, http)


@router.post("/embeddings")
async def embeddings(request: EmbeddingRequest, http: Request) -> Response:
    """Create embeddings (float or base64), each input from the cache when it was seen before. Headers:
    `Cache-Control`, `x-kvgate-tags`; the answer says `x-kvgate-cached-inputs: cached/total`."""
    return await run(EMBEDDINGS, http)


@router.get("/models")
async def models(service: ServiceDep, tenant: CurrentTenant) -> ModelList:
    """List the models this gateway answers to."""
    created = int(service.stats.started)
    return ModelList(data=[ModelCard(id=name, created=created) for name in service.backend.served_models()])
