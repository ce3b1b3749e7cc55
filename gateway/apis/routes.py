"""The API routes: each path, its adapter, through the one pipeline."""

from __future__ import annotations

from starlette.routing import Route

from gateway.apis.chat import CHAT
from gateway.apis.completions import COMPLETIONS
from gateway.apis.embeddings import EMBEDDINGS
from gateway.apis.messages import MESSAGES
from gateway.apis.passthrough import METHODS, PASSTHROUGH
from gateway.apis.pipeline import route
from gateway.apis.responses import RESPONSES


def api_routes() -> list[Route]:
    """Matched before FastAPI's routes (`pipeline.py` says why)."""
    return [
        route("/v1/chat/completions", CHAT),
        route("/v1/completions", COMPLETIONS),
        route("/v1/responses", RESPONSES),
        route("/v1/messages", MESSAGES),
        route("/v1/embeddings", EMBEDDINGS),
    ]


def passthrough_route() -> Route:
    """Reverse-proxy mode's pass-through: last, it takes only what no other route does."""
    return route("/v1/{path:path}", PASSTHROUGH, METHODS)
