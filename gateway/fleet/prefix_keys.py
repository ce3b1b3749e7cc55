"""A request's prefix chain: one hash per prefix a model server could hold in its KV cache.

    chain = [h1, h2, ..., hn]      h0 = H(model, tools)     hi = H(h(i-1), turn i)

A turn is a message (role and text): the system prompt, then each earlier user turn and answer, then the
new turn, in the order a chat template lays them out, so h1 names "this model, these tools, this system
prompt" and hi "... and these i turns". Two requests that share their first k turns share h1..hk, and the
server that computed one holds the KV of those turns for the other (until it evicts them). A legacy
completion's prompt is cut into `TEXT_PIECE` characters; a Responses request's `instructions` and `input`
items are its turns. Tools come first because templates render them ahead of the system prompt.

The tenant is not in the chain: what a server may reuse is its business (vLLM and SGLang share prefixes
across requests; kvgate's engine salts them per tenant, and a fleet reaches it with one key). Hashes are
BLAKE2b-128 over the JSON of each piece: cheap next to a request, and no collision makes a wrong answer,
only a worse choice of server.

The chain also says how many of its leading links are shared context (tools and system prompts: what
many conversations open with); the links after them are this conversation's own turns. Routing lets a
hot system prompt spill over to a second server, but keeps a conversation where its turns are.

This module reads the request and nothing else: no server, no table.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any

from gateway.backends.protocol import GenerationRequest

TEXT_PIECE = 256  # characters of a legacy prompt per link: about 64 tokens, four of a server's KV blocks
MAX_LINKS = 64  # a longer conversation is routed by its first 64 turns
SHARED_ROLES = ("system", "developer")


@dataclass(frozen=True, slots=True)
class PrefixChain:
    links: tuple[bytes, ...] = ()
    """The hashes of the request's growing prefixes, shortest first (empty: nothing to route by)."""
    shared: int = 0
    """How many leading links are shared context (system prompts), not this conversation's turns."""


def prefix_chain(request: GenerationRequest) -> PrefixChain:
    head = _hash(b"", [request.model, request.body.get("tools")])
    links: list[bytes] = []
    pieces = _pieces(request)[:MAX_LINKS]
    for piece in pieces:
        head = _hash(head, piece)
        links.append(head)
    shared = 0
    while shared < len(pieces) and isinstance(pieces[shared], list) and pieces[shared][0] in SHARED_ROLES:
        shared += 1
    return PrefixChain(tuple(links), shared)


def _pieces(request: GenerationRequest) -> list[Any]:
    if request.messages is not None:
        return [[message.get("role"), message.get("content")] for message in request.messages]
    if request.prompt is not None:
        text = request.prompt
        return [text[start : start + TEXT_PIECE] for start in range(0, len(text), TEXT_PIECE)]
    body = request.body
    pieces: list[Any] = []
    if body.get("instructions"):
        pieces.append(["system", body["instructions"]])
    items = body.get("input")
    if isinstance(items, str):
        pieces.append(["user", items])
    elif isinstance(items, list):
        pieces += items
    return pieces


def _hash(previous: bytes, piece: Any) -> bytes:
    text = json.dumps(piece, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.blake2b(previous + text.encode(), digest_size=16).digest()
