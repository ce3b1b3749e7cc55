"""What is counted per backend, and how `/metrics` exports it.

Each member keeps plain counters (`MemberStats`); a collector reads them at scrape time, as the engine's
series are read (`engine.register_engine_metrics`), so the routing path never touches prometheus-client.
Labels are the pool (a configured model name, or `default`) and the member's name (`host:port`): bounded
by the configuration and by what discovery resolves.

Cached tokens are what the backend says it reused: `usage.prompt_tokens_details.cached_tokens` (vLLM,
SGLang, OpenAI, kvgate's engine) or llama-server's `timings.cache_n`.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.registry import Collector

from gateway.observability.metrics import LATENCY_BUCKETS
from gateway.observability.shadow import ShadowStats


@dataclass(slots=True)
class MemberStats:
    """One member's counters since it joined."""

    requests: int = 0
    errors: int = 0
    failovers: int = 0
    """Requests that failed here before their answer began and went on to another member."""
    in_flight: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0
    reports_cache: bool = False
    """It said at least once how many prompt tokens it reused (so a 0 from it means none)."""
    seconds_sum: float = 0.0
    buckets: list[int] = field(default_factory=lambda: [0] * (len(LATENCY_BUCKETS) + 1))
    shadow: ShadowStats | None = None
    """Set on a shadow member: how its answers compared with the ones served."""
    shadow_errors: int = 0

    def record(self, seconds: float, *, failed: bool) -> None:
        self.requests += 1
        self.errors += failed
        self.seconds_sum += seconds
        self.buckets[bisect.bisect_left(LATENCY_BUCKETS, seconds)] += 1

    def record_tokens(self, prompt_tokens: int, cached_tokens: int | None) -> None:
        self.prompt_tokens += prompt_tokens
        if cached_tokens is not None:
            self.reports_cache = True
            self.cached_tokens += cached_tokens

    def describe(self) -> dict[str, Any]:
        described: dict[str, Any] = {
            "requests": self.requests,
            "errors": self.errors,
            "failovers": self.failovers,
            "prompt_tokens": self.prompt_tokens,
            "cached_tokens": self.cached_tokens if self.reports_cache else None,
            "mean_seconds": round(self.seconds_sum / self.requests, 4) if self.requests else None,
        }
        if self.shadow is not None:
            described["shadow_answers"] = self.shadow.report() | {"errors": self.shadow_errors}
        return described


@dataclass(frozen=True, slots=True)
class MemberRow:
    """One member as a scrape reads it."""

    pool: str
    name: str
    stats: MemberStats
    routable: bool
    ejections: int


# name, kind, help, value: each per-backend counter and gauge, read from a row
SERIES: tuple[tuple[str, str, str, Callable[[MemberRow], float]], ...] = (
    ("requests", "counter", "Requests a backend answered or failed.", lambda row: row.stats.requests),
    (
        "errors",
        "counter",
        "Requests a backend failed (connection, timeout, 5xx).",
        lambda row: row.stats.errors,
    ),
    (
        "failovers",
        "counter",
        "Requests that failed on a backend before their answer began and went to another.",
        lambda row: row.stats.failovers,
    ),
    ("ejections", "counter", "Times a backend was taken out of its pool.", lambda row: row.ejections),
    ("prompt_tokens", "counter", "Prompt tokens a backend was sent.", lambda row: row.stats.prompt_tokens),
    (
        "cached_tokens",
        "counter",
        "Prompt tokens a backend reported reusing from its KV cache.",
        lambda row: row.stats.cached_tokens,
    ),
    ("in_flight", "gauge", "Requests a backend is answering now.", lambda row: row.stats.in_flight),
    (
        "up",
        "gauge",
        "1 while a backend is in its pool's rotation, 0 while ejected.",
        lambda row: float(row.routable),
    ),
)
LABELS = ["pool", "backend"]


class FleetCollector(Collector):
    """Per-backend series, read from the members at each scrape."""

    def __init__(self, rows: Callable[[], Sequence[MemberRow]]) -> None:
        self._rows = rows

    def collect(self) -> Iterator[Any]:
        rows = list(self._rows())
        for name, kind, help_text, value in SERIES:
            family_type = CounterMetricFamily if kind == "counter" else GaugeMetricFamily
            family = family_type(f"kvgate_backend_{name}", help_text, labels=LABELS)
            for row in rows:
                family.add_metric([row.pool, row.name], value(row))
            yield family
        seconds = HistogramMetricFamily(
            "kvgate_backend_request_duration_seconds",
            "Time from sending a request to a backend to its last byte.",
            labels=LABELS,
        )
        for row in rows:
            cumulative: list[tuple[str, float]] = []
            running = 0
            for bound, count in zip([*map(str, LATENCY_BUCKETS), "+Inf"], row.stats.buckets, strict=True):
                running += count
                cumulative.append((bound, running))
            seconds.add_metric([row.pool, row.name], cumulative, row.stats.seconds_sum)
        yield seconds
