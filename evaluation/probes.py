"""The per-pair cache step of `kvgate eval-pairs`: store each pair's `a` in a scope of its own, look its `b` up.

A `PairProbe` is that step, batched; `cache_probe` runs it through the real cache (store, index, embedder
batching and candidate checks, as when serving) on a Redis of the caller's, under a key prefix deleted
afterwards; `rule_probe` runs the rule alone over embedder cosines. Either way the verdicts come from one
`judge_many` of the served rule per batch.
"""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass
from typing import Any, Protocol

from evaluation.pair_sets import LabelledPair
from semantic.cache import CacheConfig, LookupKind, SemanticCache
from semantic.embedding.embedder import Embedder
from semantic.language_routing import served_embedder
from semantic.rule.language_routed_rule import multilingual_languages
from semantic.rule.profiles import ENGLISH
from semantic.rule.verdict import HitRule, PairByPair, Verdict
from semantic.store.changes import RedisClient
from semantic.store.entries import RedisEntryStore
from semantic.store.scope import build_scope

CACHE_CONCURRENCY = 32


@dataclass(frozen=True, slots=True)
class PairOutcome:
    """What one cache step gave for a pair: the cosine of the entry found for `b`, and the rule's verdict."""

    similarity: float
    verdict: Verdict


class PairProbe(Protocol):
    """The per-pair cache step, batched: store each `a` in a scope of its pair's own, look up its `b` there."""

    async def __call__(self, pairs: Sequence[LabelledPair]) -> list[PairOutcome]: ...


ProbeFactory = Callable[[HitRule], AbstractAsyncContextManager[PairProbe]]


class RuleProbe:
    """The rule over embedder cosines, with no store or index: what a scope holding only `a` would decide."""

    def __init__(self, embedder: Embedder, rule: HitRule) -> None:
        self.embedder = embedder
        self.rule = rule

    async def __call__(self, pairs: Sequence[LabelledPair]) -> list[PairOutcome]:
        stored = self.embedder.embed([pair.a for pair in pairs])  # (N, D), unit rows
        looked_up = self.embedder.embed([pair.b for pair in pairs])  # (N, D)
        similarities = (stored * looked_up).sum(axis=1).tolist()
        verdicts = self.rule.judge_many([(pair.b, pair.a) for pair in pairs], similarities)
        return [
            PairOutcome(similarity, verdict)
            for similarity, verdict in zip(similarities, verdicts, strict=True)
        ]


@asynccontextmanager
async def rule_probe(rule: HitRule) -> AsyncIterator[PairProbe]:
    """A `ProbeFactory` for `RuleProbe` over the default embedder (with the multilingual one behind it for
    the languages the rule judges with it)."""
    yield RuleProbe(served_embedder(default_embedder(), multilingual_languages(rule)), rule)


class CacheProbe:
    """The real cache: each `a` inserted into a scope of its pair's own, its `b` looked up there.

    Store, index, embedder batching and candidate checks all run as they do when serving. The cache's
    rule only records what it was asked; the verdicts then come from one `judge_many` over those
    questions: the served rule's decisions, with the verifier run once per batch instead of per pair.
    """

    def __init__(self, cache: SemanticCache, recorder: RecordingRule, rule: HitRule) -> None:
        self.cache = cache
        self.recorder = recorder
        self.rule = rule
        self._run = secrets.token_hex(4)
        self._seen = 0

    async def __call__(self, pairs: Sequence[LabelledPair]) -> list[PairOutcome]:
        tenants = [f"eval-{self._run}-{self._seen + index}" for index in range(len(pairs))]
        self._seen += len(pairs)
        name = self.cache.scope_embedder
        stored = [
            build_scope(_chat(pair.a), tenant=tenant, embedder=name)
            for pair, tenant in zip(pairs, tenants, strict=True)
        ]
        looked_up = [
            build_scope(_chat(pair.b), tenant=tenant, embedder=name)
            for pair, tenant in zip(pairs, tenants, strict=True)
        ]
        lookups = []
        # A few dozen requests in flight, as concurrent clients would be: enough for the embedder to
        # micro-batch, few enough for the Redis connection pool.
        for start in range(0, len(pairs), CACHE_CONCURRENCY):
            window = slice(start, start + CACHE_CONCURRENCY)
            await asyncio.gather(
                *(self.cache.insert(scope, f"answer {scope.tenant}") for scope in stored[window])
            )
            lookups.extend(await asyncio.gather(*(self.cache.lookup(scope) for scope in looked_up[window])))
        outcomes: list[PairOutcome | None] = [None] * len(pairs)
        questions, similarities, asked = [], [], []
        for index, lookup in enumerate(lookups):
            question = (looked_up[index].prompt, stored[index].prompt)
            similarity = self.recorder.asked.get(question)
            if lookup.kind is LookupKind.EXACT_HIT:
                outcomes[index] = PairOutcome(1.0, Verdict(True, 1.0, "exact match"))
            elif similarity is None:
                outcomes[index] = PairOutcome(-1.0, Verdict(False, 0.0, lookup.reason or "no candidate"))
            else:
                questions.append(question)
                similarities.append(similarity)
                asked.append(index)
        for index, similarity, verdict in zip(
            asked, similarities, self.rule.judge_many(questions, similarities), strict=True
        ):
            outcomes[index] = PairOutcome(similarity, verdict)
        self.recorder.asked.clear()
        return [outcome for outcome in outcomes if outcome is not None]


class RecordingRule(PairByPair):
    """A `HitRule` that refuses every pair and remembers what it was asked, keyed by (query, candidate)."""

    name = "recording"

    def __init__(self, served: HitRule) -> None:
        self.asked: dict[tuple[str, str], float] = {}
        self.served = served

    def language_refusal(self, text: str) -> str | None:
        """The served rule's: a prompt it will not judge is neither indexed nor looked up, as when serving."""
        return self.served.language_refusal(text)

    def judge(self, query: str, candidate: str, similarity: float, strictness: float = 0.0) -> Verdict:
        self.asked[(query, candidate)] = similarity
        return Verdict(False, 0.0, "deferred")

    def quick_verdict(
        self, query: str, candidate: str, similarity: float, strictness: float = 0.0
    ) -> Verdict | None:
        """None: every pair is recorded, to be decided later by the served rule in one batch."""
        return None


def cache_probe(client: RedisClient, embedder: Embedder | None = None) -> ProbeFactory:
    """A `ProbeFactory` over the real cache on `client`, under a key prefix of its own deleted afterwards."""

    @asynccontextmanager
    async def factory(rule: HitRule) -> AsyncIterator[PairProbe]:
        prefix = f"kvgate:eval:{secrets.token_hex(6)}"
        recorder = RecordingRule(rule)
        cache = SemanticCache(
            RedisEntryStore(client, prefix=prefix),
            served_embedder(
                embedder if embedder is not None else default_embedder(), multilingual_languages(rule)
            ),
            recorder,
            CacheConfig(default_ttl_s=3600.0, candidates=1, judged=1),
        )
        await cache.start()
        try:
            yield CacheProbe(cache, recorder, rule)
        finally:
            await cache.stop()
            keys = [key async for key in client.scan_iter(match=f"{prefix}:*", count=1000)]
            for start in range(0, len(keys), 500):
                await client.delete(*keys[start : start + 500])
            # The connections belong to this event loop, which ends with the evaluation.
            pool = getattr(client, "connection_pool", None)  # a cluster client has one per node
            if pool is not None:
                await pool.disconnect()

    return factory


def _chat(text: str) -> dict[str, Any]:
    return {"model": "eval-pairs", "messages": [{"role": "user", "content": text}], "temperature": 0}


def default_embedder() -> Embedder:
    """The English profile's embedder (the packaged all-MiniLM-L6-v2), on one thread."""
    return ENGLISH.embedder(1)
