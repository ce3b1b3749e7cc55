"""W3C trace context for one request: parsed from `traceparent`, kept in a contextvar, read by the logs.

Every request gets a trace id: the client's (from a valid `traceparent`) or a fresh one. The JSON log
formatter puts it on every line logged while the request runs; when OTel tracing is on, the request's span
continues the client's trace and its ids replace these; the upstream call forwards `traceparent`.
This module knows the header format and the contextvar; it exports no spans.
"""

from __future__ import annotations

import re
from contextvars import ContextVar
from dataclasses import dataclass

from starlette.types import ASGIApp, Receive, Scope, Send

from gateway.api.ids import random_hex

TRACEPARENT = "traceparent"
_TRACEPARENT_RE = re.compile(r"^([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})$")


@dataclass(frozen=True, slots=True)
class TraceContext:
    trace_id: str
    span_id: str
    """The parent span (the client's), or the kvgate span once tracing has started one."""
    flags: str = "01"
    from_client: bool = False

    @property
    def traceparent(self) -> str:
        return f"00-{self.trace_id}-{self.span_id}-{self.flags}"


current_trace: ContextVar[TraceContext | None] = ContextVar("kvgate_trace", default=None)


def parse_traceparent(header: str | None) -> TraceContext | None:
    """A valid version-00-compatible header, or None (all-zero ids and version ff are invalid)."""
    if not header:
        return None
    match = _TRACEPARENT_RE.match(header.strip().lower())
    if match is None:
        return None
    version, trace_id, span_id, flags = match.groups()
    if version == "ff" or trace_id == "0" * 32 or span_id == "0" * 16:
        return None
    return TraceContext(trace_id, span_id, flags, from_client=True)


def new_trace() -> TraceContext:
    return TraceContext(random_hex(16), random_hex(8), "01")


class TraceContextMiddleware:
    """Sets `current_trace` for each HTTP request (pure ASGI, so the value reaches the route's tasks)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        raw = dict(scope.get("headers") or []).get(TRACEPARENT.encode())
        context = parse_traceparent(raw.decode("latin-1") if raw else None) or new_trace()
        token = current_trace.set(context)
        try:
            await self.app(scope, receive, send)
        finally:
            current_trace.reset(token)
