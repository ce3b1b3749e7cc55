"""Structured logs: one JSON line per request, and a JSON formatter for every kvgate log record.

An access line carries the request id, tenant, model, cache result, similarity, latency and tokens; never
the prompt (unless `KVGATE_LOG_PROMPTS` is set), never an API key.
"""

from __future__ import annotations

import json
import logging
import time
from typing import Any

from gateway.tracecontext import current_trace

access_logger = logging.getLogger("kvgate.access")

_RESERVED = set(vars(logging.makeLogRecord({}))) | {"message", "asctime"}


class JsonFormatter(logging.Formatter):
    """`{"ts", "level", "logger", "message", ...extra fields}` on one line, plus the request's trace ids."""

    def format(self, record: logging.LogRecord) -> str:
        payload: dict[str, Any] = {
            "ts": round(record.created, 3),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        trace = current_trace.get()
        if trace is not None:
            payload["trace_id"] = trace.trace_id
            payload["span_id"] = trace.span_id
        payload.update({key: value for key, value in vars(record).items() if key not in _RESERVED})
        if record.exc_info:
            payload["exception"] = self.formatException(record.exc_info)
        return json.dumps(payload, default=str)


def configure_logging(level: str, json_lines: bool) -> None:
    """Send kvgate's records (and uvicorn's) to stderr, as JSON lines or as plain text."""
    handler = logging.StreamHandler()
    if json_lines:
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())


def log_request(
    *,
    request_id: str,
    route: str,
    tenant: str,
    model: str,
    cache: str,
    status: int,
    started: float,
    similarity: float | None = None,
    prompt_tokens: int | None = None,
    completion_tokens: int | None = None,
    prompt: str | None = None,
) -> None:
    fields: dict[str, Any] = {
        "request_id": request_id,
        "route": route,
        "tenant": tenant,
        "model": model,
        "cache": cache,
        "status": status,
        "latency_ms": round((time.perf_counter() - started) * 1000.0, 2),
    }
    if similarity is not None:
        fields["similarity"] = round(similarity, 4)
    if prompt_tokens is not None:
        fields["prompt_tokens"] = prompt_tokens
    if completion_tokens is not None:
        fields["completion_tokens"] = completion_tokens
    if prompt is not None:
        fields["prompt"] = prompt
    access_logger.info("request", extra=fields)
