"""Three kvgate processes on one Redis: a write through one is a (semantic) hit through the others
within 1 s; a purge through one takes effect on all within 1 s; concurrent writes of one prompt leave
one entry."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
import redis

from tests.gateway.conftest import admin, auth, chat
from tests.reliability.kvgate_runner import KvgateProcess
from tests.reliability.prompts import PARAPHRASES
from tests.reliability.redis_proc import RedisProcess

pytestmark = pytest.mark.slow

NO_STORE = {"Cache-Control": "no-store"}  # probes must not store an answer of their own


def ask(replica: KvgateProcess, prompt: str, **headers: str) -> httpx.Response:
    response = httpx.post(
        f"{replica.base}/v1/chat/completions", json=chat(prompt), headers=auth() | headers, timeout=10.0
    )
    assert response.status_code == 200, response.text
    return response


LIMIT_S = 1.0


def wait_for(replica: KvgateProcess, prompt: str, wanted: str, limit_s: float = LIMIT_S) -> float:
    """Seconds until a request *sent* then sees `wanted` (its own latency on two busy cores not counted)."""
    started = time.monotonic()
    while True:
        sent = time.monotonic() - started
        seen = ask(replica, prompt, **NO_STORE).headers["x-kvgate-cache"]
        assert sent < limit_s, f"{replica.port}: a request sent {sent:.2f} s after saw {seen}, not {wanted}"
        if seen == wanted:
            return sent
        time.sleep(0.02)


def test_a_write_is_a_hit_everywhere_and_a_purge_a_miss_everywhere(replicas: list[KvgateProcess]) -> None:
    writer, *others = replicas
    paraphrase, original = PARAPHRASES[0]
    stored = ask(writer, original)
    assert stored.headers["x-kvgate-cache"] == "miss"
    delays = [wait_for(other, paraphrase, "semantic-hit") for other in others]
    entry_id = ask(others[0], paraphrase, **NO_STORE).headers["x-kvgate-entry-id"]

    purged = httpx.post(f"{others[1].base}/admin/purge", json={"entry_id": entry_id}, headers=admin())
    assert purged.status_code == 200 and purged.json()["purged"] == 1
    purge_delays = [wait_for(replica, paraphrase, "miss") for replica in replicas]
    assert all(ask(replica, original, **NO_STORE).headers["x-kvgate-cache"] == "miss" for replica in replicas)
    print(
        f"\nwrite visible on the other replicas after {max(delays) * 1000:.0f} ms, "
        f"purge after {max(purge_delays) * 1000:.0f} ms"
    )


def test_concurrent_writes_of_one_prompt_leave_one_entry(
    replicas: list[KvgateProcess], shared_redis: RedisProcess
) -> None:
    prompt = PARAPHRASES[1][1]
    client = redis.Redis.from_url(shared_redis.url)
    try:
        before = set(client.scan_iter(match="kvgate:sc:{*}:e:*", count=1000))
        with ThreadPoolExecutor(6) as pool:
            answers = list(pool.map(lambda index: ask(replicas[index % 3], prompt), range(6)))
        after = set(client.scan_iter(match="kvgate:sc:{*}:e:*", count=1000))
    finally:
        client.close()
    # The writes overlapped: more than one replica missed, generated and stored the answer.
    classes = [answer.headers["x-kvgate-cache"] for answer in answers]
    assert len({index % 3 for index, seen in enumerate(classes) if seen == "miss"}) >= 2, classes
    assert len(after - before) == 1, f"{len(after - before)} entries for one prompt written by 3 replicas"
