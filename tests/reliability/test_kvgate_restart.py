"""kvgate SIGKILLed under load and started again: its semantic index is rebuilt from Redis, and
replayed traffic gets the same answer classes (so the same hit rate) as before the kill."""

from __future__ import annotations

import threading
import time

import httpx
import pytest

from tests.gateway.conftest import auth, chat
from tests.reliability.kvgate_runner import KvgateProcess
from tests.reliability.prompts import TOPICS

pytestmark = pytest.mark.slow

ORIGINALS = list(TOPICS[4:12])
TRAFFIC = ORIGINALS + [prompt.replace("?", " ?").replace(".", " .") for prompt in ORIGINALS]
NO_STORE = {"Cache-Control": "no-store"}
HITS = {"exact-hit", "semantic-hit"}


def replay(replica: KvgateProcess) -> list[str]:
    with httpx.Client(base_url=replica.base, timeout=10.0) as client:
        answers = [
            client.post("/v1/chat/completions", json=chat(p), headers=auth() | NO_STORE) for p in TRAFFIC
        ]
    assert all(answer.status_code == 200 for answer in answers)
    return [answer.headers["x-kvgate-cache"] for answer in answers]


def background_load(replica: KvgateProcess, stop: threading.Event) -> None:
    with httpx.Client(base_url=replica.base, timeout=2.0) as client:
        while not stop.is_set():
            for prompt in TOPICS[12:]:
                try:
                    client.post("/v1/chat/completions", json=chat(prompt), headers=auth())
                except httpx.HTTPError:
                    time.sleep(0.05)  # the process is down: that is the point


def test_kill_minus_nine_then_restart_keeps_the_hit_rate(replicas: list[KvgateProcess]) -> None:
    victim = replicas[2]
    with httpx.Client(base_url=victim.base, timeout=10.0) as client:
        # Only the originals are stored: a near-duplicate served as a semantic hit would be remembered as
        # an exact hit, and the replay must go through the rebuilt FAISS index.
        for prompt in ORIGINALS:
            assert client.post("/v1/chat/completions", json=chat(prompt), headers=auth()).status_code == 200
    before = replay(victim)
    stop = threading.Event()
    loader = threading.Thread(target=background_load, args=(victim, stop), daemon=True)
    loader.start()
    time.sleep(0.5)
    victim.kill()
    started = time.monotonic()
    victim.launch()
    victim.wait_ready()
    restart_s = time.monotonic() - started
    stop.set()
    loader.join(timeout=10)
    after = replay(victim)

    assert after == before
    assert "semantic-hit" in after, "no semantic hit: the rebuilt FAISS index went untested"
    rate_before, rate_after = (sum(kind in HITS for kind in run) / len(run) for run in (before, after))
    print(f"\nrestart to ready {restart_s:.1f} s; hit rate before {rate_before:.2f}, after {rate_after:.2f}")
