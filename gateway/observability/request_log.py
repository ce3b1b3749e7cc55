"""Structured logs: one JSON line per request, and a JSON formatter for every kvgate log record.

An access line carries the request id, tenant, model, cache result, similarity, latency and tokens; never
the prompt (unless `KVGATE_LOG_PROMPTS` is set), never an API key.

Records are formatted and written on a thread of their own (`QueueHandler` -> `QueueListener`): on the
event loop, formatting the access line and writing it to stderr cost 12% of an exact hit's CPU. The
caller's thread only stamps what belongs to it (the trace ids in its context, the traceback).
"""

from __future__ import annotations

import atexit
import contextlib
import json
import logging
import queue
import time
from logging.handlers import QueueHandler, QueueListener
from typing import Any

from gateway.observability.tracecontext import current_trace

access_logger = logging.getLogger("kvgate.access")
# The API routes: the pipeline writes their line (gateway/apis/pipeline.py).
COMPLETION_PATHS = (
    "/v1/chat/completions",
    "/v1/completions",
    "/v1/responses",
    "/v1/messages",
    "/v1/embeddings",
)

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
        elif record.exc_text:  # formatted by the caller's thread (StampingQueueHandler)
            payload["exception"] = record.exc_text
        return json.dumps(payload, default=str)


class StampingQueueHandler(QueueHandler):
    """Hands records to the writer thread, with what only the calling thread knows already on them."""

    def prepare(self, record: logging.LogRecord) -> logging.LogRecord:
        trace = current_trace.get()
        if trace is not None:  # the contextvar is the caller's: read it here, not on the writer thread
            record.trace_id = trace.trace_id
            record.span_id = trace.span_id
        record.msg = record.getMessage()
        record.args = None
        if record.exc_info:
            record.exc_text = logging.Formatter().formatException(record.exc_info)
            record.exc_info = None  # tracebacks hold frames: not for another thread
        return record


def configure_logging(level: str, json_lines: bool) -> QueueListener:
    """Send kvgate's records (and uvicorn's) to stderr, as JSON lines or as plain text, from a writer thread."""
    handler = logging.StreamHandler()
    if json_lines:
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s %(message)s"))
    # Thread, process and task names go in no line kvgate writes; looking them up was half of making a record.
    logging.logThreads = logging.logProcesses = logging.logMultiprocessing = False
    # Nor the caller's file and line (the logging HOWTO's "Optimization"): each record walked the stack for them.
    logging._srcfile = None
    records: queue.SimpleQueue[logging.LogRecord | None] = queue.SimpleQueue()
    listener = BatchingListener(records, handler)
    listener.start()
    atexit.register(_drain, listener)  # writes what is queued before the process exits
    root = logging.getLogger()
    root.handlers[:] = [StampingQueueHandler(records)]
    root.setLevel(level.upper())
    # httpx logs every upstream call at info: a miss's own access line says it went upstream.
    logging.getLogger("httpx").setLevel(max(logging.WARNING, root.level))
    uvicorn_access = logging.getLogger("uvicorn.access")
    uvicorn_access.filters[:] = [f for f in uvicorn_access.filters if not isinstance(f, CoveredRoutes)]
    uvicorn_access.addFilter(CoveredRoutes())
    return listener


class BatchingListener(QueueListener):
    """A `QueueListener` that writes what has queued up in one write: under load, one flush (a system call)
    per batch of lines instead of per line (a tenth of an exact hit's CPU went to flushing its line)."""

    MAX_BATCH = 64

    def __init__(
        self, records: queue.SimpleQueue[logging.LogRecord | None], handler: logging.StreamHandler[Any]
    ):
        super().__init__(records, handler)
        self.records = records
        self.stream_handler = handler

    def _monitor(self) -> None:
        """Until the sentinel (None, `QueueListener.stop`): wait for a record, take what queued behind it."""
        while True:
            batch = [self.records.get()]
            while batch[-1] is not None and len(batch) < self.MAX_BATCH:
                try:
                    batch.append(self.records.get_nowait())
                except queue.Empty:
                    break
            lines = [self._line(self.stream_handler, record) for record in batch if record is not None]
            text = "".join(line for line in lines if line is not None)
            if text:
                with contextlib.suppress(Exception):  # as logging does: a failed write never stops the writer
                    self.stream_handler.stream.write(text)
                    self.stream_handler.flush()
            if batch[-1] is None:
                return

    @staticmethod
    def _line(handler: logging.StreamHandler[Any], record: logging.LogRecord) -> str | None:
        if record.levelno < handler.level or not handler.filter(record):
            return None
        try:
            return handler.format(record) + handler.terminator
        except Exception:
            handler.handleError(record)
            return None


def _drain(listener: QueueListener) -> None:
    with contextlib.suppress(AttributeError):  # already stopped: `stop()` is not idempotent before 3.12
        listener.stop()


class CoveredRoutes(logging.Filter):
    """Drops uvicorn's access line for the completion routes: kvgate's own line (`log_request`) says more."""

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args
        path = args[2] if isinstance(args, tuple) and len(args) >= 3 else None
        return not (isinstance(path, str) and path.startswith(COMPLETION_PATHS))


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
    if not access_logger.isEnabledFor(logging.INFO):  # KVGATE_LOG_LEVEL above info: build nothing
        return
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
