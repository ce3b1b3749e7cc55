"""Prometheus metrics for `/metrics`, on a registry of the app's own (no import-time globals).

Label sets are bounded: `tenant` comes from the configured key ring (or `default`), `model` from the
backend's served models (unknown models are refused before anything is recorded), `cache` from four
values. No prompt text, key or entry id is ever a label.

Behind `kvgate serve --workers N` every worker writes its series to files in one directory
(prometheus-client's multiprocess mode, switched on by `PROMETHEUS_MULTIPROC_DIR` in the worker's
environment) and a scrape on any worker reads them all: counters and histograms add up, each gauge is
combined as its `multiprocess_mode` says. `scrape` is the registry to expose (and to read back for the
report): this process's own in a single process, the directory's collector with workers.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.multiprocess import MultiProcessCollector

LATENCY_BUCKETS = (0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
SIMILARITY_BUCKETS = tuple(round(0.5 + 0.025 * step, 3) for step in range(21))


class GatewayMetrics:
    """The gateway's own series; the engine's are added by the engine backend on the same registry."""

    def __init__(
        self, registry: CollectorRegistry | None = None, multiprocess_dir: Path | None = None
    ) -> None:
        self.registry = registry or CollectorRegistry()
        """This process's series."""
        self.scrape = self.registry
        """What `/metrics` exposes; with workers, every worker's series read from `multiprocess_dir`."""
        if multiprocess_dir is not None:
            self.scrape = CollectorRegistry()
            MultiProcessCollector(self.scrape, path=str(multiprocess_dir))  # type: ignore[no-untyped-call]
        self._multiprocess = multiprocess_dir is not None
        self._watched: tuple[Callable[[], int], Callable[[], int]] | None = None
        self.requests = Counter(
            "kvgate_requests",
            "Completion requests by route, tenant, model and cache result.",
            ["route", "tenant", "model", "cache"],
            registry=self.registry,
        )
        self.requests_by_language = Counter(
            "kvgate_requests_by_language",
            "Requests by the language of the prompt (ISO 639-1; zxx: no text read) and cache result.",
            ["language", "cache"],
            registry=self.registry,
        )
        self.request_seconds = Histogram(
            "kvgate_request_duration_seconds",
            "End-to-end time to the complete response (JSON) or to the response headers (SSE).",
            ["route", "cache"],
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.errors = Counter(
            "kvgate_request_errors",
            "Answers that were errors (4xx, 5xx, 429, 503), by route and status.",
            ["route", "status"],
            registry=self.registry,
        )
        self.lookup_seconds = Histogram(
            "kvgate_cache_lookup_seconds",
            "Cache lookup time (exact + semantic), including embedding.",
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.embed_seconds = Histogram(
            "kvgate_embedding_seconds",
            "Time spent embedding the prompt during a lookup.",
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.similarity = Histogram(
            "kvgate_best_candidate_similarity",
            "Cosine similarity of the nearest stored prompt, for semantic hits and for misses.",
            ["result"],
            buckets=SIMILARITY_BUCKETS,
            registry=self.registry,
        )
        self.tokens_saved = Counter(
            "kvgate_tokens_saved",
            "Prompt + completion tokens answered from the cache.",
            registry=self.registry,
        )
        self.seconds_saved = Counter(
            "kvgate_generation_seconds_saved",
            "Generation time the cached answers originally took.",
            registry=self.registry,
        )
        self.pending = Gauge(
            "kvgate_pending_generations",
            "Generations in flight (summed over workers).",
            registry=self.registry,
            multiprocess_mode="livesum",
        )
        self.store_up = Gauge(
            "kvgate_store_up",
            "1 when the last cache store operation succeeded (on every worker).",
            registry=self.registry,
            multiprocess_mode="livemin",
        )
        self.store_up.set(1)
        self.rate_limited = Counter(
            "kvgate_rate_limited",
            "Requests refused with 429 by the per-tenant rate limiter.",
            ["tenant"],
            registry=self.registry,
        )
        self.index_vectors = Gauge(
            "kvgate_semantic_index_vectors",
            "Vectors in the semantic index (every scope; each worker holds a copy), read at scrape time.",
            registry=self.registry,
            multiprocess_mode="livemax",
        )
        self.index_rebuilds_running = Gauge(
            "kvgate_semantic_index_rebuilds_running",
            "Scope rebuilds (flat to HNSW, dropping tombstones) running in the background now.",
            registry=self.registry,
            multiprocess_mode="livesum",
        )
        self.breaker_state = Gauge(
            "kvgate_breaker_state",
            "Circuit breaker state: 0 closed, 1 half-open, 2 open (the worst worker's).",
            ["breaker"],
            registry=self.registry,
            multiprocess_mode="livemax",
        )

    def watch_index(self, vectors: Callable[[], int], rebuilds_running: Callable[[], int]) -> None:
        """Read the semantic index's size and background rebuilds at each scrape (with workers: at each
        `refresh()`, since a scrape on one worker reads the others' values from their files)."""
        if self._multiprocess:
            self._watched = (vectors, rebuilds_running)
            self.refresh()
            return
        self.index_vectors.set_function(vectors)
        self.index_rebuilds_running.set_function(rebuilds_running)

    def refresh(self) -> None:
        """Write the watched values to this worker's files (a no-op in a single process)."""
        if self._watched is not None:
            vectors, rebuilds_running = self._watched
            self.index_vectors.set(vectors())
            self.index_rebuilds_running.set(rebuilds_running())
