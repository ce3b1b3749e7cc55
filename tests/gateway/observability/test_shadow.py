"""Shadow mode: semantic hits are counted and compared, never served."""

from __future__ import annotations

from pathlib import Path

from fastapi.testclient import TestClient

from gateway.http.app import create_app
from tests.gateway.conftest import admin, auth, chat, make_settings
from tests.gateway.fakes import ScriptedBackend


def test_semantic_hits_are_answered_by_the_backend_and_compared(tmp_path: Path) -> None:
    backend = ScriptedBackend()
    app = create_app(make_settings(tmp_path, shadow_mode=True), backend_factory=lambda settings: backend)
    with TestClient(app) as client:
        client.post("/v1/chat/completions", json=chat("How do I reset my password?"), headers=auth())
        shadowed = client.post(
            "/v1/chat/completions", json=chat("How can I reset my password?"), headers=auth()
        )
        exact = client.post("/v1/chat/completions", json=chat("How do I reset my password?"), headers=auth())
        shadow = client.get("/admin/stats", headers=admin()).json()["shadow"]

    assert shadowed.headers["x-kvgate-cache"] == "miss"
    assert shadowed.headers["x-kvgate-shadow"] == "semantic-hit"
    assert shadowed.json()["choices"][0]["message"]["content"] == "echo: How can I reset my password?"
    assert exact.headers["x-kvgate-cache"] == "exact-hit"  # exact hits are still served
    assert len(backend.calls) == 2
    assert shadow["enabled"] is True
    assert (shadow["would_hit"], shadow["compared"], shadow["identical_answers"]) == (1, 1, 0)
    assert 0.5 < shadow["mean_answer_similarity"] < 1.0


def test_report_shows_shadow_results() -> None:
    from gateway.observability.report import shadow_line
    from gateway.observability.report_html import _shadow_card

    shadow = {
        "enabled": True,
        "would_hit": 7,
        "compared": 6,
        "identical_answers": 4,
        "mean_answer_similarity": 0.91,
    }
    assert shadow_line(shadow) == (
        "Shadow mode: 7 semantic hits would have been served; 6 compared with the fresh answer, "
        "4 identical; mean answer similarity 0.91"
    )
    assert "Shadow mode" in _shadow_card(shadow) and _shadow_card(shadow | {"enabled": False}) == ""
