"""Request priority end to end: the `x-kvgate-priority` header, clamped by the tenant's `max_priority`
(`KVGATE_TENANT_LIMITS`), reaches the real SmolLM2 engine's scheduler, which admits high priority first
when it is saturated, while every low-priority request still finishes.

The engine runs two sequences at once (`engine_max_num_seqs=2`), so a burst of low-priority streams queues
inside it; high-priority streams sent after them overtake the queued ones. Time to first token is measured
from the client's side (first content chunk); the engine's own order of first tokens is checked too, since
that is what the scheduler decides and it does not depend on timing.
"""

from __future__ import annotations

import asyncio
import json
import statistics
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest
from fastapi import FastAPI

from engine.engine import LLMEngine
from engine.request_output import RequestOutput
from gateway.http.app import create_app
from gateway.runtime.settings import Settings
from tests.gateway.live_server import serve

pytestmark = pytest.mark.slow

MODEL = "smollm2-135m-instruct"
MAX_NUM_SEQS = 2
NUM_LOW = 6
NUM_HIGH = 3
MAX_TOKENS = 16
NAMES = ["Ash", "Birch", "Cedar", "Dune", "Ember", "Fern", "Gale", "Heath", "Iris", "Juniper", "Kestrel"]
UNCACHED = {"cache-control": "no-store, no-cache"}  # the semantic cache never answers, nor coalesces


@dataclass
class StepRecorder:
    """Wraps the engine's `step` (on the engine thread): each request's priority as the scheduler holds
    it, the step of its first token, and which requests were waiting when each one first showed up."""

    engine: LLMEngine
    steps: int = 0
    priority: dict[str, int] = field(default_factory=dict)
    arrival_step: dict[str, int] = field(default_factory=dict)
    first_token_step: dict[str, int] = field(default_factory=dict)
    waiting_at_arrival: dict[str, set[str]] = field(default_factory=dict)

    def install(self) -> None:
        original = self.engine.step

        def step() -> list[RequestOutput]:
            scheduler = self.engine.scheduler
            waiting = {sequence.request_id for sequence in scheduler.waiting}
            for sequence in [*scheduler.waiting, *scheduler.running]:
                if sequence.request_id not in self.priority:
                    self.priority[sequence.request_id] = sequence.priority
                    self.arrival_step[sequence.request_id] = self.steps
                    self.waiting_at_arrival[sequence.request_id] = waiting - {sequence.request_id}
            outputs = original()
            for output in outputs:
                if output.token_ids and output.request_id not in self.first_token_step:
                    self.first_token_step[output.request_id] = self.steps
            self.steps += 1
            return outputs

        self.engine.step = step  # type: ignore[method-assign]


@dataclass(frozen=True)
class Result:
    ttft_s: float
    finish_reason: str | None
    text: str


@pytest.fixture(scope="module")
def app(tmp_path_factory: pytest.TempPathFactory) -> FastAPI:
    with pytest.MonkeyPatch.context() as env:
        # As an operator would set it: the open tenant may ask for priority up to 2 (its default stays 0).
        env.setenv("KVGATE_TENANT_LIMITS", json.dumps({"default": {"max_priority": 2}}))
        settings = Settings(
            data_dir=tmp_path_factory.mktemp("priority"),
            kv_cache_tokens=4096,
            default_max_tokens=MAX_TOKENS,
            engine_max_num_seqs=MAX_NUM_SEQS,
        )
    assert settings.tenant_limits["default"].max_priority == 2
    return create_app(settings)


@pytest.fixture(scope="module")
def base_url(app: FastAPI) -> Iterator[str]:
    with serve(app) as url:
        yield url


async def stream_story(http: httpx.AsyncClient, name: str, priority: str | None) -> Result:
    body: dict[str, Any] = {
        "model": MODEL,
        "messages": [{"role": "user", "content": f"Write a long story about a dragon named {name}."}],
        "temperature": 0,
        "max_tokens": MAX_TOKENS,
        "stream": True,
    }
    headers = dict(UNCACHED)
    if priority is not None:
        headers["x-kvgate-priority"] = priority
    started = time.monotonic()
    ttft: float | None = None
    finish_reason: str | None = None
    text = ""
    async with http.stream("POST", "/v1/chat/completions", json=body, headers=headers) as response:
        assert response.status_code == 200, await response.aread()
        async for line in response.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            for choice in json.loads(line.removeprefix("data: "))["choices"]:
                content = choice["delta"].get("content") or ""
                if content and ttft is None:
                    ttft = time.monotonic() - started
                text += content
                finish_reason = choice.get("finish_reason") or finish_reason
    assert ttft is not None, f"no content streamed for {name}"
    return Result(ttft, finish_reason, text)


async def wait_until(condition: Any, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "timed out waiting for the engine"
        await asyncio.sleep(0.005)


@pytest.mark.alone  # compares times to first token: under pytest-xdist, no other test shares the cores
async def test_high_priority_overtakes_a_saturated_engine(app: FastAPI, base_url: str) -> None:
    recorder = StepRecorder(app.state.backend.client.engine)
    async with httpx.AsyncClient(base_url=base_url, timeout=60) as http:
        await stream_story(http, "Warmup", None)  # first forward passes and lazy set-up out of the way
        recorder.install()

        low_names, high_names = NAMES[:NUM_LOW], NAMES[NUM_LOW : NUM_LOW + NUM_HIGH]
        lows = [asyncio.create_task(stream_story(http, name, None)) for name in low_names]
        # Every low request is in the engine (two running, the rest queued) before any high one is sent.
        await wait_until(lambda: len(recorder.priority) >= NUM_LOW, 20)
        # "9" is above the tenant's max_priority: clamped to 2, not refused.
        highs = [
            asyncio.create_task(stream_story(http, name, "9" if index == 0 else "2"))
            for index, name in enumerate(high_names)
        ]
        low_results, high_results = await asyncio.wait_for(
            asyncio.gather(asyncio.gather(*lows), asyncio.gather(*highs)), timeout=75
        )

    low_ttft = sorted(result.ttft_s for result in low_results)
    high_ttft = sorted(result.ttft_s for result in high_results)
    print(f"\nlow-priority TTFT (s):  {[round(value, 3) for value in low_ttft]}")
    print(f"high-priority TTFT (s): {[round(value, 3) for value in high_ttft]}")
    print(f"engine steps: {recorder.steps}; first-token step: {recorder.first_token_step}")

    # Every request, low priority included, finished normally.
    for result in [*low_results, *high_results]:
        assert result.finish_reason in {"stop", "length"} and result.text

    # The header reached the engine, clamped to the tenant's maximum; no header means the tenant's default.
    priorities = sorted(recorder.priority.values())
    assert priorities == [0] * NUM_LOW + [2] * NUM_HIGH

    # The scheduler's decision: low requests still queued when the last high one arrived got their first
    # token no earlier than every high one (at most in the same step, when a slot frees for both).
    high_ids = [request_id for request_id, value in recorder.priority.items() if value == 2]
    last_high = max(high_ids, key=lambda request_id: recorder.arrival_step[request_id])
    overtaken = recorder.waiting_at_arrival[last_high] - set(high_ids)
    assert len(overtaken) >= NUM_LOW - MAX_NUM_SEQS - 1, "the engine was not saturated"
    latest_high_first = max(recorder.first_token_step[request_id] for request_id in high_ids)
    assert all(recorder.first_token_step[request_id] >= latest_high_first for request_id in overtaken)

    # What a client sees: high priority's time to first token is lower.
    assert statistics.median(high_ttft) < statistics.median(low_ttft)
    assert statistics.mean(high_ttft) < statistics.mean(low_ttft)
