"""A vetoed pair (a hit reported wrong) on a real Redis: never served to that wording again, by any replica,
whatever entry holds the stored prompt; other wordings and other tenants keep their hits."""

from __future__ import annotations

from typing import Any

import pytest

from semantic.cache import LookupKind, SemanticCache
from semantic.store.purge import PurgeSelector
from semantic.store.scope import RequestScope
from tests.semantic.builders import make_scope

pytestmark = [pytest.mark.redis, pytest.mark.slow]

QUESTION = "How do I reset my password?"
PARAPHRASE = "How can I reset my password?"
ANOTHER_WORDING = "What are the steps to reset my password?"


async def served(cache: SemanticCache, scope: RequestScope) -> str | None:
    """The entry id a lookup serves (None on a miss)."""
    lookup = await cache.lookup(scope)
    return lookup.entry.entry_id if lookup.hit and lookup.entry is not None else None


async def store(cache: SemanticCache, scope: RequestScope) -> str:
    inserted = await cache.insert(scope, '{"answer": 1}')
    assert inserted is not None
    return inserted.entry_id


async def test_a_vetoed_pair_is_a_miss_for_that_wording_on_every_replica(
    cache: SemanticCache, make_cache: Any
) -> None:
    entry_id = await store(cache, make_scope(QUESTION))
    await store(cache, make_scope(QUESTION, tenant="globex"))
    assert await served(cache, make_scope(PARAPHRASE)) == entry_id

    await cache.veto(make_scope(PARAPHRASE), entry_id, make_scope(QUESTION).exact_key)

    replica: SemanticCache = make_cache()
    await replica.start()  # another process: it learns the veto from Redis alone
    for lookup_cache in (cache, replica):
        miss = await lookup_cache.lookup(make_scope(PARAPHRASE))
        assert miss.kind is LookupKind.MISS and miss.reason == "no candidate"
        assert await served(lookup_cache, make_scope(ANOTHER_WORDING)) == entry_id  # only that wording
        assert await served(lookup_cache, make_scope(PARAPHRASE, tenant="globex")) is not None
        assert await served(lookup_cache, make_scope(QUESTION)) == entry_id  # the entry itself stays


async def test_a_veto_forgets_the_remembered_wording_and_refuses_a_late_remember(
    cache: SemanticCache,
) -> None:
    await store(cache, make_scope(QUESTION))
    lookup = await cache.lookup(make_scope(PARAPHRASE))
    assert lookup.kind is LookupKind.SEMANTIC_HIT and lookup.entry is not None
    assert await cache.remember(make_scope(PARAPHRASE), lookup.entry)
    assert (await cache.lookup(make_scope(PARAPHRASE))).kind is LookupKind.EXACT_HIT

    await cache.veto(make_scope(PARAPHRASE), lookup.entry.entry_id, lookup.entry.exact_key)
    assert await served(cache, make_scope(PARAPHRASE)) is None
    # A lookup that judged before the veto remembers after it: refused, the wording stays a miss.
    assert not await cache.remember(make_scope(PARAPHRASE), lookup.entry)
    assert await served(cache, make_scope(PARAPHRASE)) is None


async def test_the_veto_holds_for_the_prompt_stored_again_and_the_wording_is_stored_as_usual(
    cache: SemanticCache,
) -> None:
    first = await store(cache, make_scope(QUESTION))
    await cache.veto(make_scope(PARAPHRASE), first, make_scope(QUESTION).exact_key)
    assert await cache.purge(PurgeSelector(entry_id=first)) == 1
    again = await store(cache, make_scope(QUESTION))  # a new entry of the same prompt
    assert again != first and await served(cache, make_scope(ANOTHER_WORDING)) == again
    assert await served(cache, make_scope(PARAPHRASE)) is None

    own = await store(cache, make_scope(PARAPHRASE))  # the backend's answer for the wording itself
    assert await served(cache, make_scope(PARAPHRASE)) == own


async def test_an_exact_hit_is_not_a_pair_to_veto(cache: SemanticCache) -> None:
    entry_id = await store(cache, make_scope(QUESTION))
    with pytest.raises(ValueError, match="purge"):
        await cache.veto(make_scope(QUESTION), entry_id, make_scope(QUESTION).exact_key)
