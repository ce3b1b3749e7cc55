"""Issue 46, item 5: kvgate stays up when the upstream wobbles, and says so when it is down.

First the pieces on a fake clock or a mock transport (the breaker's failure-rate rule, which failed attempts
are sent again), then real processes: 32 concurrent misses through kvgate to a stub whose listen backlog
is 5 (every answer 200, the breaker never opens), and an upstream that is down (the breaker opens,
/readyz says so, misses are shed fast and the half-open probe asks once).
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from gateway.api.errors import UpstreamFailed
from gateway.backends.protocol import Finished, GenerationRequest, Whole
from gateway.backends.upstream import UpstreamBackend
from gateway.backends.upstream_retry import REFUSED_BUDGET_S, RetryPolicy
from gateway.http.app import create_app
from gateway.traffic.breaker import BreakerState, CircuitBreaker
from tests.gateway.backlog_upstream import MODEL, NO_STORE, backlog_upstream, miss_load
from tests.gateway.conftest import make_settings
from tests.gateway.live_server import serve
from tests.reliability.redis_proc import free_port

LOAD_S = 10.0  # the issue measured 30 s (bench/gateway/bench_upstream_wobble.py); 10 keeps `make test` short
CLIENTS = 32


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def make_breaker(clock: FakeClock, **overrides: Any) -> CircuitBreaker:
    values: dict[str, Any] = {"failure_threshold": 5, "cooldown_s": 2.0, "window_s": 10.0, "clock": clock}
    return CircuitBreaker("upstream", **(values | overrides))


def test_a_burst_of_failures_among_successes_does_not_open_the_breaker() -> None:
    clock = FakeClock()
    breaker = make_breaker(clock)
    for _ in range(95):
        breaker.record_success()
    for _ in range(8):  # eight in a row: the old rule (5 consecutive) opened here
        breaker.record_failure()
    assert breaker.state is BreakerState.CLOSED
    assert breaker.describe() == {"state": "closed", "window_s": 10.0, "calls": 103, "failures": 8}


def test_a_sustained_failure_rate_opens_it_and_old_calls_slide_out_of_the_window() -> None:
    clock = FakeClock()
    breaker = make_breaker(clock)
    for _ in range(10):
        breaker.record_success()
    clock.now += 10.0  # those successes leave the window
    for _ in range(4):
        breaker.record_failure()
    breaker.record_success()
    assert breaker.state is BreakerState.CLOSED  # 4 failures: under the threshold of 5
    breaker.record_failure()  # 5 of 6 failed
    assert breaker.state is BreakerState.OPEN and not breaker.allow()
    assert breaker.describe()["retry_after_s"] == 2.0


def test_a_dead_dependency_opens_it_after_the_threshold_and_half_open_probes_once() -> None:
    clock = FakeClock()
    breaker = make_breaker(clock)
    for _ in range(5):
        breaker.record_failure()
    assert breaker.state is BreakerState.OPEN
    breaker.record_success()  # let through before it opened: ignored, the probe decides
    breaker.record_failure()  # ignored too: the cool-down runs from the opening
    clock.now += 2.0
    assert breaker.allow() and breaker.state is BreakerState.HALF_OPEN and not breaker.allow()
    breaker.record_success()
    assert breaker.state is BreakerState.CLOSED
    assert breaker.describe()["calls"] == 0  # a fresh window: the failures that opened it are history


def test_retry_policy_sends_again_only_what_the_upstream_cannot_have_acted_on() -> None:
    request = httpx.Request("POST", "http://upstream.invalid/v1/chat/completions")
    refused = httpx.ConnectError("refused", request=request)
    reset = httpx.ReadError("reset", request=request)
    late = httpx.ReadTimeout("no answer", request=request)
    policy = RetryPolicy(budget_s=10.0)

    stream = policy.start(replayable=False)
    assert stream.backoff_s(refused) is not None  # nothing was sent: any request goes again
    assert stream.backoff_s(reset) is None  # a stream that was sent never does
    json_request = policy.start(replayable=True)
    assert json_request.backoff_s(reset) is not None  # no byte of the answer yet: a JSON request does
    assert json_request.backoff_s(late) is None  # waiting for the answer timed out: never
    assert policy.start(replayable=False).backoff_s(refused, body_untouched=False) is None
    assert policy.start(replayable=True, retry=False).backoff_s(refused) is None  # a half-open probe

    many = policy.start(replayable=True)
    waits = [many.backoff_s(refused) for _ in range(40)]
    assert all(wait is not None and 0 <= wait <= 1.0 for wait in waits)  # a deadline, not a small count
    assert RetryPolicy(budget_s=0.0).start(replayable=True).backoff_s(refused) is None
    slow = RetryPolicy(budget_s=4.0).start(replayable=True)
    assert slow.connect_timeout_s() == 1.5  # past the first SYN retransmission, then a fresh SYN
    slow.backoff_s(refused)
    assert slow.connect_timeout_s() == 3.0  # doubled: a slow handshake still completes
    slow.backoff_s(refused)
    assert 3.5 < slow.connect_timeout_s() < 4.0  # never past the deadline
    capped = RetryPolicy(budget_s=10.0, max_retries=1).start(replayable=True)
    assert capped.backoff_s(refused) is not None and capped.backoff_s(refused) is None


def test_a_refused_connection_is_tried_for_a_second_a_dropped_one_until_the_deadline() -> None:
    request = httpx.Request("POST", "http://upstream.invalid/v1/chat/completions")
    refused = httpx.ConnectError("[Errno 111] Connection refused", request=request)
    dropped = httpx.ConnectTimeout("timed out", request=request)  # a full accept queue drops the SYN
    late = RetryPolicy(budget_s=10.0).start(replayable=True)
    late.started_at -= REFUSED_BUDGET_S + 0.5
    assert late.backoff_s(refused) is None  # nothing listens: the upstream is down, say so now
    assert late.backoff_s(dropped) is not None  # overloaded: keep trying within the deadline


def json_generation(text: str = "hi") -> GenerationRequest:
    messages = [{"role": "user", "content": text}]
    body = {"model": MODEL, "messages": messages}
    return GenerationRequest("r1", "t", MODEL, messages, None, 8, 0.0, 1.0, None, [], body=body, stream=False)


async def test_a_json_request_reset_before_its_answer_is_sent_again_and_counts_once() -> None:
    attempts: list[str] = []

    def reset_three_times(request: httpx.Request) -> httpx.Response:
        attempts.append("sent")
        if len(attempts) <= 3:
            raise httpx.ReadError("connection reset by peer", request=request)
        return httpx.Response(
            200, json={"choices": [{"message": {"content": "ok"}, "finish_reason": "stop"}]}
        )

    clock = FakeClock()
    breaker = make_breaker(clock, failure_threshold=1)
    backend = UpstreamBackend(
        "http://upstream.invalid/v1",
        None,
        [MODEL],
        transport=httpx.MockTransport(reset_three_times),
        breaker=breaker,
    )
    events = [event async for event in backend.generate(json_generation())]
    await backend.close()
    assert len(attempts) == 4 and isinstance(events[0], Whole) and isinstance(events[-1], Finished)
    assert breaker.state is BreakerState.CLOSED  # a request whose retry succeeded is a success
    assert breaker.describe() == {"state": "closed", "window_s": 10.0, "calls": 1, "failures": 0}


async def test_refusals_are_retried_until_the_connect_deadline_then_fail_once() -> None:
    attempts: list[float] = []

    def refuse(request: httpx.Request) -> httpx.Response:
        attempts.append(time.monotonic())
        raise httpx.ConnectError("connection refused", request=request)

    breaker = make_breaker(FakeClock())
    backend = UpstreamBackend(
        "http://upstream.invalid/v1",
        None,
        [MODEL],
        transport=httpx.MockTransport(refuse),
        breaker=breaker,
        connect_timeout_s=0.5,
    )
    with pytest.raises(UpstreamFailed) as failed:
        [event async for event in backend.generate(json_generation())]
    await backend.close()
    assert failed.value.status_code == 502 and failed.value.code == "upstream_unreachable"
    assert len(attempts) > 3 and attempts[-1] - attempts[0] < 0.5  # more than the old two retries, in time
    assert breaker.describe()["failures"] == 1


@pytest.mark.slow
@pytest.mark.parametrize("keep_alive", [True, False], ids=["keep-alive", "connection-per-request"])
def test_32_concurrent_misses_through_an_upstream_with_a_backlog_of_5_all_answer(
    tmp_path: Path, keep_alive: bool
) -> None:
    with backlog_upstream(keep_alive=keep_alive) as upstream_url:
        settings = make_settings(
            tmp_path, api_keys=None, upstream_url=upstream_url + "/v1", upstream_models=MODEL
        )
        with serve(create_app(settings)) as base:
            report = asyncio.run(miss_load(base, clients=CLIENTS, duration_s=LOAD_S))

    assert report.requests > 10 * CLIENTS
    assert report.not_ok == {}, f"{report.not_ok} ({dict(report.errors)}) of {report.requests}"
    assert not report.breaker_opened, report.breaker_states


@pytest.mark.slow
def test_an_upstream_that_is_down_opens_the_breaker_and_readyz_says_so(tmp_path: Path) -> None:
    down = f"http://127.0.0.1:{free_port()}/v1"  # nothing listens there
    settings = make_settings(tmp_path, api_keys=None, upstream_url=down, upstream_models=MODEL)
    body = {"model": MODEL, "messages": [{"role": "user", "content": "anyone there?"}]}
    app = create_app(settings)
    with serve(app) as base:

        async def misses(count: int) -> list[tuple[int, str, float]]:
            async with httpx.AsyncClient(base_url=base, timeout=60.0) as client:

                async def one() -> tuple[int, str, float]:
                    started = time.monotonic()
                    response = await client.post("/v1/chat/completions", json=body, headers=NO_STORE)
                    return response.status_code, response.json()["error"]["code"], time.monotonic() - started

                return await asyncio.gather(*(one() for _ in range(count)))

        ready = httpx.get(base + "/readyz").json()
        assert ready["status"] == "ready" and ready["upstream"] == "up"

        failed = asyncio.run(misses(6))  # each retries until the 10 s connect deadline, then fails once
        assert {(status, code) for status, code, _ in failed} == {(502, "upstream_unreachable")}
        readyz = httpx.get(base + "/readyz")
        assert readyz.status_code == 200  # hits still flow: a replica stays in rotation
        ready = readyz.json()
        assert ready["status"] == "degraded" and ready["upstream"] == "open"
        assert ready["breakers"]["upstream"]["state"] == "open"

        [(status, code, shed_s)] = asyncio.run(misses(1))
        assert (status, code) == (503, "circuit_open") and shed_s < 0.5  # shed without calling it

        time.sleep(app.state.settings.breaker_cooldown_s)
        [(status, code, probe_s)] = asyncio.run(misses(1))
        assert (status, code) == (502, "upstream_unreachable") and probe_s < 1.0  # the probe asks once
        ready = httpx.get(base + "/readyz").json()
        assert ready["status"] == "degraded" and ready["upstream"] == "open"
