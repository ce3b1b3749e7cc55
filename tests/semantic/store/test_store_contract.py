"""The store's contract, run against every backend kvgate talks to: the external Redis and the
embedded Valkey the gateway starts when no Redis URL is set."""

from __future__ import annotations

import asyncio
import secrets
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import numpy as np
import pytest
import redis.asyncio as aioredis
from redis.crc import key_slot

from gateway.runtime.embedded_store import EmbeddedStore
from semantic.store.entries import RedisEntryStore
from semantic.store.purge import PurgeSelector, purge
from tests.semantic.builders import REDIS_URL, delete_prefix, make_scope, unique_prefix

pytestmark = pytest.mark.redis


def unit_vector(seed: int, dimension: int = 8) -> np.ndarray:
    vector = np.random.default_rng(seed).standard_normal(dimension).astype(np.float32)
    return vector / np.linalg.norm(vector)


@pytest.fixture(scope="session")
def valkey_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with EmbeddedStore(Path(tmp_path_factory.mktemp("valkey"))) as embedded:
        yield embedded.url


@pytest.fixture(params=["redis", "valkey"])
async def backend(request: pytest.FixtureRequest) -> AsyncIterator[RedisEntryStore]:
    url = REDIS_URL if request.param == "redis" else request.getfixturevalue("valkey_url")
    client = aioredis.Redis.from_url(url)
    try:
        await client.ping()
    except (aioredis.ConnectionError, OSError):
        await client.aclose()
        pytest.skip(f"no {request.param} at {url}")
    prefix = unique_prefix()
    yield RedisEntryStore(client, prefix=prefix, stream_maxlen=1000)
    await delete_prefix(client, prefix)
    await client.aclose()


async def all_keys(store: RedisEntryStore) -> list[str]:
    return sorted(
        [key.decode() async for key in store.client.scan_iter(match=f"{store.prefix}:*", count=10_000)]
    )


async def test_an_entry_reads_back_as_written(backend: RedisEntryStore) -> None:
    scope = make_scope("Wie setze ich mein Passwort zurück? ✓")
    entry_id, new = await backend.put(
        scope, '{"answer": "Über die App"}', unit_vector(1), 60.0, ["faq", "de"]
    )
    entry = await backend.get_exact(scope)
    assert new and entry is not None and len(entry_id) >= 16
    assert (entry.entry_id, entry.scope_id, entry.tenant, entry.model) == (
        entry_id,
        scope.scope_id,
        "acme",
        "tiny-llama",
    )
    assert entry.prompt == scope.prompt and entry.response == '{"answer": "Über die App"}'
    assert entry.tags == ("faq", "de") and entry.hits == 1  # the exact read counted itself
    assert entry.expires == pytest.approx(entry.created + 60.0)
    assert abs(entry.created - time.time()) < 5


async def test_one_exact_key_keeps_its_first_answer(backend: RedisEntryStore) -> None:
    scope = make_scope()
    first, _ = await backend.put(scope, "first", None, 60.0, [])
    second, new = await backend.put(scope, "second", None, 60.0, [])
    assert (second, new) == (first, False)
    entry = await backend.get_exact(scope)
    assert entry is not None and entry.response == "first"


async def test_concurrent_writes_of_one_prompt_leave_one_entry(backend: RedisEntryStore) -> None:
    scope = make_scope()
    results = await asyncio.gather(
        *(backend.put(scope, f"answer {n}", unit_vector(n), 60.0, []) for n in range(20))
    )
    assert len({entry_id for entry_id, _ in results}) == 1
    assert sum(new for _, new in results) == 1
    assert await backend.scope_size(scope.scope_id) == 1


async def test_keys_of_a_scope_share_a_slot_and_a_ttl(backend: RedisEntryStore) -> None:
    scope = make_scope()
    entry_id, _ = await backend.put(scope, "answer", unit_vector(0), 30.0, [])
    written = time.monotonic()
    keys = [key for key in await all_keys(backend) if scope.scope_id in key]  # seconds on a large db
    assert len(keys) == 4  # entry, exact key, members, meta
    assert len({key_slot(key.encode()) for key in keys}) == 1
    for key in [*keys, f"{backend.prefix}:id:{{{entry_id}}}"]:
        lowest = 30_000 - (time.monotonic() - written) * 1000 - 500
        assert lowest < await backend.client.pttl(key) <= 30_000
    await backend.put(make_scope("another prompt"), "answer", None, None, [])  # no TTL: the scope lives on
    assert await backend.client.pttl(f"{backend.prefix}:{{{scope.scope_id}}}:m") == -1


async def test_max_age_filters_and_hits_count(backend: RedisEntryStore) -> None:
    scope = make_scope()
    entry_id, _ = await backend.put(scope, "answer", None, 60.0, [])
    assert await backend.get_exact(scope, min_created=time.time() + 1) is None
    await backend.record_hit(scope.scope_id, entry_id)
    entry = await backend.get_exact(scope, min_created=time.time() - 60)
    assert entry is not None and entry.hits == 2


async def test_an_entry_expires_with_all_its_keys(backend: RedisEntryStore) -> None:
    scope = make_scope()
    await backend.put(scope, "answer", unit_vector(0), 0.2, [])
    await asyncio.sleep(0.35)
    assert await backend.get_exact(scope) is None
    assert await all_keys(backend) == [f"{backend.prefix}:changes"]


async def test_delete_removes_every_key_and_tells_the_stream(backend: RedisEntryStore) -> None:
    scope = make_scope()
    entry_id, _ = await backend.put(scope, "answer", unit_vector(0), None, [])
    before = await backend.feed.last_id()
    assert await backend.delete(scope.scope_id, [entry_id, "never-existed"]) == [entry_id]
    assert await all_keys(backend) == [f"{backend.prefix}:changes"]
    await backend.record_hit(scope.scope_id, entry_id)  # must not resurrect the entry
    assert await all_keys(backend) == [f"{backend.prefix}:changes"]
    [change] = await backend.feed.read(before, block_ms=10)
    assert (change.op, change.scope_id, change.entry_ids) == ("delete", scope.scope_id, (entry_id,))


async def test_adds_carry_their_vector_and_expiry_on_the_stream(backend: RedisEntryStore) -> None:
    start = await backend.feed.last_id()
    vector = unit_vector(3)
    entry_id, _ = await backend.put(make_scope(), "answer", vector, 60.0, [])
    await backend.put(make_scope("exact only"), "answer", None, 60.0, [])  # no vector: nothing to index
    [change] = await backend.feed.read(start, block_ms=10)
    assert (change.op, change.entry_ids) == ("add", (entry_id,))
    assert change.vector is not None and np.array_equal(change.vector, vector)
    assert change.expires is not None and change.expires > time.time() + 59
    assert not await backend.feed.missed_since(start)


async def test_a_follower_behind_the_trimmed_stream_is_told(backend: RedisEntryStore) -> None:
    small = RedisEntryStore(backend.client, prefix=backend.prefix, stream_maxlen=1)
    start = await small.feed.last_id()
    first_add = None
    for number in range(300):  # approximate trimming drops whole nodes of 100 entries
        await small.put(make_scope(f"prompt {number}"), "answer", unit_vector(number), 60.0, [])
        first_add = first_add or await small.feed.last_id()
    assert first_add is not None and await small.feed.missed_since(first_add)
    vanished = RedisEntryStore(backend.client, prefix=unique_prefix())
    assert await vanished.feed.missed_since(first_add)  # a stream that is gone lost everything
    assert not await vanished.feed.missed_since("0-0") and start


async def test_scope_vectors_skip_and_forget_expired_entries(backend: RedisEntryStore) -> None:
    scope = make_scope()
    kept, _ = await backend.put(scope, "a", unit_vector(1), 60.0, [])
    await backend.put(make_scope("short-lived"), "b", unit_vector(2), 0.1, [])
    await backend.put(make_scope("exact only"), "c", None, 60.0, [])
    await asyncio.sleep(0.25)
    assert [scope_id async for scope_id in backend.scope_ids()] == [scope.scope_id]
    batches = [batch async for batch in backend.scope_vectors(scope.scope_id)]
    [(ids, vectors, expiries)] = batches
    assert ids == [kept] and vectors.shape == (1, 8) and expiries[0] is not None
    assert await backend.scope_size(scope.scope_id) == 2  # the expired member was dropped


async def fill(store: RedisEntryStore) -> dict[str, str]:
    """Six entries over tenants, models and tags; returns their ids by name."""
    specs = {
        "acme-llama-faq": ("acme", "tiny-llama", ["faq"]),
        "acme-llama-news": ("acme", "tiny-llama", ["news"]),
        "acme-qwen-faq": ("acme", "qwen", ["faq"]),
        "globex-llama-faq": ("globex", "tiny-llama", ["faq", "news"]),
        "globex-qwen": ("globex", "qwen", []),
        "initech-llama": ("initech", "tiny-llama", []),
    }
    found = {}
    for number, (name, (tenant, model, tags)) in enumerate(specs.items()):
        scope = make_scope(f"question {name}", tenant=tenant, model=model)
        found[name], _ = await store.put(scope, "answer", unit_vector(number), 60.0, tags)
    return found


@pytest.mark.parametrize(
    ("selector", "expected"),
    [
        (PurgeSelector(tenant="acme"), {"acme-llama-faq", "acme-llama-news", "acme-qwen-faq"}),
        (PurgeSelector(model="qwen"), {"acme-qwen-faq", "globex-qwen"}),
        (PurgeSelector(tag="faq"), {"acme-llama-faq", "acme-qwen-faq", "globex-llama-faq"}),
        (PurgeSelector(tenant="globex", tag="news"), {"globex-llama-faq"}),
        (PurgeSelector(tenant="acme", model="tiny-llama"), {"acme-llama-faq", "acme-llama-news"}),
        (PurgeSelector(tenant="nobody"), set()),
        (PurgeSelector(older_than_s=3600), set()),
    ],
)
async def test_purge_by_selector_counts_what_went(
    backend: RedisEntryStore, selector: PurgeSelector, expected: set[str]
) -> None:
    ids = await fill(backend)
    seen: list[str] = []
    count = await purge(backend, selector, on_deleted=lambda _scope, gone: seen.extend(gone))
    assert count == len(expected) and set(seen) == {ids[name] for name in expected}
    left = {
        name for name in ids if await backend.get_many(make_scope(f"question {name}").scope_id, [ids[name]])
    }
    remaining = 0
    async for scope_id in backend.scope_ids():
        remaining += await backend.scope_size(scope_id)
    assert remaining == len(ids) - len(expected) and left


async def test_purge_by_entry_id_scope_and_age(backend: RedisEntryStore) -> None:
    ids = await fill(backend)
    assert await purge(backend, PurgeSelector(entry_id=ids["globex-qwen"])) == 1
    assert await purge(backend, PurgeSelector(entry_id=ids["globex-qwen"])) == 0
    assert await purge(backend, PurgeSelector(entry_id=ids["acme-qwen-faq"], tenant="globex")) == 0
    assert await purge(backend, PurgeSelector(entry_id=secrets.token_urlsafe(12))) == 0
    scope = make_scope("question initech-llama", tenant="initech")
    assert await purge(backend, PurgeSelector(scope_id=scope.scope_id, tenant="acme")) == 0
    assert await purge(backend, PurgeSelector(scope_id=scope.scope_id)) == 1
    await asyncio.sleep(0.3)
    await backend.put(make_scope("fresh question"), "answer", unit_vector(9), 60.0, [])
    assert await purge(backend, PurgeSelector(older_than_s=0.2)) == 4
    assert await backend.get_exact(make_scope("fresh question")) is not None


def test_an_empty_selector_is_refused() -> None:
    with pytest.raises(ValueError):
        PurgeSelector()


async def test_an_answer_older_than_the_writer_accepts_is_replaced(backend: RedisEntryStore) -> None:
    scope = make_scope()
    old, _ = await backend.put(scope, "old", unit_vector(0), 60.0, [])
    start = await backend.feed.last_id()
    kept, new = await backend.put(scope, "newer", unit_vector(0), 60.0, [], replace_before=time.time() - 3600)
    assert (kept, new) == (old, False)
    await asyncio.sleep(0.02)
    fresh, new = await backend.put(scope, "fresh", unit_vector(0), 60.0, [], replace_before=time.time())
    assert new and fresh != old
    entry = await backend.get_exact(scope)
    assert entry is not None and entry.response == "fresh"
    assert await backend.scope_size(scope.scope_id) == 1 and await backend.scope_of_entry(old) is None
    changes = await backend.feed.read(start, block_ms=10)
    assert [(change.op, change.entry_ids) for change in changes] == [("delete", (old,)), ("add", (fresh,))]


async def test_a_remembered_wording_reads_the_entry_and_goes_with_it(backend: RedisEntryStore) -> None:
    scope = make_scope("How do I reset my password?")
    paraphrase = make_scope("How can I reset my password?")
    assert paraphrase.scope_id == scope.scope_id and paraphrase.exact_key != scope.exact_key
    entry_id, _ = await backend.put(scope, "answer", unit_vector(0), 30.0, [])
    assert await backend.get_exact(paraphrase) is None

    assert await backend.remember(paraphrase, entry_id)
    assert not await backend.remember(paraphrase, entry_id)  # the key is taken: nothing changes
    found = await backend.get_exact(paraphrase)
    assert found is not None and found.entry_id == entry_id and found.exact_key == scope.exact_key
    keys = [key for key in await all_keys(backend) if scope.scope_id in key]
    assert len(keys) == 6 and len({key_slot(key.encode()) for key in keys}) == 1  # + alias key, alias set
    for key in keys:  # every key of the entry lives exactly as long as the entry
        assert 0 < await backend.client.pttl(key) <= 30_000

    assert await backend.delete(scope.scope_id, [entry_id]) == [entry_id]
    assert await backend.get_exact(paraphrase) is None
    assert await all_keys(backend) == [f"{backend.prefix}:changes"]
    assert not await backend.remember(paraphrase, entry_id)  # never for a gone entry
    assert await all_keys(backend) == [f"{backend.prefix}:changes"]


async def test_a_vetoed_pair_outlives_its_entry_and_takes_the_remembered_wording(
    backend: RedisEntryStore,
) -> None:
    scope = make_scope("How do I reset my password?")
    paraphrase = make_scope("How can I reset my password?")
    entry_id, _ = await backend.put(scope, "answer", unit_vector(0), 30.0, [])
    assert await backend.remember(paraphrase, entry_id)
    assert (await backend.candidates(paraphrase, [entry_id]))[1] == frozenset()

    await backend.veto(paraphrase, entry_id, scope.exact_key)
    entries, vetoed = await backend.candidates(paraphrase, [entry_id])
    assert vetoed == {scope.exact_key} and entries[0] is not None and entries[0].entry_id == entry_id
    # the pair is one way: the stored wording is free
    assert (await backend.candidates(scope, [entry_id]))[1] == frozenset()
    assert await backend.get_exact(paraphrase) is None  # the remembered wording went with the veto
    assert not await backend.remember(paraphrase, entry_id)  # and cannot come back
    assert (await backend.get_exact(scope)) is not None  # the entry itself stays
    veto_key = f"{backend.prefix}:{{{paraphrase.scope_id}}}:v:{paraphrase.exact_key}"
    assert key_slot(veto_key.encode()) == key_slot(f"{backend.prefix}:{{{scope.scope_id}}}:m".encode())

    assert await backend.delete(scope.scope_id, [entry_id]) == [entry_id]
    assert await all_keys(backend) == sorted([f"{backend.prefix}:changes", veto_key])  # no TTL
    assert await backend.client.pttl(veto_key) == -1
