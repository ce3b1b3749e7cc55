"""/metrics and /admin/stats agree with a known mix of exact hits, semantic hits, misses and bypasses."""

from __future__ import annotations

import re

from fastapi.testclient import TestClient

from tests.gateway.conftest import admin, auth, chat
from tests.gateway.fakes import MODEL

ROUTE = "/v1/chat/completions"


def metric(text: str, name: str, **labels: str) -> float:
    total = 0.0
    for line in text.splitlines():
        match = re.match(rf"^{name}\{{(.*)\}} (\S+)$", line)
        if match and all(f'{key}="{value}"' in match.group(1) for key, value in labels.items()):
            total += float(match.group(2))
    return total


def test_known_mix_is_counted_exactly(client: TestClient) -> None:
    mix = [
        ("Where is the Eiffel Tower?", {}),  # miss
        ("Where is the Eiffel Tower?", {}),  # exact hit
        ("Where is the Eiffel Tower?", {}),  # exact hit
        ("Where is the Eiffel Tower located?", {}),  # semantic hit
        ("Who painted the Mona Lisa?", {}),  # miss
        ("Who painted the Mona Lisa?", {"cache-control": "no-cache"}),  # bypass
    ]
    for content, headers in mix:
        assert client.post(ROUTE, json=chat(content), headers=auth() | headers).status_code == 200

    text = client.get("/metrics").text
    counts = {
        cache: metric(text, "kvgate_requests_total", tenant="alpha", model=MODEL, cache=cache)
        for cache in ("exact_hit", "semantic_hit", "miss", "bypass")
    }
    assert counts == {"exact_hit": 2.0, "semantic_hit": 1.0, "miss": 2.0, "bypass": 1.0}
    assert metric(text, "kvgate_best_candidate_similarity_count", result="hit") == 1.0
    assert metric(text, "kvgate_request_duration_seconds_count", route="chat") == 6.0

    overall = client.get("/admin/stats", headers=admin()).json()["since_start"]["overall"]
    assert (overall["exact_hit"], overall["semantic_hit"], overall["miss"], overall["bypass"]) == (2, 1, 2, 1)
    assert overall["hit_rate"] == 0.5


def test_the_semantic_index_is_reported_at_scrape_time(client: TestClient) -> None:
    def gauge(name: str) -> float:
        found = re.search(rf"^{name} (\S+)$", client.get("/metrics").text, re.MULTILINE)
        assert found is not None, name
        return float(found.group(1))

    before = gauge("kvgate_semantic_index_vectors")
    for content in ("What is the tallest mountain in Africa?", "How many moons does Mars have?"):
        assert client.post(ROUTE, json=chat(content), headers=auth()).status_code == 200
    assert gauge("kvgate_semantic_index_vectors") == before + 2
    assert gauge("kvgate_semantic_index_rebuilds_running") == 0.0


def test_readyz(client: TestClient) -> None:
    body = client.get("/readyz").json()
    assert body["status"] == "ready" and body["store"] == "up"
