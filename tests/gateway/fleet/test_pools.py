"""Issue 47, pools per model, on real processes: three model servers, each its own pool, behind one kvgate.

Each model's requests reach only its pool (under the name the server knows: LiteLLM's provider prefix
dropped); an unknown model is OpenAI's 404; `/v1/models` is the union; cache scopes stay per model. The
upstreams file is re-read when it changes, without dropping the requests in flight; a shadow member gets
a copy of the traffic and never answers; a `dns+` name becomes one member per address.
"""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from rich.console import Console

from gateway.observability.report import fetch_stats, print_report
from tests.gateway.conftest import ADMIN_TOKEN
from tests.gateway.fleet.conftest import UNCACHED, gateway, model_servers
from tests.gateway.fleet.fleet_upstream import ModelServer

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def servers() -> Iterator[list[ModelServer]]:
    with model_servers(["small-a"], ["large-b"], ["coder-c"], ["coder-c"]) as started:
        yield started


def model_list(servers: list[ModelServer]) -> dict[str, Any]:
    """gpt-small -> server 0, gpt-large -> server 1, coder -> server 2 (server 3 its shadow)."""
    return {
        "model_list": [
            {
                "model_name": "gpt-small",
                "litellm_params": {"model": "openai/small-a", "api_base": servers[0].url},
            },
            {
                "model_name": "gpt-large",
                "litellm_params": {"model": "hosted_vllm/large-b", "api_base": servers[1].url},
            },
            {"model_name": "coder", "litellm_params": {"model": "coder-c", "api_base": servers[2].url}},
            {
                "model_name": "coder",
                "litellm_params": {"model": "coder-c", "api_base": servers[3].url},
                "shadow": True,
            },
        ]
    }


def ask(
    client: httpx.Client, model: str, content: str, headers: dict[str, str] | None = None
) -> httpx.Response:
    body = {"model": model, "messages": [{"role": "user", "content": content}]}
    return client.post("/v1/chat/completions", json=body, headers=UNCACHED if headers is None else headers)


def test_each_model_reaches_only_its_pool(tmp_path: Path, servers: list[ModelServer]) -> None:
    upstreams = tmp_path / "upstreams.yaml"
    upstreams.write_text(yaml.safe_dump(model_list(servers)))
    before = [server.calls()["models"] for server in servers]
    with gateway(tmp_path, upstreams_file=upstreams) as url, httpx.Client(base_url=url, timeout=30) as client:
        listed = [card["id"] for card in client.get("/v1/models").json()["data"]]
        answers = {
            model: ask(client, model, f"which pool answers {model}?") for model in listed for _ in range(3)
        }
        unknown = ask(client, "gpt-9", "hello")
        fleet = client.get("/healthz").json()["fleet"]
        first = ask(client, "gpt-small", "the same question", headers={})  # cached per model from here on
        again = ask(client, "gpt-small", "the same question", headers={})
        other = ask(client, "gpt-large", "the same question", headers={})
        time.sleep(0.5)  # the shadow copies run after the answers
        shadow = client.get("/healthz").json()["fleet"]["pools"][2]["backends"][1]
        metrics = client.get("/metrics").text
        console = Console(record=True, width=200)
        print_report(fetch_stats(url, ADMIN_TOKEN), console, url)
        report = console.export_text()

    assert listed == ["gpt-small", "gpt-large", "coder"]
    for server, model in zip(servers, ["small-a", "large-b", "coder-c", "coder-c"], strict=True):
        assert answers and set(server.calls()["models"]) == {model}  # the name the server knows, nothing else
    added = [
        server.calls()["models"][model] - old.get(model, 0)
        for server, model, old in zip(
            servers, ["small-a", "large-b", "coder-c", "coder-c"], before, strict=True
        )
    ]
    assert added[:3] == [
        4,
        4,
        3,
    ]  # three each, and the same question once to two models; the shadow got copies
    assert added[3] >= 3
    for model, response in answers.items():
        assert response.status_code == 200 and response.headers["x-kvgate-cache"] == "bypass"
        pool = listed.index(model)
        assert response.headers["x-kvgate-backend"] == servers[pool].name  # never the shadow
    assert unknown.status_code == 404
    assert unknown.json() == {
        "error": {
            "message": "The model 'gpt-9' does not exist.",
            "type": "not_found_error",
            "param": "model",
            "code": "model_not_found",
        }
    }
    assert [pool["name"] for pool in fleet["pools"]] == listed
    assert all(backend["state"] == "healthy" for pool in fleet["pools"] for backend in pool["backends"])
    assert (
        first.headers["x-kvgate-cache"],
        again.headers["x-kvgate-cache"],
        other.headers["x-kvgate-cache"],
    ) == ("miss", "exact-hit", "miss")
    assert "x-kvgate-backend" not in again.headers  # a hit reached no backend
    assert shadow["shadow"] is True
    assert shadow["shadow_answers"]["compared"] >= 3 and shadow["shadow_answers"]["errors"] == 0
    assert f'kvgate_backend_requests_total{{backend="{servers[0].name}",pool="gpt-small"}} 4.0' in metrics
    assert "Backends" in report and f"{servers[3].name} (shadow)" in report


def test_the_upstreams_file_is_read_again_without_dropping_requests(
    tmp_path: Path, servers: list[ModelServer]
) -> None:
    config = model_list(servers)
    upstreams = tmp_path / "upstreams.yaml"
    upstreams.write_text(yaml.safe_dump(config))
    with gateway(tmp_path, upstreams_file=upstreams) as url:
        result = asyncio.run(_reload_under_load(url, upstreams, config, servers))
    assert result["failed"] == []
    assert result["models_after"] == ["gpt-small", "gpt-large", "coder", "gpt-small-2"]
    assert result["new_pool_backend"] == servers[1].name  # the new pool answers from where the file says
    assert result["seconds_to_apply"] < 5


def test_a_dns_name_becomes_one_member_per_address(tmp_path: Path, servers: list[ModelServer]) -> None:
    port = servers[0].port
    addresses = sorted(
        {info[4][0] for info in socket.getaddrinfo("localhost", port, type=socket.SOCK_STREAM)}
    )
    with (
        gateway(tmp_path, upstream_url=f"dns+http://localhost:{port}/v1") as url,
        httpx.Client(base_url=url) as client,
    ):
        backends = client.get("/healthz").json()["fleet"]["pools"][0]["backends"]
        answer = ask(client, "small-a", "found by name")
    assert sorted(backend["name"] for backend in backends) == sorted(
        f"localhost/{_bracketed(a)}:{port}" for a in addresses
    )
    assert answer.status_code == 200 and answer.headers["x-kvgate-backend"] == f"localhost/127.0.0.1:{port}"


async def _reload_under_load(
    url: str, upstreams: Path, config: dict[str, Any], servers: list[ModelServer]
) -> dict[str, Any]:
    """8 loops of misses on gpt-small while a pool is added to the file."""
    failed: list[str] = []
    done = asyncio.Event()
    async with httpx.AsyncClient(base_url=url, timeout=30) as client:

        async def loop(index: int) -> None:
            turn = 0
            while not done.is_set():
                turn += 1
                body = {"model": "gpt-small", "messages": [{"role": "user", "content": f"{index}/{turn}"}]}
                response = await client.post("/v1/chat/completions", json=body, headers=UNCACHED)
                if response.status_code != 200:
                    failed.append(response.text[:200])

        async def change() -> dict[str, Any]:
            await asyncio.sleep(0.5)
            added = {
                "model_name": "gpt-small-2",
                "litellm_params": {"model": "large-b", "api_base": servers[1].url},
            }
            upstreams.write_text(yaml.safe_dump({"model_list": [*config["model_list"], added]}))
            changed = time.monotonic()
            while True:
                listed = [card["id"] for card in (await client.get("/v1/models")).json()["data"]]
                if "gpt-small-2" in listed:
                    break
                await asyncio.sleep(0.05)
            applied = time.monotonic() - changed
            body = {"model": "gpt-small-2", "messages": [{"role": "user", "content": "new pool"}]}
            answer = await client.post("/v1/chat/completions", json=body, headers=UNCACHED)
            await asyncio.sleep(0.5)
            done.set()
            return {
                "models_after": listed,
                "seconds_to_apply": applied,
                "new_pool_backend": answer.headers.get("x-kvgate-backend"),
            }

        found, *_ = await asyncio.gather(change(), *(loop(index) for index in range(8)))
    return found | {"failed": failed}


def _bracketed(address: str) -> str:
    return f"[{address}]" if ":" in address else address
