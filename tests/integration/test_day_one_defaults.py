"""What a new user meets with the default settings, through the official openai client, a real server, the
real SmolLM2 engine and the embedded store: a repeat of a `max_tokens`-limited request is an exact hit that
replays `finish_reason: "length"`, and the metrics and the hit-rate report count it; `kvgate report` on the
same machine reads the admin token the gateway wrote, which nobody else is let in without. An aborted stream
is still never stored."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from gateway.http.app import create_app
from gateway.runtime.settings import Settings
from tests.gateway.live_server import serve
from tests.integration.streams import leave_after_first_token

pytestmark = pytest.mark.slow

MODEL = "smollm2-135m-instruct"


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("day-one")


@pytest.fixture(scope="module")
def base_url(data_dir: Path) -> Iterator[str]:
    # Only what a user must set: where files go, and a smaller KV pool for the test machine.
    settings = Settings(data_dir=data_dir, kv_cache_tokens=4096)
    with serve(create_app(settings)) as url:
        yield url


def admin_token(data_dir: Path) -> str:
    return (data_dir / "admin_token").read_text().strip()


def ask(client: openai.OpenAI, question: str, **fields: Any) -> tuple[str, Any]:
    raw = client.chat.completions.with_raw_response.create(
        model=MODEL, messages=[{"role": "user", "content": question}], max_tokens=6, **fields
    )
    return raw.headers["x-kvgate-cache"], raw.parse()


def test_a_repeat_of_a_length_limited_request_is_an_exact_hit(
    client: openai.OpenAI, base_url: str, data_dir: Path
) -> None:
    question = "Explain in detail how a rainbow forms."
    cache, cold = ask(client, question)
    assert cache == "miss" and cold.choices[0].finish_reason == "length"
    cache, again = ask(client, question)
    assert cache == "exact-hit"
    assert again.choices[0].finish_reason == "length"
    assert again.choices[0].message.content == cold.choices[0].message.content
    assert again.usage.completion_tokens == cold.usage.completion_tokens == 6

    streamed = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": question}], max_tokens=6, stream=True
    )
    chunks = list(streamed)
    text = "".join(chunk.choices[0].delta.content or "" for chunk in chunks if chunk.choices)
    assert text == cold.choices[0].message.content
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"

    metrics = httpx.get(base_url + "/metrics").text
    assert any(
        line.startswith("kvgate_requests_total{")
        and 'cache="exact_hit"' in line
        and not line.endswith(" 0.0")
        for line in metrics.splitlines()
    ), "no exact_hit series after the same request twice"
    stats = httpx.get(
        base_url + "/admin/stats", headers={"Authorization": f"Bearer {admin_token(data_dir)}"}
    ).json()
    assert stats["since_start"]["overall"]["exact_hit"] >= 2
    assert stats["since_start"]["overall"]["tokens_saved"] > 0


def test_an_aborted_stream_is_not_stored(base_url: str) -> None:
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "Write a long story about a lighthouse keeper."}],
        "max_tokens": 200,
    }
    leave_after_first_token(base_url, body)  # aborted, not finished by length: nothing to store
    again = httpx.post(base_url + "/v1/chat/completions", json=body, timeout=120)
    assert again.status_code == 200 and again.headers["x-kvgate-cache"] == "miss"


def test_the_report_reads_the_token_the_gateway_wrote_and_nobody_gets_in_without_it(
    base_url: str, data_dir: Path
) -> None:
    path = data_dir / "admin_token"
    assert path.stat().st_mode & 0o777 == 0o600  # the owner's only
    assert httpx.get(base_url + "/admin/stats").status_code == 401
    assert httpx.get(base_url + "/admin/stats", headers={"Authorization": "Bearer guess"}).status_code == 401

    env = {name: value for name, value in os.environ.items() if not name.startswith("KVGATE_")}
    report = subprocess.run(
        [str(Path(sys.executable).parent / "kvgate"), "report", "--url", base_url],
        env=env | {"KVGATE_DATA_DIR": str(data_dir)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert report.returncode == 0, report.stdout + report.stderr
    assert "kvgate hit-rate report" in report.stdout
