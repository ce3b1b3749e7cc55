"""API keys map to tenants; the admin token guards purge and stats."""

from __future__ import annotations

from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from gateway.http.app import create_app
from tests.gateway.conftest import admin, auth, chat, make_settings
from tests.gateway.fakes import MODEL, ScriptedBackend

ROUTE = "/v1/chat/completions"


@pytest.mark.parametrize("headers", [{}, {"Authorization": "Bearer wrong"}, {"Authorization": "key-alpha"}])
def test_missing_or_unknown_key_is_401(client: TestClient, headers: dict[str, str]) -> None:
    response = client.post(ROUTE, json=chat("hi"), headers=headers)
    assert response.status_code == 401
    assert response.json()["error"]["type"] == "authentication_error"
    assert "key-alpha" not in response.text


@pytest.mark.parametrize(
    "headers", [{}, {"Authorization": "Bearer key-alpha"}, {"Authorization": "Bearer nope"}]
)
def test_admin_refuses_missing_or_wrong_token(client: TestClient, headers: dict[str, str]) -> None:
    assert client.get("/admin/stats", headers=headers).status_code == 401
    assert client.post("/admin/purge", json={"tenant": "alpha"}, headers=headers).status_code == 401


def test_without_a_configured_token_admin_takes_the_one_written_to_the_data_dir(tmp_path: Path) -> None:
    app = create_app(make_settings(tmp_path, admin_token=None), backend_factory=lambda s: ScriptedBackend())
    path = tmp_path / "admin_token"
    token = path.read_text().strip()
    assert len(token) >= 32 and path.stat().st_mode & 0o777 == 0o600
    with TestClient(app) as client:
        assert client.get("/admin/stats", headers=admin()).status_code == 401
        assert client.get("/admin/stats").status_code == 401
        assert client.get("/admin/stats", headers={"Authorization": f"Bearer {token}"}).status_code == 200
    again = create_app(make_settings(tmp_path, admin_token=None), backend_factory=lambda s: ScriptedBackend())
    with TestClient(again) as client:  # a restart keeps the token
        assert client.get("/admin/stats", headers={"Authorization": f"Bearer {token}"}).status_code == 200


def test_open_mode_serves_everyone_as_default(tmp_path: Path) -> None:
    app = create_app(make_settings(tmp_path, api_keys=None), backend_factory=lambda s: ScriptedBackend())
    with TestClient(app) as client:
        assert client.post(ROUTE, json=chat("hi")).status_code == 200
        stats = client.get("/admin/stats", headers=admin()).json()
    assert list(stats["since_start"]["by_tenant"]) == ["default"]


def seed(client: TestClient) -> dict[str, str]:
    """Four entries: alpha x2 (one tagged), beta x1, and alpha on another prompt; returns entry ids."""
    ids = {}
    for name, key, content, tags in [
        ("a1", "key-alpha", "alpha one", "faq"),
        ("a2", "key-alpha", "alpha two", None),
        ("b1", "key-beta", "beta one", "faq"),
    ]:
        headers = auth(key) | ({"x-kvgate-tags": tags} if tags else {})
        client.post(ROUTE, json=chat(content), headers=headers)
        ids[name] = client.post(ROUTE, json=chat(content), headers=auth(key)).headers["x-kvgate-entry-id"]
    return ids


def cached(client: TestClient, content: str, key: str = "key-alpha") -> bool:
    response = client.post(ROUTE, json=chat(content), headers=auth(key) | {"cache-control": "no-store"})
    return response.headers["x-kvgate-cache"] != "miss"


@pytest.mark.parametrize(
    ("selector", "expected", "survivors"),
    [
        ({"tenant": "alpha"}, 2, {"beta one"}),
        ({"tag": "faq"}, 2, {"alpha two"}),
        ({"model": MODEL}, 3, set()),
        ({"tenant": "beta", "tag": "faq"}, 1, {"alpha one", "alpha two"}),
        ({"older_than_s": 3600}, 0, {"alpha one", "alpha two", "beta one"}),
        ({"older_than_s": 0}, 3, set()),
    ],
)
def test_purge_by_selector(
    client: TestClient, selector: dict[str, object], expected: int, survivors: set[str]
) -> None:
    seed(client)
    response = client.post("/admin/purge", json=selector, headers=admin())
    assert response.status_code == 200 and response.json() == {"purged": expected}
    left = {content for content in ("alpha one", "alpha two") if cached(client, content)}
    left |= {"beta one"} if cached(client, "beta one", "key-beta") else set()
    assert left == survivors


def test_purge_by_entry_id_and_by_scope(client: TestClient) -> None:
    ids = seed(client)
    assert client.post("/admin/purge", json={"entry_id": ids["a1"]}, headers=admin()).json() == {"purged": 1}
    assert not cached(client, "alpha one") and cached(client, "alpha two")

    scope_of = {"tenant": "alpha", "scope_of": chat("anything at all")}
    assert client.post("/admin/purge", json=scope_of, headers=admin()).json() == {"purged": 1}
    assert not cached(client, "alpha two") and cached(client, "beta one", "key-beta")


def test_purge_needs_a_selector(client: TestClient) -> None:
    response = client.post("/admin/purge", json={}, headers=admin())
    assert response.status_code == 400 and response.json()["error"]["type"] == "invalid_request_error"


def test_stats_count_results_per_tenant(client: TestClient) -> None:
    seed(client)
    client.post(ROUTE, json=chat("alpha one"), headers=auth() | {"cache-control": "no-cache"})
    stats = client.get("/admin/stats", headers=admin()).json()
    alpha = stats["since_start"]["by_tenant"]["alpha"]
    assert (alpha["miss"], alpha["exact_hit"], alpha["bypass"]) == (2, 2, 1)
    assert stats["last_hour"]["overall"]["requests"] == 7
    only_beta = client.get("/admin/stats", params={"tenant": "beta"}, headers=admin()).json()
    assert list(only_beta["since_start"]["by_tenant"]) == ["beta"]


def test_stats_count_results_per_language(client: TestClient) -> None:
    """Each request is counted under its prompt's language, in /admin/stats and /metrics."""
    for content in ("How do I reset my password?", "How do I reset my password?", "怎样才能不晕车？"):
        assert client.post(ROUTE, json=chat(content), headers=auth()).status_code == 200
    since_start = client.get("/admin/stats", headers=admin()).json()["since_start"]
    by_language = since_start["by_language"]
    assert set(by_language) == {"en", "zh"}
    assert (by_language["en"]["miss"], by_language["en"]["exact_hit"]) == (1, 1)
    assert (by_language["zh"]["requests"], by_language["zh"]["miss"]) == (1, 1)
    assert sum(tally["requests"] for tally in by_language.values()) == since_start["overall"]["requests"]
    metrics = client.get("/metrics").text
    assert 'kvgate_requests_by_language_total{cache="exact_hit",language="en"} 1.0' in metrics
