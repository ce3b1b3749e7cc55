"""Hit-rate bookkeeping behind `/admin/stats`: counts by tenant, model, route, prompt language and cache
result, since start and over the last hour (one-minute buckets), plus the tokens and engine seconds that hits
saved, and the hits reported wrong or right (`/admin/feedback`).

One process's view; behind `kvgate serve --workers N` the route merges every worker's (`export` /
`merged`). `/metrics` carries the same counts for Prometheus to sum across replicas.
"""

from __future__ import annotations

import time
from collections import Counter, defaultdict, deque
from dataclasses import dataclass, field
from typing import Any

from gateway.observability.report_stats import ScopeHits

RESULTS = ("exact_hit", "semantic_hit", "miss", "bypass")
VERDICTS = ("wrong", "right")
# The language of a request whose text was not read (a pass-through route): ISO 639-2's "no linguistic
# content", the code `semantic.guards.language` gives a prompt without letters.
NO_LANGUAGE = "zxx"
# tenant, model, route, language
Key = tuple[str, str, str, str]
_BUCKET_S = 60
_WINDOW_BUCKETS = 60


@dataclass(slots=True)
class Tally:
    results: Counter[str] = field(default_factory=Counter)
    tokens_saved: int = 0
    seconds_saved: float = 0.0
    feedback: Counter[str] = field(default_factory=Counter)  # reported hits by verdict: not requests

    def add(self, result: str, tokens_saved: int, seconds_saved: float) -> None:
        self.results[result] += 1
        self.tokens_saved += tokens_saved
        self.seconds_saved += seconds_saved

    def merge(self, other: Tally) -> None:
        self.results.update(other.results)
        self.tokens_saved += other.tokens_saved
        self.seconds_saved += other.seconds_saved
        self.feedback.update(other.feedback)

    def export(self) -> dict[str, Any]:
        return {
            "results": dict(self.results),
            "tokens_saved": self.tokens_saved,
            "seconds_saved": self.seconds_saved,
            "feedback": dict(self.feedback),
        }

    @classmethod
    def from_export(cls, data: dict[str, Any]) -> Tally:
        results = Counter({str(key): int(value) for key, value in data["results"].items()})
        feedback = Counter({str(key): int(value) for key, value in data.get("feedback", {}).items()})
        return cls(results, int(data["tokens_saved"]), float(data["seconds_saved"]), feedback)

    def report(self) -> dict[str, Any]:
        total = sum(self.results.values())
        counts = {result: self.results.get(result, 0) for result in RESULTS}
        hits = counts["exact_hit"] + counts["semantic_hit"]
        return {
            "requests": total,
            **counts,
            "hit_rate": hits / total if total else 0.0,
            "exact_hit_rate": counts["exact_hit"] / total if total else 0.0,
            "semantic_hit_rate": counts["semantic_hit"] / total if total else 0.0,
            "tokens_saved": self.tokens_saved,
            "seconds_saved": round(self.seconds_saved, 3),
            **{f"feedback_{verdict}": self.feedback.get(verdict, 0) for verdict in VERDICTS},
        }


class HitStats:
    """Counts of cache results; `record` is O(1), `report` walks at most an hour of minute buckets."""

    def __init__(self, clock: Any = time.time) -> None:
        self._clock = clock
        self.started = clock()
        self._since_start: dict[Key, Tally] = defaultdict(Tally)
        self._buckets: deque[tuple[int, dict[Key, Tally]]] = deque()
        self.scopes = ScopeHits()

    def record(
        self,
        tenant: str,
        model: str,
        result: str,
        tokens_saved: int = 0,
        seconds_saved: float = 0.0,
        scope_id: str | None = None,
        route: str = "chat",
        language: str = NO_LANGUAGE,
    ) -> None:
        key = (tenant, model, route, language)
        if scope_id is not None and result in ("exact_hit", "semantic_hit"):
            self.scopes.add(scope_id, tenant, model, result)
        self._since_start[key].add(result, tokens_saved, seconds_saved)
        self._current_bucket()[key].add(result, tokens_saved, seconds_saved)

    def record_feedback(self, tenant: str, model: str, route: str, language: str, verdict: str) -> None:
        """A served hit reported `wrong` or `right`, counted under the request it was served for."""
        if verdict not in VERDICTS:
            raise ValueError(f"verdict must be one of {VERDICTS}, got {verdict!r}")
        key = (tenant, model, route, language)
        self._since_start[key].feedback[verdict] += 1
        self._current_bucket()[key].feedback[verdict] += 1

    def report(self, tenant: str | None = None) -> dict[str, Any]:
        """Overall, per tenant, model, route and language; `tenant` restricts every section to one tenant."""
        minute = int(self._clock() // _BUCKET_S)
        self._drop_old(minute)
        last_hour: dict[Key, Tally] = defaultdict(Tally)
        timeline = []
        for bucket_minute, bucket in self._buckets:
            point = Tally()
            for key, tally in bucket.items():
                if tenant is None or key[0] == tenant:
                    last_hour[key].merge(tally)
                    point.merge(tally)
            timeline.append({"minute": bucket_minute * _BUCKET_S, **point.report()})
        return {
            "uptime_s": round(self._clock() - self.started, 1),
            "since_start": _sections(self._since_start, tenant),
            "last_hour": _sections(last_hour, tenant),
            "timeline": timeline,
            "top_scopes": self.scopes.top(tenant),
        }

    def export(self) -> dict[str, Any]:
        """Everything `report` reads, as JSON-ready data (a worker sends it to the one asked for stats)."""
        return {
            "started": self.started,
            "since_start": _export_tallies(self._since_start),
            "buckets": [[minute, _export_tallies(bucket)] for minute, bucket in self._buckets],
            "scopes": self.scopes.export(),
        }

    @classmethod
    def merged(cls, exports: list[dict[str, Any]], clock: Any = time.time) -> HitStats:
        """One `HitStats` counting what every exporter counted (uptime from the earliest start)."""
        stats = cls(clock)
        by_minute: dict[int, dict[Key, Tally]] = {}
        for data in exports:
            stats.started = min(stats.started, float(data["started"]))
            _merge_tallies(stats._since_start, data["since_start"])
            for minute, tallies in data["buckets"]:
                _merge_tallies(by_minute.setdefault(int(minute), defaultdict(Tally)), tallies)
            stats.scopes.merge(data["scopes"])
        stats._buckets.extend(sorted(by_minute.items()))
        return stats

    def _current_bucket(self) -> dict[Key, Tally]:
        minute = int(self._clock() // _BUCKET_S)
        if not self._buckets or self._buckets[-1][0] != minute:
            self._buckets.append((minute, defaultdict(Tally)))
        self._drop_old(minute)
        return self._buckets[-1][1]

    def _drop_old(self, minute: int) -> None:
        while self._buckets and self._buckets[0][0] <= minute - _WINDOW_BUCKETS:
            self._buckets.popleft()


def _export_tallies(tallies: dict[Key, Tally]) -> list[list[Any]]:
    return [[*key, tally.export()] for key, tally in tallies.items()]


def _merge_tallies(into: dict[Key, Tally], exported: list[list[Any]]) -> None:
    for tenant, model, route, language, data in exported:
        key = (str(tenant), str(model), str(route), str(language))
        if key not in into:
            into[key] = Tally()
        into[key].merge(Tally.from_export(data))


def _sections(tallies: dict[Key, Tally], tenant: str | None) -> dict[str, Any]:
    overall = Tally()
    by_tenant: defaultdict[str, Tally] = defaultdict(Tally)
    by_model: defaultdict[str, Tally] = defaultdict(Tally)
    by_route: defaultdict[str, Tally] = defaultdict(Tally)
    by_language: defaultdict[str, Tally] = defaultdict(Tally)
    for (tenant_name, model, route, language), tally in tallies.items():
        if tenant is not None and tenant_name != tenant:
            continue
        overall.merge(tally)
        by_tenant[tenant_name].merge(tally)
        by_model[model].merge(tally)
        by_route[route].merge(tally)
        by_language[language].merge(tally)
    return {
        "overall": overall.report(),
        "by_tenant": {name: tally.report() for name, tally in sorted(by_tenant.items())},
        "by_model": {name: tally.report() for name, tally in sorted(by_model.items())},
        "by_route": {name: tally.report() for name, tally in sorted(by_route.items())},
        "by_language": {name: tally.report() for name, tally in sorted(by_language.items())},
    }
