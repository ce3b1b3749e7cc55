"""Reverse-proxy mode with only `KVGATE_UPSTREAM_URL` set: kvgate lists and serves the upstream's own models
(a real upstream process), keeps the list fresh, passes names through when the upstream cannot list them,
and treats `KVGATE_UPSTREAM_MODELS` as an allow-list when it is given."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from gateway.http.app import create_app
from tests.gateway.conftest import make_settings
from tests.gateway.live_server import serve
from tests.gateway.upstream_server import upstream_process


@pytest.fixture
def upstream() -> Iterator[str]:
    with upstream_process() as base:
        yield base


def control(upstream: str, **state: Any) -> None:
    httpx.post(upstream + "/control/models", json=state, timeout=5.0).raise_for_status()


def gateway(tmp_path: Path, upstream: str, **overrides: Any) -> Any:
    settings = make_settings(tmp_path, api_keys=None, upstream_url=upstream + "/v1", **overrides)
    return serve(create_app(settings))


def ask(base: str, model: str, question: str = "What is kvgate?") -> httpx.Response:
    body = {"model": model, "messages": [{"role": "user", "content": question}]}
    return httpx.post(base + "/v1/chat/completions", json=body, timeout=10.0)


def test_models_are_discovered_with_no_setting(tmp_path: Path, upstream: str) -> None:
    with gateway(tmp_path, upstream) as base:
        with openai.OpenAI(base_url=base + "/v1", api_key="x", max_retries=0) as sdk:
            assert [model.id for model in sdk.models.list()] == ["up-small", "up-large"]
            first = sdk.chat.completions.with_raw_response.create(
                model="up-large", messages=[{"role": "user", "content": "What is kvgate?"}]
            )
            again = sdk.chat.completions.with_raw_response.create(
                model="up-large", messages=[{"role": "user", "content": "What is kvgate?"}]
            )
            assert first.headers["x-kvgate-cache"] == "miss"
            assert again.headers["x-kvgate-cache"] == "exact-hit"
            assert again.parse().choices[0].message.content == "up-large says: What is kvgate?"
            with pytest.raises(openai.NotFoundError) as refused:
                sdk.chat.completions.create(model="not-served", messages=[{"role": "user", "content": "Hi"}])
            assert refused.value.code == "model_not_found"
        assert httpx.get(base + "/healthz").json()["models_mode"] == "discovered"


def test_the_list_is_refreshed_and_a_failed_refresh_keeps_it(
    tmp_path: Path, upstream: str, caplog: pytest.LogCaptureFixture
) -> None:
    with gateway(tmp_path, upstream, upstream_models_refresh_s=0.2) as base:
        control(upstream, models=["up-small", "up-new"])
        wait_for_models(base, ["up-small", "up-new"])
        assert ask(base, "up-new").status_code == 200

        with caplog.at_level(logging.WARNING, logger="kvgate.upstream"):
            control(upstream, status=500)
            time.sleep(1.0)  # about five failed refreshes
        assert models_of(base) == ["up-small", "up-new"]
        assert ask(base, "up-new").status_code == 200
        failures = [record for record in caplog.records if "could not be read" in record.getMessage()]
        assert len(failures) == 1, [record.getMessage() for record in failures]

        control(upstream, status=200, models=["up-small"])
        wait_for_models(base, ["up-small"])
        assert ask(base, "up-new").status_code == 404


def test_an_upstream_that_cannot_list_gets_every_name_passed_through(tmp_path: Path, upstream: str) -> None:
    control(upstream, status=404)
    with gateway(tmp_path, upstream) as base:
        assert models_of(base) == []
        assert httpx.get(base + "/healthz").json()["models_mode"] == "pass-through"
        served = ask(base, "up-small")
        assert served.status_code == 200 and served.headers["x-kvgate-cache"] == "miss"
        assert ask(base, "up-small").headers["x-kvgate-cache"] == "exact-hit"
        refused = ask(base, "no-such-model")  # the upstream's own error, in OpenAI's shape
        assert refused.status_code == 404
        error = refused.json()["error"]
        assert error["code"] == "model_not_found" and "no-such-model" in error["message"]
        assert set(error) == {"message", "type", "param", "code"}


def test_a_given_list_is_an_allow_list(tmp_path: Path, upstream: str) -> None:
    with gateway(tmp_path, upstream, upstream_models="up-small") as base:
        assert models_of(base) == ["up-small"]
        assert httpx.get(base + "/healthz").json()["models_mode"] == "allow-list"
        assert ask(base, "up-small").status_code == 200
        calls = httpx.get(upstream + "/control/calls").json()["calls"]
        refused = ask(base, "up-large")  # the upstream serves it, the operator did not allow it
        assert refused.status_code == 404 and refused.json()["error"]["code"] == "model_not_found"
        assert httpx.get(upstream + "/control/calls").json()["calls"] == calls


def models_of(base: str) -> list[str]:
    return [card["id"] for card in httpx.get(base + "/v1/models").json()["data"]]


def wait_for_models(base: str, wanted: list[str], limit_s: float = 5.0) -> None:
    deadline = time.monotonic() + limit_s
    while (seen := models_of(base)) != wanted:
        assert time.monotonic() < deadline, f"still {seen}"
        time.sleep(0.05)
