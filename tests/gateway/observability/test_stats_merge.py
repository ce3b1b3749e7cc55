"""`/admin/stats` behind several workers: the report of merged workers' tallies equals the report of one
process that saw all of their traffic (since start, last hour, timeline, top scopes, shadow counts, hits
reported wrong or right)."""

from __future__ import annotations

import json
import random

from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.observability.report_stats import ScopeHits
from gateway.observability.shadow import ShadowStats
from gateway.observability.stats import RESULTS, VERDICTS, HitStats

TENANTS = ("team-a", "team-b")
MODELS = ("m1", "m2")


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


Event = tuple[
    int, str, str, str, int, float, str, float, str
]  # worker, tenant, model, result, tokens, s, scope, dt, language

events = st.lists(
    st.tuples(
        st.integers(0, 2),
        st.sampled_from(TENANTS),
        st.sampled_from(MODELS),
        st.sampled_from(RESULTS + VERDICTS),  # a verdict: a served hit reported through /admin/feedback
        st.integers(0, 500),
        st.floats(0, 5),
        st.sampled_from(["s1", "s2", "s3", "s4"]),
        st.floats(0, 900),  # time passes between requests: several minute buckets, some dropped
        st.sampled_from(["en", "zh", "zxx"]),
    ),
    max_size=60,
)


@settings(max_examples=60, deadline=None)
@given(events)
def test_merged_workers_report_what_one_process_would(recorded: list[Event]) -> None:
    clock = Clock()
    whole = HitStats(clock)
    workers = [HitStats(clock) for _ in range(3)]
    for worker, tenant, model, result, tokens, seconds, scope, elapsed, language in recorded:
        clock.now += elapsed
        scope_id = f"{tenant}/{model}/{scope}"  # a scope belongs to one tenant and one model
        for stats in (whole, workers[worker]):
            if result in VERDICTS:
                stats.record_feedback(tenant, model, "chat", language, result)
            else:
                stats.record(tenant, model, result, tokens, seconds, scope_id=scope_id, language=language)
    exports = [json.loads(json.dumps(stats.export())) for stats in workers]  # as they cross the socket
    merged = HitStats.merged(exports, clock)
    assert merged.report() == whole.report()
    assert merged.report("team-a") == whole.report("team-a")


def test_scope_hits_merge_adds_counts_and_stays_bounded() -> None:
    rng = random.Random(0)
    first, second, both = ScopeHits(capacity=8), ScopeHits(capacity=8), ScopeHits(capacity=8)
    for _ in range(200):
        scope = f"scope-{min(int(rng.expovariate(0.5)), 20)}"
        result = rng.choice(["exact_hit", "semantic_hit"])
        rng.choice([first, second]).add(scope, "t", "m", result)
        both.add(scope, "t", "m", result)
    merged = ScopeHits(capacity=8)
    merged.merge(first.export())
    merged.merge(second.export())
    assert len(merged.export()) <= 8
    assert merged.top(limit=1)[0]["scope"] == both.top(limit=1)[0]["scope"] == "scope-0"


def test_shadow_stats_merge_sums_every_count() -> None:
    first, second = ShadowStats(), ShadowStats()
    first.record_candidate()
    first.record_comparison("a b c", "a b c", "r1", "e1")
    second.record_candidate()
    second.record_comparison("a b c", "x y z", "r2", "e2")
    first.merge(second)
    report = first.report()
    assert (report["would_hit"], report["compared"], report["identical_answers"]) == (2, 2, 1)
    assert report["mean_answer_similarity"] == 0.5
