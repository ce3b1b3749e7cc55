"""`/admin/feedback` through HTTP: a hit reported wrong is never served to that tenant's wording again, every
report is kept as a labelled pair and counted, and bad reports get 4xx in the admin API's error shape."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient
from rich.console import Console

from gateway.http.app import create_app
from gateway.observability.feedback_log import FEEDBACK_FILE
from gateway.observability.report import print_report
from gateway.observability.report_html import render_html
from gateway.observability.request_log import CoveredRoutes
from tests.gateway.conftest import admin, auth, chat, make_settings
from tests.gateway.fakes import ScriptedBackend

ROUTE = "/v1/chat/completions"
# Served as semantic hits by the shipped rule at the default target (tests/gateway/test_completions.py,
# tests/gateway/observability/test_report.py).
STORED, REWORDED = "How many moons does Mars have?", "How many moons does the planet Mars have?"
EIFFEL, EIFFEL_REWORDED = "Where is the Eiffel Tower?", "Where is the Eiffel Tower located?"


def ask(client: TestClient, prompt: str, key: str = "key-alpha") -> httpx.Response:
    response = client.post(ROUTE, json=chat(prompt), headers=auth(key))
    assert response.status_code == 200, response.text
    return response


def report(client: TestClient, **body: Any) -> httpx.Response:
    return client.post("/admin/feedback", json=body, headers=admin())


def feedback_lines(data_dir: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (data_dir / FEEDBACK_FILE).read_text().splitlines()]


def test_a_hit_reported_wrong_is_a_miss_for_that_tenant_only(
    client: TestClient, backend: ScriptedBackend, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    for key in ("key-alpha", "key-beta"):
        assert ask(client, STORED, key).headers["x-kvgate-cache"] == "miss"
    served = ask(client, REWORDED)
    assert served.headers["x-kvgate-cache"] == "semantic-hit"

    with caplog.at_level(logging.INFO, logger="kvgate.admin"):
        reported = report(client, request_id=served.headers["x-request-id"], verdict="wrong")
    assert reported.status_code == 200, reported.text
    assert reported.json() == {
        "request_id": served.headers["x-request-id"],
        "entry_id": served.headers["x-kvgate-entry-id"],
        "tenant": "alpha",
        "verdict": "wrong",
        "vetoed": True,
    }
    assert any("feedback by admin: wrong" in record.getMessage() for record in caplog.records)

    calls = len(backend.calls)
    after = ask(client, REWORDED)
    assert after.headers["x-kvgate-cache"] == "miss"  # answered by the backend, not the entry reported
    assert after.json()["choices"][0]["message"]["content"] == f"echo: {REWORDED}"
    assert len(backend.calls) == calls + 1
    stored = ask(client, REWORDED)  # the backend's answer was stored as usual
    assert stored.headers["x-kvgate-cache"] == "exact-hit"
    assert stored.headers["x-kvgate-entry-id"] != served.headers["x-kvgate-entry-id"]

    other = ask(client, REWORDED, "key-beta")  # the same two prompts, another tenant: still a hit
    assert other.headers["x-kvgate-cache"] == "semantic-hit"

    [line] = feedback_lines(tmp_path)
    assert {name: line[name] for name in ("a", "b", "label", "kind", "tenant")} == {
        "a": STORED,
        "b": REWORDED,
        "label": 0,
        "kind": "feedback",
        "tenant": "alpha",
    }
    stats = client.get("/admin/stats", headers=admin()).json()
    for window in ("since_start", "last_hour"):
        by_tenant = stats[window]["by_tenant"]
        assert (by_tenant["alpha"]["feedback_wrong"], by_tenant["alpha"]["feedback_right"]) == (1, 0)
        assert by_tenant["beta"]["feedback_wrong"] == 0
        assert stats[window]["overall"]["feedback_wrong"] == 1
    assert stats["since_start"]["overall"]["requests"] == 6  # a report is not a request

    console = Console(width=160, record=True)
    print_report(stats, console, "test")
    text = console.export_text()
    assert "Semantic hits reported" in text and "tenant alpha" in text
    assert "Semantic hits reported" in render_html(stats, "test")


def test_a_remembered_wording_reported_by_entry_id_is_forgotten(
    client: TestClient, backend: ScriptedBackend
) -> None:
    ask(client, STORED)
    assert ask(client, REWORDED).headers["x-kvgate-cache"] == "semantic-hit"
    remembered = ask(client, REWORDED)  # the wording now points at the entry: an exact hit
    assert remembered.headers["x-kvgate-cache"] == "exact-hit"

    reported = report(client, entry_id=remembered.headers["x-kvgate-entry-id"], verdict="wrong")
    assert reported.status_code == 200, reported.text
    assert reported.json()["request_id"] == remembered.headers["x-request-id"]  # the latest hit of the entry
    assert ask(client, REWORDED).headers["x-kvgate-cache"] == "miss"
    assert len(backend.calls) == 2


def test_a_hit_reported_right_is_kept_counted_and_still_served(client: TestClient, tmp_path: Path) -> None:
    ask(client, STORED)
    served = ask(client, REWORDED)
    reported = report(client, request_id=served.headers["x-request-id"], verdict="right", tenant="alpha")
    assert reported.status_code == 200 and reported.json()["vetoed"] is False
    assert ask(client, REWORDED).headers["x-kvgate-cache"] == "exact-hit"  # remembered, as before
    assert [(line["label"], line["b"]) for line in feedback_lines(tmp_path)] == [(1, REWORDED)]
    alpha = client.get("/admin/stats", headers=admin()).json()["since_start"]["by_tenant"]["alpha"]
    assert (alpha["feedback_wrong"], alpha["feedback_right"]) == (0, 1)


def test_a_report_that_cannot_be_kept_is_503_and_may_be_sent_again(
    client: TestClient, tmp_path: Path
) -> None:
    ask(client, STORED)
    served = ask(client, REWORDED)
    (tmp_path / FEEDBACK_FILE).mkdir()  # the file cannot be written
    failed = report(client, request_id=served.headers["x-request-id"], verdict="wrong")
    assert failed.status_code == 503 and error_of(failed)["type"] == "service_unavailable"
    (tmp_path / FEEDBACK_FILE).rmdir()
    again = report(client, request_id=served.headers["x-request-id"], verdict="wrong")
    assert again.status_code == 200, again.text
    assert len(feedback_lines(tmp_path)) == 1
    assert ask(client, REWORDED).headers["x-kvgate-cache"] == "miss"


@pytest.fixture(scope="module")
def shared(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestClient]:
    """One app for the bad reports (none of them changes anything)."""
    settings = make_settings(tmp_path_factory.mktemp("feedback"))
    with TestClient(create_app(settings, backend_factory=lambda _: ScriptedBackend())) as client:
        yield client


@pytest.fixture(scope="module")
def hits(shared: TestClient) -> dict[str, httpx.Response]:
    """An exact hit and two semantic hits (one already reported) on the shared app."""
    ask(shared, STORED)
    served = {"exact": ask(shared, STORED), "semantic": ask(shared, REWORDED)}
    ask(shared, EIFFEL)
    served["reported"] = ask(shared, EIFFEL_REWORDED)
    for name in ("semantic", "reported"):
        assert served[name].headers["x-kvgate-cache"] == "semantic-hit"
    assert report(shared, request_id=served["reported"].headers["x-request-id"], verdict="right").is_success
    return served


def error_of(response: httpx.Response) -> dict[str, Any]:
    error: dict[str, Any] = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["message"]
    return error


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"verdict": "wrong"}, "request_id"),  # names no hit
        ({"request_id": "abc", "verdict": "maybe"}, "verdict"),
        ({"request_id": "abc"}, "verdict"),
        ({"request_id": "", "verdict": "wrong"}, "request_id"),
        ({"request_id": "abc", "verdict": "wrong", "why": "it was bad"}, "why"),
        ({"request_id": 12, "verdict": "wrong"}, "request_id"),
    ],
)
def test_a_malformed_report_is_400(shared: TestClient, body: dict[str, Any], param: str) -> None:
    response = report(shared, **body)
    assert response.status_code == 400
    error = error_of(response)
    assert error["type"] == "invalid_request_error" and error["param"] == param


def test_a_body_that_is_not_json_is_400(shared: TestClient) -> None:
    response = shared.post(
        "/admin/feedback", content=b"{nope", headers=admin() | {"content-type": "application/json"}
    )
    assert response.status_code == 400 and error_of(response)["code"] == "invalid_json"


def test_a_hit_not_kept_is_404(shared: TestClient, hits: dict[str, httpx.Response]) -> None:
    exact = hits["exact"]
    for body in (
        {"request_id": "0123456789abcdef01234567"},  # unknown or expired
        {"entry_id": "no-such-entry"},
        {"request_id": exact.headers["x-request-id"]},  # an exact hit: no pair of prompts to report
        {"request_id": hits["semantic"].headers["x-request-id"], "tenant": "beta"},  # another tenant's
    ):
        response = report(shared, verdict="wrong", **body)
        assert response.status_code == 404, body
        assert error_of(response)["type"] == "not_found_error"


def test_ids_that_name_two_hits_are_422(shared: TestClient, hits: dict[str, httpx.Response]) -> None:
    response = report(
        shared,
        request_id=hits["semantic"].headers["x-request-id"],
        entry_id="another-entry",
        verdict="wrong",
    )
    assert response.status_code == 422 and error_of(response)["param"] == "entry_id"


def test_a_hit_is_reported_once(shared: TestClient, hits: dict[str, httpx.Response]) -> None:
    response = report(shared, request_id=hits["reported"].headers["x-request-id"], verdict="wrong")
    assert response.status_code == 409 and error_of(response)["code"] == "already_reported"
    assert ask(shared, EIFFEL_REWORDED).headers["x-kvgate-cache"] == "exact-hit"  # reported right: kept


@pytest.mark.parametrize(
    "headers", [{}, {"Authorization": "Bearer key-alpha"}, {"Authorization": "Bearer no"}]
)
def test_feedback_needs_the_admin_token(shared: TestClient, headers: dict[str, str]) -> None:
    response = shared.post("/admin/feedback", json={"request_id": "abc", "verdict": "wrong"}, headers=headers)
    assert response.status_code == 401 and error_of(response)["type"] == "authentication_error"


def test_every_feedback_answer_gets_an_access_line() -> None:
    """kvgate writes its own line for the completion routes only; uvicorn's covers /admin/feedback."""
    record = logging.makeLogRecord(
        {"msg": '%s - "%s %s HTTP/%s" %d', "args": ("127.0.0.1:1", "POST", "/admin/feedback", "1.1", 404)}
    )
    assert CoveredRoutes().filter(record)
