"""One completion request's outcome, counted: the hit-rate stats (the report) and the Prometheus series."""

from __future__ import annotations

from gateway.observability.metrics import GatewayMetrics
from gateway.observability.stats import HitStats
from semantic import Lookup, LookupKind, RequestScope, language_of


def record_outcome(
    stats: HitStats,
    metrics: GatewayMetrics,
    tenant: str,
    scope: RequestScope,
    lookup: Lookup | None,
    result: str,
    saved: tuple[int, float] | None = None,
) -> None:
    """`result` is a lookup kind's value (`exact_hit`, `semantic_hit`, `miss`, `bypass`); `saved` is a hit's
    (tokens, generation seconds) the cache saved."""
    tokens, seconds = saved if saved is not None else (0, 0.0)
    # The lookup read the prompt's language already (`language_of` keeps the last 65,536 texts'), and an
    # exact hit's prompt was read when it missed: a dictionary lookup on the hit path.
    language = language_of(scope.prompt)
    stats.record(
        tenant,
        scope.model,
        result,
        tokens,
        seconds,
        scope_id=scope.scope_id,
        route=scope.endpoint,
        language=language,
    )
    metrics.requests.labels(scope.endpoint, tenant, scope.model, result).inc()
    metrics.requests_by_language.labels(language, result).inc()
    if saved is not None:
        metrics.tokens_saved.inc(tokens)
        metrics.seconds_saved.inc(seconds)
    if lookup is not None and lookup.kind is not LookupKind.BYPASS:
        metrics.lookup_seconds.observe(lookup.total_ms / 1000.0)
        if lookup.embed_ms:
            metrics.embed_seconds.observe(lookup.embed_ms / 1000.0)
        if lookup.similarity is not None and lookup.kind is not LookupKind.EXACT_HIT:
            label = "hit" if lookup.kind is LookupKind.SEMANTIC_HIT else "miss"
            metrics.similarity.labels(label).observe(lookup.similarity)
