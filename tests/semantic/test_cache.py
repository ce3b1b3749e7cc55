"""The cache end to end on a real Redis with the real MiniLM embedder (cosine-threshold rule)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import pytest

from semantic.cache import CacheConfig, CacheControl, LookupKind, SemanticCache
from semantic.embedding.embedder import SentenceEmbedder
from semantic.rule.verdict import Verdict
from semantic.store.entries import RedisEntryStore
from semantic.store.purge import PurgeSelector
from semantic.store.scope import RequestScope
from tests.semantic.builders import make_request, make_scope

pytestmark = [pytest.mark.redis, pytest.mark.slow]

QUESTION = "How do I reset my password?"
PARAPHRASE = "How can I reset my password?"
UNRELATED = "What is the boiling point of water at sea level?"


async def stored(
    cache: SemanticCache, scope: RequestScope, response: str = '{"answer": 1}', **kwargs: Any
) -> str:
    inserted = await cache.insert(scope, response, **kwargs)
    assert inserted is not None
    return inserted.entry_id


async def eventually(check: Callable[[], Awaitable[bool]], within_s: float = 1.0) -> float:
    """Seconds until `check()` holds; fails the test past `within_s`."""
    started = time.monotonic()
    while not await check():
        assert time.monotonic() - started < within_s, f"not within {within_s} s"
        await asyncio.sleep(0.02)
    return time.monotonic() - started


async def test_exact_then_semantic_then_miss(cache: SemanticCache) -> None:
    first = await cache.lookup(make_scope(QUESTION))
    assert first.kind is LookupKind.MISS and first.reason == "empty scope"
    entry_id = await stored(cache, make_scope(QUESTION))

    exact = await cache.lookup(make_scope(QUESTION))
    assert exact.kind is LookupKind.EXACT_HIT and exact.entry is not None and exact.entry.entry_id == entry_id
    assert exact.embed_ms == 0.0  # the exact layer embeds nothing

    semantic = await cache.lookup(make_scope(PARAPHRASE))
    assert semantic.kind is LookupKind.SEMANTIC_HIT and semantic.entry is not None
    assert semantic.entry.response == '{"answer": 1}' and semantic.similarity is not None
    assert semantic.similarity > 0.9 and semantic.embed_ms > 0 and semantic.search_ms > 0

    miss = await cache.lookup(make_scope(UNRELATED))
    assert miss.kind is LookupKind.MISS and miss.reason == "below threshold" and miss.entry is None
    assert miss.vector is not None and miss.vector.shape == (384,)
    again = await cache.lookup(make_scope(QUESTION))
    assert again.entry is not None and again.entry.hits == 3


@pytest.mark.parametrize(
    "other",
    [
        {"tenant": "globex"},
        {"model": "other-model"},
        {"temperature": 0.8},
        {"max_tokens": 512},
        {"seed": 42},
        {"stop": ["\n"]},
        {"response_format": {"type": "json_object"}},
        {
            "messages": [
                {"role": "system", "content": "Answer like a pirate."},
                {"role": "user", "content": QUESTION},
            ]
        },
        {
            "messages": [
                {"role": "system", "content": "You are a helpful assistant."},
                {"role": "user", "content": "I forgot my bank PIN."},
                {"role": "assistant", "content": "I can help with that."},
                {"role": "user", "content": QUESTION},
            ]
        },
    ],
)
async def test_no_hit_across_scopes_even_for_the_identical_last_turn(
    cache: SemanticCache, other: dict[str, Any]
) -> None:
    await stored(cache, make_scope(QUESTION))
    tenant = other.pop("tenant", "acme")
    for text in (QUESTION, PARAPHRASE):
        found = await cache.lookup(make_scope(text, tenant=tenant, **other))
        assert found.kind is LookupKind.MISS and found.entry is None
    assert (await cache.lookup(make_scope(PARAPHRASE))).kind is LookupKind.SEMANTIC_HIT


async def test_controls_bypass_no_store_max_age_and_strictness(cache: SemanticCache) -> None:
    scope = make_scope(QUESTION)
    assert await cache.insert(scope, "x", CacheControl(no_store=True)) is None
    assert (await cache.lookup(scope)).reason == "empty scope"
    await stored(cache, scope)
    assert (await cache.lookup(scope, CacheControl(bypass=True))).kind is LookupKind.BYPASS

    strict = await cache.lookup(make_scope(PARAPHRASE), CacheControl(strictness=1.0))
    assert strict.kind is LookupKind.MISS and strict.reason == "below threshold"

    await asyncio.sleep(0.3)
    too_old = CacheControl(max_age_s=0.2)
    assert (await cache.lookup(scope, too_old)).kind is LookupKind.MISS
    assert (await cache.lookup(make_scope(PARAPHRASE), too_old)).reason == "no candidate"
    assert (await cache.lookup(scope, CacheControl(max_age_s=60))).kind is LookupKind.EXACT_HIT

    short = make_scope("Which port does Redis listen on?")
    entry_id = await stored(cache, short, control=CacheControl(max_age_s=30))
    ttl_ms = await cache.store.client.pttl(f"{cache.store.prefix}:{{{short.scope_id}}}:e:{entry_id}")  # type: ignore[attr-defined]
    assert 29_000 < ttl_ms <= 30_000


async def test_a_prompt_the_embedder_would_truncate_is_cached_exactly_only(cache: SemanticCache) -> None:
    long_prompt = "Please summarise this text. " + "The quick brown fox jumps over the lazy dog. " * 40
    inserted = await cache.insert(make_scope(long_prompt), "summary")
    assert inserted is not None and not inserted.semantic and "over the embedder's 256" in inserted.reason
    assert (await cache.lookup(make_scope(long_prompt))).kind is LookupKind.EXACT_HIT
    await stored(cache, make_scope(QUESTION))  # so the scope is not empty
    near = await cache.lookup(make_scope(long_prompt + " Thanks."))
    assert near.kind is LookupKind.MISS and "over the embedder's 256" in near.reason
    assert cache.sync.index.scope_size(make_scope(QUESTION).scope_id) == 1


async def test_an_expired_entry_is_a_miss_and_leaves_the_index(make_cache: Any) -> None:
    cache: SemanticCache = make_cache(default_ttl_s=0.4)
    await cache.start()
    scope = make_scope(QUESTION)
    await stored(cache, scope)
    assert (await cache.lookup(make_scope(PARAPHRASE))).kind is LookupKind.SEMANTIC_HIT
    await asyncio.sleep(0.5)
    assert (await cache.lookup(make_scope(QUESTION))).kind is LookupKind.MISS
    await eventually(lambda: _true(cache.sync.index.scope_size(scope.scope_id) == 0), within_s=1.5)


async def test_an_entry_gone_from_redis_is_a_miss_and_leaves_the_index(cache: SemanticCache) -> None:
    scope = make_scope(QUESTION)
    entry_id = await stored(cache, scope)
    await stored(cache, make_scope(UNRELATED))
    await cache.store.client.delete(f"{cache.store.prefix}:{{{scope.scope_id}}}:e:{entry_id}")  # type: ignore[attr-defined]
    found = await cache.lookup(make_scope(PARAPHRASE))
    assert found.kind is LookupKind.MISS
    assert not cache.sync.index.contains(scope.scope_id, entry_id)
    assert await cache.store.scope_size(scope.scope_id) == 1


async def test_purge_through_the_cache_by_each_selector(cache: SemanticCache) -> None:
    ids = {
        "acme": await stored(cache, make_scope(QUESTION), tags=("faq",)),
        "acme-qwen": await stored(cache, make_scope(QUESTION, model="qwen")),
        "globex": await stored(cache, make_scope(QUESTION, tenant="globex"), tags=("faq",)),
        "initech": await stored(cache, make_scope(QUESTION, tenant="initech")),
    }
    assert await cache.purge(PurgeSelector(entry_id=ids["initech"])) == 1
    assert await cache.purge(PurgeSelector(model="qwen")) == 1
    assert await cache.purge(PurgeSelector(tag="faq", tenant="globex")) == 1
    assert (await cache.lookup(make_scope(PARAPHRASE, tenant="globex"))).kind is LookupKind.MISS
    assert (await cache.lookup(make_scope(PARAPHRASE))).kind is LookupKind.SEMANTIC_HIT
    assert await cache.purge(PurgeSelector(scope_id=make_scope(QUESTION).scope_id)) == 1
    assert (await cache.lookup(make_scope(QUESTION))).kind is LookupKind.MISS
    assert len(cache.sync.index) == 0


async def test_a_new_process_rebuilds_from_redis_and_hits(make_cache: Any) -> None:
    writer: SemanticCache = make_cache()
    await writer.start()
    await stored(cache=writer, scope=make_scope(QUESTION))
    await stored(cache=writer, scope=make_scope(UNRELATED, tenant="globex"))
    await writer.stop()
    del writer

    restarted: SemanticCache = make_cache()
    seen: list[tuple[int, int]] = []
    assert await restarted.start(progress=lambda done, total: seen.append((done, total))) == 2
    assert seen[-1] == (2, 2)
    assert (await restarted.lookup(make_scope(PARAPHRASE))).kind is LookupKind.SEMANTIC_HIT
    assert (await restarted.lookup(make_scope(UNRELATED, tenant="globex"))).kind is LookupKind.EXACT_HIT


async def test_two_replicas_see_each_others_writes_and_purges(make_cache: Any) -> None:
    first: SemanticCache = make_cache()
    second: SemanticCache = make_cache()
    await first.start()
    await second.start()
    entry_id = await stored(first, make_scope(QUESTION))

    async def second_hits() -> bool:
        return (await second.lookup(make_scope(PARAPHRASE))).kind is LookupKind.SEMANTIC_HIT

    assert await eventually(second_hits) < 1.0
    assert await second.purge(PurgeSelector(entry_id=entry_id)) == 1
    assert (await second.lookup(make_scope(PARAPHRASE))).kind is LookupKind.MISS
    scope_id = make_scope(QUESTION).scope_id
    await eventually(lambda: _true(first.sync.index.scope_size(scope_id) == 0))
    assert (await first.lookup(make_scope(PARAPHRASE))).kind is LookupKind.MISS


async def test_concurrent_lookups_share_embedding_batches(cache: SemanticCache) -> None:
    await stored(cache, make_scope(QUESTION))
    paraphrases = [f"How can I reset my password? ({number})" for number in range(16)]
    found = await asyncio.gather(*(cache.lookup(make_scope(text)) for text in paraphrases))
    assert all(result.kind is LookupKind.SEMANTIC_HIT for result in found)
    assert max(cache.batcher.batch_sizes) > 1 and len(cache.batcher.batch_sizes) < 16

    batches = len(cache.batcher.batch_sizes)
    miss = await cache.lookup(make_scope(UNRELATED))
    await cache.insert(make_scope(UNRELATED), "answer", vector=miss.vector)
    assert len(cache.batcher.batch_sizes) == batches + 1  # the insert reused the lookup's vector


async def test_pairs_that_need_the_verifier_are_judged_in_shared_batches(
    embedder: SentenceEmbedder, store: RedisEntryStore
) -> None:
    rule = CountingRule()
    cache = SemanticCache(store, embedder, rule)
    await cache.start()
    try:
        await _judged_in_batches(cache, rule)
    finally:
        await cache.stop()


async def _judged_in_batches(cache: SemanticCache, rule: CountingRule) -> None:
    await stored(cache, make_scope(QUESTION))
    paraphrases = [f"How can I reset my password? ({number})" for number in range(16)]
    found = await asyncio.gather(*(cache.lookup(make_scope(text)) for text in paraphrases))
    assert all(result.kind is LookupKind.SEMANTIC_HIT for result in found)
    assert sum(rule.batches) == 16 and len(rule.batches) < 16 and max(rule.batches) > 1
    assert all(result.reason == "judged in a batch" for result in found)
    same = await cache.lookup(make_scope("how do I reset my password"))  # settled without the model
    assert same.kind is LookupKind.SEMANTIC_HIT and same.reason == "same text" and sum(rule.batches) == 16


class CountingRule:
    """Hits above cosine 0.8; the same text is settled quickly, the rest goes to `judge_many` (counted)."""

    name = "counting"

    def __init__(self) -> None:
        self.batches: list[int] = []

    def language_refusal(self, text: str) -> str | None:
        return None

    def judge(self, query: str, candidate: str, similarity: float, strictness: float = 0.0) -> Verdict:
        return self.judge_many([(query, candidate)], [similarity], strictness)[0]

    def judge_many(
        self, pairs: Sequence[tuple[str, str]], similarities: Sequence[float], strictness: float = 0.0
    ) -> list[Verdict]:
        self.batches.append(len(pairs))
        return [Verdict(similarity >= 0.8, similarity, "judged in a batch") for similarity in similarities]

    def quick_verdict(
        self, query: str, candidate: str, similarity: float, strictness: float = 0.0
    ) -> Verdict | None:
        same = query.lower().rstrip("?") == candidate.lower().rstrip("?")
        return Verdict(True, 1.0, "same text") if same else None


def test_a_request_dict_goes_straight_in() -> None:
    scope = make_scope(QUESTION)
    assert scope.prompt == make_request()["messages"][-1]["content"]


async def _true(value: bool) -> bool:
    return value


async def test_the_best_accepted_of_the_nearest_candidates_is_served(
    embedder: SentenceEmbedder, store: RedisEntryStore
) -> None:
    """The nearest stored prompt is often another question; the rule judges the `judged` nearest and the
    accepted one it scores highest is served, not the first accepted or the nearest."""
    scores = {QUESTION: 0.2, "How can I reset my password on the website?": 0.7, PARAPHRASE: 0.9}
    rule = ScoringRule(scores, accept_at=0.5)
    cache = SemanticCache(store, embedder, rule)
    await cache.start()
    try:
        for text in scores:
            await stored(cache, make_scope(text), response=text)
        found = await cache.lookup(make_scope("How do I reset my password please?"))
        assert found.kind is LookupKind.SEMANTIC_HIT
        assert found.entry is not None and found.entry.response == PARAPHRASE
        assert sorted(rule.judged) == sorted(scores)  # all three candidates were judged, in one batch
        assert rule.batches == [3]
        rule.accept_at = 0.95  # nothing accepted: the nearest's refusal is reported
        missed = await cache.lookup(make_scope("How do I reset my password please?"))
        assert missed.kind is LookupKind.MISS and missed.reason == "scored below"
    finally:
        await cache.stop()


async def test_judged_one_judges_only_the_nearest(embedder: SentenceEmbedder, store: RedisEntryStore) -> None:
    scores = {QUESTION: 0.2, PARAPHRASE: 0.9}
    rule = ScoringRule(scores, accept_at=0.5)
    cache = SemanticCache(store, embedder, rule, CacheConfig(judged=1))
    await cache.start()
    try:
        for text in scores:
            await stored(cache, make_scope(text), response=text)
        found = await cache.lookup(make_scope("How do I reset my password?!"))
        assert found.kind is LookupKind.MISS and len(rule.judged) == 1
    finally:
        await cache.stop()
    with pytest.raises(ValueError, match="judged"):
        CacheConfig(candidates=2, judged=3)


class ScoringRule:
    """Scores each candidate by a table (by its text); accepts at or above `accept_at`."""

    name = "scoring"

    def __init__(self, scores: dict[str, float], accept_at: float) -> None:
        self.scores = scores
        self.accept_at = accept_at
        self.judged: list[str] = []
        self.batches: list[int] = []

    def language_refusal(self, text: str) -> str | None:
        return None

    def judge(self, query: str, candidate: str, similarity: float, strictness: float = 0.0) -> Verdict:
        return self.judge_many([(query, candidate)], [similarity], strictness)[0]

    def judge_many(
        self, pairs: Sequence[tuple[str, str]], similarities: Sequence[float], strictness: float = 0.0
    ) -> list[Verdict]:
        self.batches.append(len(pairs))
        self.judged.extend(candidate for _, candidate in pairs)
        verdicts = []
        for _, candidate in pairs:
            score = self.scores.get(candidate, 0.0)
            hit = score >= self.accept_at
            verdicts.append(Verdict(hit, score, "scored above" if hit else "scored below"))
        return verdicts

    def quick_verdict(
        self, query: str, candidate: str, similarity: float, strictness: float = 0.0
    ) -> Verdict | None:
        return None


async def test_a_near_duplicate_candidate_is_served_without_verifying_the_others(
    embedder: SentenceEmbedder, store: RedisEntryStore
) -> None:
    rule = CountingRule()  # the same text is settled quickly (score 1); everything else goes to the model
    cache = SemanticCache(store, embedder, rule)
    await cache.start()
    try:
        for text in (QUESTION, "How can I reset my password on the website?", "How do I reset my PIN?"):
            await stored(cache, make_scope(text), response=text)
        found = await cache.lookup(make_scope("how do I reset my password"))
        assert found.kind is LookupKind.SEMANTIC_HIT and found.reason == "same text"
        assert found.entry is not None and found.entry.response == QUESTION
        assert rule.batches == []  # the other candidates never reached the model
    finally:
        await cache.stop()
