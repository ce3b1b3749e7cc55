"""Circuit breakers: the state machine on a fake clock, then a real failing upstream on loopback."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from fastapi.testclient import TestClient

from gateway.api.errors import ServiceUnavailable, UpstreamFailed
from gateway.backends.protocol import Finished, GenerationRequest
from gateway.backends.upstream import UpstreamBackend
from gateway.http.app import create_app
from gateway.traffic.breaker import BreakerState, CircuitBreaker
from tests.gateway.conftest import make_settings
from tests.gateway.live_server import serve
from tests.gateway.openai_upstream import reply, text_whole

MODEL = "upstream-llm"


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_state_machine_opens_sheds_half_opens_and_closes() -> None:
    clock = FakeClock()
    changes: list[BreakerState] = []
    breaker = CircuitBreaker(
        "upstream", failure_threshold=3, cooldown_s=5.0, clock=clock, on_change=lambda _, s: changes.append(s)
    )
    for _ in range(2):
        assert breaker.allow()
        breaker.record_failure()
    for _ in range(3):
        breaker.record_success()
    assert breaker.state is BreakerState.CLOSED
    # 3 of 6 calls in the window failed: the threshold and 50% (a success no longer resets a count of
    # consecutive failures: the rate over the window decides, issue 46)
    breaker.record_failure()
    assert breaker.state is BreakerState.OPEN and not breaker.allow()
    with pytest.raises(ServiceUnavailable) as shed:
        breaker.check()
    assert shed.value.status_code == 503 and shed.value.headers["Retry-After"] == "5"

    clock.now += 5.0
    assert breaker.allow() and breaker.state is BreakerState.HALF_OPEN
    assert not breaker.allow()  # one probe at a time
    breaker.record_failure()
    assert breaker.state is BreakerState.OPEN and not breaker.allow()
    clock.now += 5.0
    assert breaker.allow()
    breaker.record_success()
    assert breaker.state is BreakerState.CLOSED and breaker.allow()
    assert changes == [
        BreakerState.OPEN,
        BreakerState.HALF_OPEN,
        BreakerState.OPEN,
        BreakerState.HALF_OPEN,
        BreakerState.CLOSED,
    ]


def make_flaky_upstream(mode: dict[str, str], calls: list[str]) -> FastAPI:
    upstream = FastAPI()

    @upstream.post("/v1/chat/completions")
    async def chat(request: Request) -> Any:
        calls.append(request.headers.get("traceparent") or "")
        if mode["now"] == "fail":
            return JSONResponse({"error": {"message": "boom", "type": "server_error"}}, status_code=500)
        if mode["now"] == "stall":
            await asyncio.sleep(3.0)

        return reply(await request.json(), text_whole(MODEL, "fine", 3, 1), chat=True)

    return upstream


def ask(client: TestClient, text: str) -> httpx.Response:
    body = {"model": MODEL, "messages": [{"role": "user", "content": text}]}
    return client.post("/v1/chat/completions", json=body)


@pytest.mark.slow
def test_breaker_opens_sheds_fast_half_opens_and_closes(tmp_path: Path) -> None:
    mode = {"now": "fail"}
    calls: list[str] = []
    with serve(make_flaky_upstream(mode, calls)) as upstream_url:
        settings = make_settings(
            tmp_path,
            api_keys=None,
            upstream_url=upstream_url + "/v1",
            upstream_models=MODEL,
            upstream_timeout_s=0.5,
            breaker_failures=3,
            breaker_cooldown_s=1.0,
        )
        with TestClient(create_app(settings)) as client:
            failures = [ask(client, f"fail {n}").status_code for n in range(2)]
            mode["now"] = "stall"
            failures.append(ask(client, "stall").status_code)  # a timeout counts as a failure too
            assert failures == [500, 500, 504]
            assert client.get("/readyz").json()["breakers"]["upstream"]["state"] == "open"
            assert 'kvgate_breaker_state{breaker="upstream"} 2.0' in client.get("/metrics").text

            upstream_calls = len(calls)
            started = time.perf_counter()
            shed = ask(client, "while open")
            shed_s = time.perf_counter() - started
            assert shed.status_code == 503 and shed.json()["error"]["code"] == "circuit_open"
            assert shed.json()["error"]["type"] == "service_unavailable" and "retry-after" in shed.headers
            assert shed_s < 0.25 and len(calls) == upstream_calls  # shed without calling the upstream

            mode["now"] = "ok"
            time.sleep(1.05)
            probe = ask(client, "probe")
            assert probe.status_code == 200 and probe.json()["choices"][0]["message"]["content"] == "fine"
            assert client.get("/readyz").json()["breakers"]["upstream"]["state"] == "closed"
            assert 'kvgate_breaker_state{breaker="upstream"} 0.0' in client.get("/metrics").text
            assert ask(client, "after").status_code == 200


def generation(text: str = "hi") -> GenerationRequest:
    body = {"model": MODEL, "messages": [{"role": "user", "content": text}]}
    return GenerationRequest(
        "r1", "t", MODEL, body["messages"], None, 8, 0.0, 1.0, None, [], body=body, stream=True
    )  # type: ignore[arg-type]


async def drain(backend: UpstreamBackend) -> list[Any]:
    return [event async for event in backend.generate(generation())]


async def test_connection_refused_is_retried_but_a_sent_request_never_is() -> None:
    attempts: list[str] = []

    def refuse_twice(request: httpx.Request) -> httpx.Response:
        attempts.append("connect")
        if len(attempts) <= 2:
            raise httpx.ConnectError("refused", request=request)
        body = (
            'data: {"choices": [{"delta": {"content": "ok"}, "finish_reason": "stop"}]}\n\ndata: [DONE]\n\n'
        )
        return httpx.Response(200, text=body, headers={"content-type": "text/event-stream"})

    backend = UpstreamBackend(
        "http://upstream.invalid/v1", None, [MODEL], transport=httpx.MockTransport(refuse_twice)
    )
    events = await drain(backend)
    assert len(attempts) == 3 and isinstance(events[-1], Finished)
    await backend.close()

    sent: list[str] = []

    def drop_after_send(request: httpx.Request) -> httpx.Response:
        sent.append("sent")
        raise httpx.ReadError("connection reset", request=request)

    backend = UpstreamBackend(
        "http://upstream.invalid/v1", None, [MODEL], transport=httpx.MockTransport(drop_after_send)
    )
    with pytest.raises(UpstreamFailed) as failed:
        await drain(backend)
    assert failed.value.status_code == 502 and sent == ["sent"]  # not idempotent once sent: no retry
    await backend.close()
