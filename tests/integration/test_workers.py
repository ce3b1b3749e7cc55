"""`kvgate serve --workers 2` end to end, at default settings: two workers on one port in front of one
engine process (the real SmolLM2), the embedded store, the supervisor owning them all."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.integration.workers_cluster import Cluster

pytestmark = pytest.mark.slow

MODEL = "smollm2-135m-instruct"
SYSTEM = "You are the support assistant of a company that sells kitchen appliances. " + " ".join(
    f"Rule {n}: be polite, precise and brief, and never invent a product or a price." for n in range(12)
)


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    running = Cluster(workers=2).start()
    yield running
    running.stop()


def chat(client: httpx.Client, question: str, system: str | None = None, **fields: Any) -> httpx.Response:
    messages = ([{"role": "system", "content": system}] if system else []) + [
        {"role": "user", "content": question}
    ]
    body = {"model": MODEL, "messages": messages, "temperature": 0, "max_tokens": 8} | fields
    return client.post("/v1/chat/completions", json=body)


def metric(text: str, name: str, **labels: str) -> float:
    """Sum of a Prometheus series' samples matching `labels`."""
    total = 0.0
    for line in text.splitlines():
        named = line.startswith(name) and line[len(name)] in " {"
        if named and all(f'{key}="{value}"' in line for key, value in labels.items()):
            total += float(line.rsplit(" ", 1)[1])
    return total


def test_a_prefix_prefilled_through_one_worker_is_reused_through_the_other(cluster: Cluster) -> None:
    with cluster.pinned(0) as first, cluster.pinned(1) as second:
        cold = chat(first, "Which oven do you sell?", SYSTEM)
        warm = chat(second, "Which fridge do you sell?", SYSTEM)
    assert cold.status_code == warm.status_code == 200
    prompt_tokens = warm.json()["usage"]["prompt_tokens"]
    cached = warm.json()["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert prompt_tokens > 250 and cached >= prompt_tokens - 32  # all but the question's last blocks


def test_stats_and_metrics_count_every_workers_traffic(cluster: Cluster) -> None:
    with cluster.pinned(0) as first, cluster.pinned(1) as second:
        before = first.get("/admin/stats", headers=cluster.admin).json()["since_start"]["overall"]
        assert chat(first, "Name one colour of the rainbow.").headers["x-kvgate-cache"] == "miss"
        assert chat(first, "Name one colour of the rainbow.").headers["x-kvgate-cache"] == "exact-hit"
        for _ in range(3):
            assert chat(second, "Name one colour of the rainbow.").headers["x-kvgate-cache"] == "exact-hit"
        stats = {
            worker: client.get("/admin/stats", headers=cluster.admin).json()
            for worker, client in ((0, first), (1, second))
        }
        scrapes = [client.get("/metrics").text for client in (first, second)]
    for report in stats.values():
        after = report["since_start"]["overall"]
        assert after["requests"] - before["requests"] == 5
        assert after["exact_hit"] - before["exact_hit"] == 4 and after["miss"] - before["miss"] == 1
        assert report["workers"] == {"count": 2, "answered": 2}
    assert stats[0]["since_start"] == stats[1]["since_start"]
    for scrape in scrapes:  # either worker's scrape sums both workers' series, and the engine's once
        assert metric(scrape, "kvgate_requests_total") == stats[0]["since_start"]["overall"]["requests"]
        assert (
            metric(scrape, "kvgate_requests_total", cache="exact_hit")
            == stats[0]["since_start"]["overall"]["exact_hit"]
        )
    assert metric(scrapes[0], "kvgate_engine_prompt_tokens_total") == metric(
        scrapes[1], "kvgate_engine_prompt_tokens_total"
    )


def test_a_client_that_disconnects_aborts_its_sequence_in_the_engine(cluster: Cluster) -> None:
    with cluster.pinned(1) as client:
        aborted_before = metric(
            client.get("/metrics").text, "kvgate_engine_request_success_total", finished_reason="abort"
        )
        body = {
            "model": MODEL,
            "messages": [{"role": "user", "content": "Write a long story about a lighthouse keeper."}],
            "max_tokens": 400,
            "temperature": 0,
            "stream": True,
        }
        with client.stream("POST", "/v1/chat/completions", json=body) as response:
            assert response.status_code == 200
            next(response.iter_lines())
    with cluster.pinned(0) as observer:
        for _ in range(100):
            scrape = observer.get("/metrics").text
            if (
                metric(scrape, "kvgate_engine_request_success_total", finished_reason="abort")
                > aborted_before
            ):
                break
            time.sleep(0.1)
        assert metric(scrape, "kvgate_engine_num_requests_running") == 0
        assert (
            metric(scrape, "kvgate_engine_request_success_total", finished_reason="abort")
            == aborted_before + 1
        )


def test_with_the_engine_process_killed_hits_still_answer_and_misses_get_503_until_it_is_back(
    cluster: Cluster,
) -> None:
    with cluster.pinned(0) as client:
        assert chat(client, "Name a planet.").status_code == 200
        engine = cluster.child_pid("gateway.backends.engine_process")
        os.kill(engine, signal.SIGKILL)
        time.sleep(0.5)
        hit = chat(client, "Name a planet.")
        assert hit.status_code == 200 and hit.headers["x-kvgate-cache"] == "exact-hit"
        down = chat(client, "Name a mountain.")
        assert client.get("/readyz").json()["engine"] == "down"
        assert down.status_code == 503 and down.headers["retry-after"]
        assert down.json()["error"]["code"] == "engine_unavailable"
        assert set(down.json()["error"]) == {"message", "type", "param", "code"}
        deadline = time.monotonic() + 180
        while (answer := chat(client, "Name a mountain.")).status_code == 503:
            assert time.monotonic() < deadline, "the engine process did not come back"
            time.sleep(0.5)
        assert answer.status_code == 200 and answer.headers["x-kvgate-cache"] == "miss"
        assert client.get("/readyz").json()["engine"] == "up"
    assert cluster.child_pid("gateway.backends.engine_process") != engine


def test_kill_9_of_the_supervisor_leaves_no_child_running(cluster: Cluster) -> None:
    children = cluster.children()
    assert len(children) == 4  # store, engine, two workers
    assert cluster.process is not None
    cluster.process.kill()
    cluster.process.wait()
    deadline = time.monotonic() + 60
    while alive := [pid for pid in children if _alive(pid)]:
        assert time.monotonic() < deadline, f"still running after the supervisor died: {alive}"
        time.sleep(0.2)


def test_sigterm_under_load_finishes_every_accepted_request() -> None:
    cluster = Cluster(workers=2).start()
    results: list[tuple[int, str]] = []
    try:

        def ask(index: int) -> None:
            body = {
                "model": MODEL,
                "messages": [{"role": "user", "content": f"Count from one to twenty, number {index}."}],
                "max_tokens": 48,
                "temperature": 0,
                "stream": index % 2 == 0,
            }
            with httpx.Client(base_url=cluster.base, timeout=300) as client:
                response = client.post("/v1/chat/completions", json=body)
                results.append((response.status_code, response.text))

        threads = [threading.Thread(target=ask, args=(index,)) for index in range(8)]
        for thread in threads:
            thread.start()
        with httpx.Client(base_url=cluster.base, timeout=60) as observer:
            for _ in range(300):
                if metric(observer.get("/metrics").text, "kvgate_engine_num_requests_running") >= 6:
                    break
                time.sleep(0.05)
        assert cluster.stop() == 0
        for thread in threads:
            thread.join(timeout=120)
    finally:
        cluster.stop()
    assert len(results) == 8
    for status, text in results:
        assert status == 200, text
        if text.startswith("data:"):
            chunks = [json.loads(line[6:]) for line in text.splitlines() if line.startswith("data: {")]
            assert chunks[-1]["choices"][0]["finish_reason"] in ("stop", "length")
            assert text.rstrip().endswith("data: [DONE]")
        else:
            assert json.loads(text)["choices"][0]["finish_reason"] in ("stop", "length")
    assert cluster.children() == {}


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"
