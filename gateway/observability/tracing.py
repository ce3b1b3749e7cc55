"""OpenTelemetry spans for completion requests, following the GenAI semantic conventions.

Off unless `KVGATE_OTLP_ENDPOINT` is set (then spans go to that OTLP/HTTP collector in batches). The span
of a request is named `chat <model>` or `text_completion <model>` and carries `gen_ai.*` attributes plus
kvgate's own (`kvgate.cache.result`, `kvgate.cache.similarity`). No prompt or answer text is recorded.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from opentelemetry import context as context_api
from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.trace import (
    INVALID_SPAN,
    NonRecordingSpan,
    Span,
    SpanContext,
    SpanKind,
    TraceFlags,
    Tracer,
)

from gateway.observability.tracecontext import TraceContext, current_trace

_INSTRUMENTATION = "kvgate.gateway"


class Tracing:
    """A tracer of kvgate's own (never the global provider, so tests and embedders stay isolated)."""

    def __init__(self, processor: SpanProcessor | None) -> None:
        self.enabled = processor is not None
        self._provider: TracerProvider | None = None
        if processor is not None:
            self._provider = TracerProvider(resource=Resource.create({"service.name": "kvgate"}))
            self._provider.add_span_processor(processor)
            self._tracer: Tracer = self._provider.get_tracer(_INSTRUMENTATION)
        else:
            self._tracer = trace.NoOpTracer()

    @classmethod
    def from_endpoint(cls, endpoint: str | None) -> Tracing:
        if not endpoint:
            return cls(None)
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        return cls(BatchSpanProcessor(OTLPSpanExporter(endpoint=endpoint.rstrip("/") + "/v1/traces")))

    @contextmanager
    def completion_span(self, operation: str, model: str, request: dict[str, Any]) -> Iterator[Span]:
        if not self.enabled:  # nothing records it: skip building the attributes and the no-op span
            yield INVALID_SPAN
            return
        attributes = {
            "gen_ai.operation.name": operation,
            "gen_ai.system": "kvgate",
            "gen_ai.request.model": model,
            **{f"gen_ai.request.{key}": value for key, value in request.items() if value is not None},
        }
        with self._tracer.start_as_current_span(
            f"{operation} {model}",
            context=_parent(current_trace.get()),
            kind=SpanKind.SERVER,
            attributes=attributes,
        ) as span:
            ids = span.get_span_context()
            if not ids.is_valid:  # tracing off: logs keep the client's (or a fresh) trace id
                yield span
                return
            token = current_trace.set(
                TraceContext(
                    format(ids.trace_id, "032x"), format(ids.span_id, "016x"), f"{int(ids.trace_flags):02x}"
                )
            )
            try:
                yield span
            finally:
                current_trace.reset(token)

    def shutdown(self) -> None:
        if self._provider is not None:
            self._provider.shutdown()


def _parent(client: TraceContext | None) -> context_api.Context | None:
    """The client's span as the remote parent, so kvgate's span continues the client's trace."""
    if client is None or not client.from_client:
        return None
    remote = SpanContext(
        int(client.trace_id, 16),
        int(client.span_id, 16),
        is_remote=True,
        trace_flags=TraceFlags(int(client.flags, 16)),
    )
    return trace.set_span_in_context(NonRecordingSpan(remote))
