"""The semantic cache's request flow: lookup (exact, then semantic), insert, purge, rebuild.

    lookup:  exact key in Redis (no embedding; a wording a semantic hit was served under is remembered
             there too)  ->  a prompt in a language the rule was not measured on stops here
             ->  embed the prompt (micro-batched, off the loop)
             ->  search the scope's FAISS index  ->  read the candidates from Redis (gone = miss, and
             out of the index; one this wording was reported wrongly served = never a candidate for
             it again)  ->  the HitRule judges the `judged` nearest fresh ones (cheap checks on the
             loop; pairs that need the verifier batched across concurrent lookups, off the loop), and the
             accepted one it scores highest is served
    veto:    a hit reported wrong: the pair of prompts is kept in Redis (per scope, so per tenant), the
             wording's remembered alias to the entry goes; every process's lookups skip the pair
    insert:  embed unless the lookup already did (not in an unmeasured language: exact layer only)  ->  store in Redis (one entry per exact key)
             ->  index locally; other processes learn of it from the change stream

The gateway builds a `RequestScope` (`semantic/store/scope.py`) and a `CacheControl` from the request, and
calls `lookup`, then on a miss `insert` with the lookup's vector. Knows the store, index, embedder and
rule through their protocols; knows nothing about HTTP or the OpenAI response shape (a response is
an opaque string here).
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from enum import StrEnum
from typing import NamedTuple

from semantic.embedding.embed_batcher import EmbedBatcher
from semantic.embedding.embedder import Embedder, Vectors
from semantic.embedding.micro_batch import MicroBatcher
from semantic.index.epochs import ChangeEpochs
from semantic.index.sync import IndexSync
from semantic.index.vector_index import IndexConfig, Neighbour, RebuildProgress
from semantic.language_routing import LanguageRoutedEmbedder
from semantic.rule.verdict import HitRule, Verdict
from semantic.store.entries import CacheEntry, EntryStore
from semantic.store.purge import PurgeSelector, purge
from semantic.store.scope import RequestScope


class LookupKind(StrEnum):
    EXACT_HIT = "exact_hit"
    SEMANTIC_HIT = "semantic_hit"
    MISS = "miss"
    BYPASS = "bypass"


@dataclass(frozen=True, slots=True)
class CacheControl:
    """Per-request controls (the gateway maps `Cache-Control` and its strictness header onto these).

    bypass: skip the lookup (still store). no_store: do not store. max_age_s: accept only entries at
    most this old, and store with this TTL. strictness in [0, 1]: passed to the rule, only raises the bar.
    """

    bypass: bool = False
    no_store: bool = False
    max_age_s: float | None = None
    strictness: float = 0.0

    def __post_init__(self) -> None:
        if self.max_age_s is not None and self.max_age_s < 0:
            raise ValueError("max_age_s must not be negative")
        if not 0.0 <= self.strictness <= 1.0:
            raise ValueError("strictness must be in [0, 1]")


@dataclass(frozen=True, slots=True)
class CacheConfig:
    """How the cache behaves. `default_ttl_s=None` keeps entries until purged or evicted."""

    default_ttl_s: float | None = 7 * 24 * 3600.0
    candidates: int = 4  # neighbours read from Redis, so that gone or too-old ones can be skipped
    # The nearest fresh candidates the rule judges; the best it accepts is served. The nearest by cosine is
    # often not the stored wording of the same question (a keyword query is nearer a related question than
    # its own paraphrase); the shipped calibration was fitted on lookups judged this way
    # (bench/semantic/bench_rule.py), and bench/semantic/bench_rewordings.py measures k.
    judged: int = 3
    max_batch: int = 64
    # No wait for company: a batch is what arrived while the previous one ran, which at 32 concurrent
    # lookups still fills batches, and a lone lookup does not pay a millisecond for nobody.
    max_wait_ms: float = 0.0
    hnsw_threshold: int = 100_000
    follow_block_ms: int = 1000

    def __post_init__(self) -> None:
        if not 1 <= self.judged <= self.candidates:
            raise ValueError("judged must be between 1 and candidates")


@dataclass(frozen=True, slots=True)
class Lookup:
    """What a lookup found. `entry` is set on a hit; `reason` says why in a few words (for logs)."""

    kind: LookupKind
    entry: CacheEntry | None = None
    similarity: float | None = None  # of the candidate served, or of the nearest judged on a miss
    reason: str = ""
    embed_ms: float = 0.0
    search_ms: float = 0.0
    total_ms: float = 0.0
    vector: Vectors | None = field(default=None, repr=False)  # pass to `insert` on a miss

    @property
    def hit(self) -> bool:
        return self.kind in (LookupKind.EXACT_HIT, LookupKind.SEMANTIC_HIT)


@dataclass(frozen=True, slots=True)
class Inserted:
    """The entry now answering this request: ours (`new`), or one another writer stored first."""

    entry_id: str
    new: bool
    semantic: bool  # False: stored for the exact layer only
    reason: str = ""  # why not semantic, when it is not


class SemanticCache:
    """Exact and semantic answer cache over a shared store, with this process's index kept in sync."""

    def __init__(
        self, store: EntryStore, embedder: Embedder, rule: HitRule, config: CacheConfig | None = None
    ) -> None:
        self.config = config or CacheConfig()
        self.store = store
        self.embedder = embedder
        self.rule = rule
        # The embedder and the verifier run on one thread of their own: on a few cores, more threads only
        # take turns, and each would keep its own allocator heap and BLAS buffers (docs/reliability.md).
        self.inference = ThreadPoolExecutor(max_workers=1, thread_name_prefix="kvgate-inference")
        self.batcher = EmbedBatcher(
            embedder, self.config.max_batch, self.config.max_wait_ms, executor=self.inference
        )
        # Pairs that need the verifier are batched across concurrent lookups, on the same thread; no wait:
        # a batch is what arrived while the previous one ran.
        self.judges: MicroBatcher[Question, Verdict] = MicroBatcher(
            functools.partial(judge_questions, rule), self.config.max_batch, 0.0, executor=self.inference
        )
        index_config = IndexConfig(embedder.dimension, hnsw_threshold=self.config.hnsw_threshold)
        self.sync = IndexSync(store, index_config, block_ms=self.config.follow_block_ms)

    @property
    def epochs(self) -> ChangeEpochs:
        """Moves per scope when an entry may have gone or been replaced (`semantic/index/epochs.py`)."""
        return self.sync.epochs

    @property
    def scope_embedder(self) -> str | Callable[[str], str]:
        """What a request's scope is built with (`build_scope`'s `embedder`): the embedder's name, or with
        one embedder per language the function giving each prompt's."""
        if isinstance(self.embedder, LanguageRoutedEmbedder):
            return self.embedder.identity
        return self.embedder.name

    async def start(self, progress: RebuildProgress | None = None) -> int:
        """Rebuild the index from the store and start following the change stream. Returns vectors indexed."""
        return await self.sync.start(progress)

    async def stop(self) -> None:
        await self.sync.stop()
        await self.batcher.close()
        await self.judges.close()
        self.inference.shutdown(wait=False)

    async def rebuild(self, progress: RebuildProgress | None = None) -> int:
        return await self.sync.rebuild(progress)

    async def lookup(self, scope: RequestScope, control: CacheControl | None = None) -> Lookup:
        """Exact layer, then semantic layer. Never raises for a miss; Redis errors propagate."""
        control = control or CacheControl()
        started = time.perf_counter()
        if control.bypass:
            return Lookup(LookupKind.BYPASS, reason="lookup bypassed")
        min_created = 0.0 if control.max_age_s is None else time.time() - control.max_age_s
        entry = await self.store.get_exact(scope, min_created)
        remembered = entry is not None and entry.exact_key != scope.exact_key
        # A remembered wording was judged at the default bar: a request raising the bar is judged again.
        if entry is not None and not (remembered and control.strictness > 0):
            reason = "remembered semantic hit" if remembered else "exact match"
            return Lookup(LookupKind.EXACT_HIT, entry, 1.0, reason, total_ms=_ms_since(started))
        if not scope.semantic:
            return Lookup(LookupKind.MISS, reason=scope.semantic_refusal or "", total_ms=_ms_since(started))
        if (refusal := self.rule.language_refusal(scope.prompt)) is not None:
            return Lookup(LookupKind.MISS, reason=refusal, total_ms=_ms_since(started))
        if self.sync.index.scope_size(scope.scope_id) == 0:  # nothing to compare with: skip the embedder
            return Lookup(LookupKind.MISS, reason="empty scope", total_ms=_ms_since(started))

        embed_started = time.perf_counter()
        embedding = await self.batcher.embed(scope.prompt)
        embed_ms = _ms_since(embed_started)
        if embedding.vector is None:
            reason = (
                f"prompt has {embedding.num_tokens} tokens, over the embedder's {self.embedder.max_tokens}"
            )
            return Lookup(LookupKind.MISS, reason=reason, embed_ms=embed_ms, total_ms=_ms_since(started))
        search_started = time.perf_counter()
        neighbours = self.sync.index.search(scope.scope_id, embedding.vector, self.config.candidates)
        search_ms = _ms_since(search_started)

        fresh = await self._fresh_candidates(scope, neighbours, min_created)
        if not fresh:
            return Lookup(
                LookupKind.MISS,
                reason="no candidate",
                embed_ms=embed_ms,
                search_ms=search_ms,
                total_ms=_ms_since(started),
                vector=embedding.vector,
            )
        candidate, similarity, verdict = await self._judge(scope.prompt, fresh, control.strictness)
        if verdict.hit:
            await self.store.record_hit(scope.scope_id, candidate.entry_id)
        return Lookup(
            LookupKind.SEMANTIC_HIT if verdict.hit else LookupKind.MISS,
            entry=candidate if verdict.hit else None,
            similarity=similarity,
            reason=verdict.reason,
            embed_ms=embed_ms,
            search_ms=search_ms,
            total_ms=_ms_since(started),
            vector=embedding.vector,
        )

    async def _judge(
        self, prompt: str, fresh: list[tuple[CacheEntry, float]], strictness: float
    ) -> tuple[CacheEntry, float, Verdict]:
        """The rule's verdicts on the candidates: the accepted one it scores highest, else the nearest's
        refusal. Cheap checks settle most on the loop; the rest go to the verifier together."""
        questions = [Question(prompt, entry.prompt, similarity, strictness) for entry, similarity in fresh]
        verdicts: list[Verdict | None] = [self.rule.quick_verdict(*question) for question in questions]
        undecided = [index for index, verdict in enumerate(verdicts) if verdict is None]
        # A near-duplicate (score 1, the most any verdict gives) is served as is: no verified pair beats it.
        if any(verdict is not None and verdict.hit and verdict.score >= 1.0 for verdict in verdicts):
            undecided = []
            verdicts = [verdict or Verdict(False, 0.0, "not judged") for verdict in verdicts]
        if undecided:
            await _verifier_loaded(self.rule, prompt)
            judged = await asyncio.gather(*(self.judges.submit(questions[index]) for index in undecided))
            for index, verdict in zip(undecided, judged, strict=True):
                verdicts[index] = verdict
        decided = [verdict for verdict in verdicts if verdict is not None]
        hits = [index for index, verdict in enumerate(decided) if verdict.hit]
        chosen = max(hits, key=lambda index: decided[index].score) if hits else 0
        entry, similarity = fresh[chosen]
        return entry, similarity, decided[chosen]

    async def remember(self, scope: RequestScope, entry: CacheEntry) -> bool:
        """After a semantic hit was served: this wording's exact key points at `entry` from now on (for the
        entry's lifetime, deleted with it), so asking it again is an exact hit. False if nothing changed."""
        if entry.scope_id != scope.scope_id or entry.exact_key == scope.exact_key:
            return False
        return await self.store.remember(scope, entry.entry_id)

    async def veto(self, scope: RequestScope, entry_id: str, stored_key: str) -> None:
        """A hit reported wrong: the prompt stored under `stored_key` (the entry `entry_id`, or any later
        entry of the same prompt) is never served for this request's wording again, in its scope only, so
        for its tenant only. Kept in the store: it holds in every process and after a restart."""
        if stored_key == scope.exact_key:
            raise ValueError("an exact hit is the same request, not a pair to veto: purge the entry instead")
        await self.store.veto(scope, entry_id, stored_key)

    async def vector_for(self, scope: RequestScope) -> Vectors | None:
        """The prompt's vector for an insert that may follow a lookup that did not embed (an empty scope),
        computed ahead, while the backend generates; None when the entry would be for the exact layer only."""
        if not scope.semantic or self.rule.language_refusal(scope.prompt) is not None:
            return None
        return (await self.batcher.embed(scope.prompt)).vector

    async def insert(
        self,
        scope: RequestScope,
        response: str,
        control: CacheControl | None = None,
        *,
        tags: tuple[str, ...] = (),
        vector: Vectors | None = None,
        exact_only: str | None = None,
    ) -> Inserted | None:
        """Store `response` for this request (None when `no_store`). Pass the lookup's `vector` if any;
        `exact_only` says why this answer may serve only the same request (e.g. it is a tool call)."""
        control = control or CacheControl()
        if control.no_store:
            return None
        reason = scope.semantic_refusal or ""
        # A prompt the rule will not judge is stored for the exact layer only: never anyone's candidate.
        semantic = scope.semantic
        if semantic and exact_only is not None:
            semantic, reason = False, exact_only
        if semantic and (refusal := self.rule.language_refusal(scope.prompt)) is not None:
            semantic, reason = False, refusal
        if semantic and vector is None:
            embedding = await self.batcher.embed(scope.prompt)
            vector = embedding.vector
            if vector is None:
                reason = f"prompt has {embedding.num_tokens} tokens, over the embedder's {self.embedder.max_tokens}"
        if not semantic:
            vector = None
        ttl_s = self.config.default_ttl_s if control.max_age_s is None else control.max_age_s
        # Under max-age, an older answer for the same exact request is replaced, not kept.
        replace_before = 0.0 if control.max_age_s is None else time.time() - control.max_age_s
        entry_id, new = await self.store.put(scope, response, vector, ttl_s, tags, replace_before)
        if replace_before:
            self.sync.epochs.moved(scope.scope_id)  # the exact key may point at a new entry now
        if new and vector is not None:
            expires = None if ttl_s is None else time.time() + ttl_s
            self.sync.add_local(scope.scope_id, entry_id, vector, expires)
        return Inserted(entry_id, new, semantic=vector is not None, reason=reason)

    async def purge(self, selector: PurgeSelector) -> int:
        """Delete matching entries from Redis (every process's index follows); returns how many went."""
        return await purge(self.store, selector, on_deleted=self._forget)

    def _forget(self, scope_id: str, entry_ids: list[str]) -> None:
        self.sync.remove_local(scope_id, entry_ids)

    async def _fresh_candidates(
        self, scope: RequestScope, neighbours: list[Neighbour], min_created: float
    ) -> list[tuple[CacheEntry, float]]:
        """The `judged` nearest neighbours still in Redis, fresh enough and not stored under an exact key
        this wording was reported wrongly served (read in the same round trip), nearest first; gone ones
        leave the index and the scope."""
        if not neighbours:
            return []
        scope_id = scope.scope_id
        entries, vetoed = await self.store.candidates(scope, [neighbour.entry_id for neighbour in neighbours])
        gone = [
            neighbour.entry_id for neighbour, entry in zip(neighbours, entries, strict=True) if entry is None
        ]
        if gone:
            self.sync.remove_local(scope_id, gone)
            await self.store.delete(scope_id, gone)
        fresh = [
            (entry, neighbour.similarity)
            for neighbour, entry in zip(neighbours, entries, strict=True)
            if entry is not None and entry.created >= min_created and entry.exact_key not in vetoed
        ]
        return fresh[: self.config.judged]


class Question(NamedTuple):
    """One pair for the rule: may `candidate`'s answer be served for `query`?"""

    query: str
    candidate: str
    similarity: float
    strictness: float


def judge_questions(rule: HitRule, questions: list[Question]) -> list[Verdict]:
    """One `judge_many` per strictness among the questions (almost always one), answers in their order."""
    verdicts: list[Verdict | None] = [None] * len(questions)
    for strictness in {question.strictness for question in questions}:
        rows = [row for row, question in enumerate(questions) if question.strictness == strictness]
        judged = rule.judge_many(
            [(questions[row].query, questions[row].candidate) for row in rows],
            [questions[row].similarity for row in rows],
            strictness,
        )
        for row, verdict in zip(rows, judged, strict=True):
            verdicts[row] = verdict
    return [verdict for verdict in verdicts if verdict is not None]


async def _verifier_loaded(rule: HitRule, query: str) -> None:
    """Wait, on the loop, for a verifier that loads with its first pair (the multilingual one), so that the
    inference thread never waits for it and the lookups queued there go on meanwhile."""
    loading = getattr(rule, "verifier_loading", None)
    future = loading(query) if loading is not None else None
    if future is not None:
        await asyncio.wrap_future(future)


def _ms_since(started: float) -> float:
    return (time.perf_counter() - started) * 1000.0
