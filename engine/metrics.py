"""Engine counters, gauges and latency histograms, as plain data the gateway exports to Prometheus.

The step loop records into one `EngineMetrics` (under a lock: it runs on the engine thread while the
gateway reads from the event loop); `snapshot()` returns a frozen `EngineStats`. Meanings follow vLLM's:
  - prefix-cache queries / hits count prompt *tokens* looked up / found cached at admission;
  - KV usage is the fraction of KV blocks held by live sequences (cached-but-free blocks count as free);
  - time to first token runs from the request's arrival at the engine to its first sampled token;
  - inter-token latency is the time between consecutive output tokens of one request.
`EngineCollector` turns snapshots into Prometheus families at scrape time, on a registry the gateway
passes in; this module registers nothing globally.
"""

from __future__ import annotations

import bisect
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.registry import Collector, CollectorRegistry

# vLLM's bucket boundaries (seconds), so dashboards built for vLLM read ours the same way.
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0)
ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0)


@dataclass(slots=True)
class Histogram:
    """Cumulative-bucket histogram: `counts[i]` observations <= `buckets[i]`, the last one is +Inf."""

    buckets: tuple[float, ...]
    counts: list[int] = field(default_factory=list)
    total: float = 0.0
    count: int = 0

    def __post_init__(self) -> None:
        if not self.counts:
            self.counts = [0] * (len(self.buckets) + 1)

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.buckets, value)] += 1
        self.total += value
        self.count += 1

    def copy(self) -> Histogram:
        return Histogram(self.buckets, list(self.counts), self.total, self.count)

    def cumulative(self) -> list[tuple[str, int]]:
        """(upper bound, observations <= it) pairs, ending with "+Inf", as Prometheus wants them."""
        pairs, running = [], 0
        for bound, count in zip([*map(str, self.buckets), "+Inf"], self.counts, strict=True):
            running += count
            pairs.append((bound, running))
        return pairs


@dataclass(frozen=True, slots=True)
class EngineStats:
    """One consistent reading of the engine's metrics."""

    num_running: int
    num_waiting: int
    kv_cache_usage: float
    prefix_cache_queries: int
    prefix_cache_hits: int
    num_preemptions: int
    prompt_tokens: int
    generation_tokens: int
    finished: dict[str, int]
    """Finished requests by finish reason ("stop", "length", "abort")."""
    time_to_first_token: Histogram
    inter_token_latency: Histogram

    @property
    def prefix_cache_hit_rate(self) -> float:
        return self.prefix_cache_hits / self.prefix_cache_queries if self.prefix_cache_queries else 0.0


class EngineMetrics:
    """What the step loop records. Thread-safe; cheap enough to call every step."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._gauges = (0, 0, 0.0)
        self._prefix = (0, 0)
        self._num_preemptions = 0
        self._prompt_tokens = 0
        self._generation_tokens = 0
        self._finished: dict[str, int] = {}
        self._ttft = Histogram(TTFT_BUCKETS)
        self._itl = Histogram(ITL_BUCKETS)

    def record_step(
        self,
        num_running: int,
        num_waiting: int,
        kv_cache_usage: float,
        prefix_cache_queries: int,
        prefix_cache_hits: int,
        num_preemptions: int,
    ) -> None:
        """Gauges and the block manager's cumulative counters after a step."""
        with self._lock:
            self._gauges = (num_running, num_waiting, kv_cache_usage)
            self._prefix = (prefix_cache_queries, prefix_cache_hits)
            self._num_preemptions = num_preemptions

    def record_token(self, time_to_first_token: float | None, inter_token_latency: float | None) -> None:
        """One output token: its request's TTFT if it is the first, else the gap since the previous one."""
        with self._lock:
            self._generation_tokens += 1
            if time_to_first_token is not None:
                self._ttft.observe(time_to_first_token)
            if inter_token_latency is not None:
                self._itl.observe(inter_token_latency)

    def record_finished(self, finish_reason: str, num_prompt_tokens: int) -> None:
        with self._lock:
            self._finished[finish_reason] = self._finished.get(finish_reason, 0) + 1
            self._prompt_tokens += num_prompt_tokens

    def snapshot(self) -> EngineStats:
        with self._lock:
            return EngineStats(
                *self._gauges,
                *self._prefix,
                num_preemptions=self._num_preemptions,
                prompt_tokens=self._prompt_tokens,
                generation_tokens=self._generation_tokens,
                finished=dict(self._finished),
                time_to_first_token=self._ttft.copy(),
                inter_token_latency=self._itl.copy(),
            )


class EngineCollector(Collector):
    """Prometheus families read from `snapshot()` at scrape time: `registry.register(EngineCollector(...))`."""

    def __init__(self, snapshot: Callable[[], EngineStats], prefix: str = "kvgate_engine") -> None:
        self._snapshot = snapshot
        self._prefix = prefix

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily | HistogramMetricFamily]:
        stats, name = self._snapshot(), self._prefix
        yield GaugeMetricFamily(
            f"{name}_num_requests_running", "Requests holding KV blocks.", stats.num_running
        )
        yield GaugeMetricFamily(f"{name}_num_requests_waiting", "Requests queued.", stats.num_waiting)
        yield GaugeMetricFamily(
            f"{name}_kv_cache_usage_perc", "Fraction of KV blocks in use (1 = full).", stats.kv_cache_usage
        )
        counters = [
            (
                "prefix_cache_queries",
                "Prompt tokens looked up in the prefix cache.",
                stats.prefix_cache_queries,
            ),
            ("prefix_cache_hits", "Prompt tokens served from the prefix cache.", stats.prefix_cache_hits),
            ("num_preemptions", "Running requests preempted for KV blocks.", stats.num_preemptions),
            ("prompt_tokens", "Prompt tokens of finished requests.", stats.prompt_tokens),
            ("generation_tokens", "Output tokens sampled.", stats.generation_tokens),
        ]
        for suffix, documentation, value in counters:
            yield CounterMetricFamily(f"{name}_{suffix}", documentation, value)
        finished = CounterMetricFamily(
            f"{name}_request_success", "Finished requests.", labels=["finished_reason"]
        )
        for reason, count in sorted(stats.finished.items()):
            finished.add_metric([reason], count)
        yield finished
        for suffix, documentation, histogram in [
            ("time_to_first_token_seconds", "Arrival to first output token.", stats.time_to_first_token),
            ("inter_token_latency_seconds", "Time between output tokens.", stats.inter_token_latency),
        ]:
            yield HistogramMetricFamily(
                f"{name}_{suffix}", documentation, buckets=histogram.cumulative(), sum_value=histogram.total
            )


def register_engine_metrics(
    registry: CollectorRegistry, snapshot: Callable[[], EngineStats]
) -> EngineCollector:
    """Export the engine's metrics on `registry` (the gateway's), read fresh on every scrape."""
    collector = EngineCollector(snapshot)
    registry.register(collector)
    return collector
