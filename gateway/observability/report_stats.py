"""What the hit-rate report reads beyond `HitStats`' tallies: top scopes by hits, the best-candidate
similarity histogram with the rule's threshold, and the engine's prefix-cache token hit rate.

The histogram and the prefix-cache counters are read back from the app's Prometheus registry, so
`/admin/stats` and `/metrics` can never disagree; the top scopes are a bounded counter kept by
`HitStats`. Knows nothing about HTTP or rendering.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from prometheus_client import CollectorRegistry

SIMILARITY_METRIC = "kvgate_best_candidate_similarity"
PREFIX_QUERIES_METRIC = "kvgate_engine_prefix_cache_queries"
PREFIX_HITS_METRIC = "kvgate_engine_prefix_cache_hits"
SCOPE_ID_SHOWN = 12  # scope ids are keyed digests: a prefix tells scopes apart without exposing one
TOP_SCOPES = 20
SCOPE_CAPACITY = 256


@dataclass(slots=True)
class ScopeCount:
    tenant: str
    model: str
    exact_hit: int = 0
    semantic_hit: int = 0
    overcount: int = 0  # hits inherited from the scope this one replaced (Space-Saving's error bound)

    @property
    def hits(self) -> int:
        return self.exact_hit + self.semantic_hit + self.overcount


class ScopeHits:
    """Hits per scope, in at most `capacity` counters (Space-Saving): exact while fewer scopes than that
    have hits; beyond it a new scope takes over the smallest counter, so the heavy scopes stay counted.
    """

    def __init__(self, capacity: int = SCOPE_CAPACITY) -> None:
        if capacity <= 0:
            raise ValueError("capacity must be positive")
        self.capacity = capacity
        self._counts: dict[str, ScopeCount] = {}

    def add(self, scope_id: str, tenant: str, model: str, result: str) -> None:
        count = self._counts.get(scope_id)
        if count is None:
            count = ScopeCount(tenant, model)
            if len(self._counts) >= self.capacity:
                # O(capacity), only when a new scope arrives at a full table.
                smallest = min(self._counts, key=lambda key: self._counts[key].hits)
                count.overcount = self._counts.pop(smallest).hits
            self._counts[scope_id] = count
        if result == "exact_hit":
            count.exact_hit += 1
        else:
            count.semantic_hit += 1

    def export(self) -> list[list[Any]]:
        return [
            [scope_id, count.tenant, count.model, count.exact_hit, count.semantic_hit, count.overcount]
            for scope_id, count in self._counts.items()
        ]

    def merge(self, exported: list[list[Any]]) -> None:
        """Add another counter table's counts (a worker's); beyond `capacity` the smallest scopes go."""
        for scope_id, tenant, model, exact_hit, semantic_hit, overcount in exported:
            count = self._counts.setdefault(str(scope_id), ScopeCount(str(tenant), str(model)))
            count.exact_hit += int(exact_hit)
            count.semantic_hit += int(semantic_hit)
            count.overcount += int(overcount)
        if len(self._counts) > self.capacity:
            ranked = sorted(self._counts.items(), key=lambda item: (-item[1].hits, item[0]))
            self._counts = dict(ranked[: self.capacity])

    def top(self, tenant: str | None = None, limit: int = TOP_SCOPES) -> list[dict[str, Any]]:
        """The `limit` scopes with most hits (ties by scope id), optionally of one tenant only."""
        ranked = sorted(
            (item for item in self._counts.items() if tenant is None or item[1].tenant == tenant),
            key=lambda item: (-item[1].hits, item[0]),
        )
        return [
            {
                "tenant": count.tenant,
                "model": count.model,
                "scope": scope_id[:SCOPE_ID_SHOWN],
                "hits": count.hits,
                "exact_hit": count.exact_hit,
                "semantic_hit": count.semantic_hit,
            }
            for scope_id, count in ranked[:limit]
        ]


def similarity_histogram(registry: CollectorRegistry) -> dict[str, Any]:
    """Per-bucket (not cumulative) counts of the best candidate's similarity, for hits and for misses.

    `buckets[i]` is bucket i's upper bound (`null` for +Inf); all tenants together (the series has no
    tenant label).
    """
    cumulative: dict[str, dict[float, float]] = {"hit": {}, "miss": {}}
    for family in registry.collect():
        if family.name != SIMILARITY_METRIC:
            continue
        for sample in family.samples:
            result = sample.labels.get("result")
            if sample.name.endswith("_bucket") and result in cumulative:
                cumulative[result][float(sample.labels["le"])] = sample.value
    bounds = sorted(set(cumulative["hit"]) | set(cumulative["miss"]))
    return {
        "buckets": [None if math.isinf(bound) else bound for bound in bounds],
        "hit": _per_bucket(cumulative["hit"], bounds),
        "miss": _per_bucket(cumulative["miss"], bounds),
    }


def prefix_cache(registry: CollectorRegistry) -> dict[str, Any] | None:
    """The engine's prefix-cache lookups in prompt tokens; `None` when the backend is not the engine."""
    queries = registry.get_sample_value(f"{PREFIX_QUERIES_METRIC}_total")
    hits = registry.get_sample_value(f"{PREFIX_HITS_METRIC}_total")
    if queries is None or hits is None:
        return None
    return {
        "query_tokens": int(queries),
        "hit_tokens": int(hits),
        "hit_rate": hits / queries if queries else 0.0,
    }


def rule_summary(rule: object) -> dict[str, Any]:
    """The decision rule's name and the cosine its hits must reach, plus its target where it has one.

    A plain threshold rule has `threshold`; the calibrated rule gates on `calibration.low_cosine` and
    aims at `target_false_hit_rate`. Read by attribute so any `HitRule` can be described.
    """
    threshold = getattr(rule, "threshold", None)
    threshold_kind = "cosine threshold"
    if threshold is None:
        threshold = getattr(getattr(rule, "calibration", None), "low_cosine", None)
        threshold_kind = "cosine gate"
    target = getattr(rule, "target_false_hit_rate", None)
    return {
        "name": str(getattr(rule, "name", type(rule).__name__)),
        "threshold": float(threshold) if isinstance(threshold, int | float) else None,
        "threshold_kind": threshold_kind if threshold is not None else None,
        "target_false_hit_rate": float(target) if isinstance(target, int | float) else None,
    }


def _per_bucket(cumulative: dict[float, float], bounds: list[float]) -> list[int]:
    counts, below = [], 0.0
    for bound in bounds:
        value = cumulative.get(bound, below)
        counts.append(int(value - below))
        below = value
    return counts
