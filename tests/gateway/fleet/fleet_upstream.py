"""A model server for fleet tests, run as its own process: `python -m tests.gateway.fleet.fleet_upstream PORT
MODEL[,MODEL...]`, killed and restarted on the same port by the tests.

It speaks OpenAI's chat completions (JSON, or SSE with a usage chunk and `[DONE]`) and embeddings, lists
its models at `GET /v1/models`, and answers an unknown model with its own 404. Like a server with a prefix
cache, it reports in `usage.prompt_tokens_details.cached_tokens` the words of the longest run of leading
messages it has seen before (a prompt's "tokens" are its words). A last turn that starts with `slow:`
streams 40 chunks 50 ms apart (time to kill it mid-stream); one that starts with `fail:` gets a 503.
`GET /control/calls` counts the requests per model.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import httpx
import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

SLOW_CHUNKS = 40
SLOW_DELAY_S = 0.05


def build(models: list[str]) -> FastAPI:
    app = FastAPI()
    calls: Counter[str] = Counter()
    seen: set[bytes] = set()

    @app.get("/v1/models")
    async def listed() -> dict[str, Any]:
        return {
            "object": "list",
            "data": [{"id": name, "object": "model", "owned_by": "fleet"} for name in models],
        }

    @app.get("/control/calls")
    async def counted() -> dict[str, Any]:
        return {"calls": sum(calls.values()), "models": dict(calls), "pid": os.getpid()}

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> Response:
        body = await request.json()
        model = body["model"]
        if model not in models:
            error = {
                "message": f"The model `{model}` does not exist.",
                "type": "NotFoundError",
                "code": "model_not_found",
            }
            return JSONResponse({"error": error}, status_code=404)
        calls[model] += 1
        messages = body["messages"]
        question = str(messages[-1]["content"])
        if question.startswith("fail:"):
            return JSONResponse({"error": {"message": "overloaded", "type": "server_error"}}, status_code=503)
        prompt, cached = _prompt_words(messages, seen)
        text = f"{model} on {os.getpid()} says: {question}"
        usage = {
            "prompt_tokens": prompt,
            "completion_tokens": len(text.split()),
            "total_tokens": prompt + len(text.split()),
            "prompt_tokens_details": {"cached_tokens": cached},
        }
        if not body.get("stream"):
            return JSONResponse(_whole(model, text, usage))
        pieces = (
            [f"{index} " for index in range(SLOW_CHUNKS)] if question.startswith("slow:") else text.split(" ")
        )
        delay = SLOW_DELAY_S if question.startswith("slow:") else 0.0
        return StreamingResponse(_chunks(model, pieces, usage, delay), media_type="text/event-stream")

    @app.post("/v1/embeddings")
    async def embeddings(request: Request) -> dict[str, Any]:
        body = await request.json()
        calls[body["model"]] += 1
        inputs = body["input"] if isinstance(body["input"], list) else [body["input"]]
        data = [
            {"object": "embedding", "index": index, "embedding": [float(len(str(text))), 1.0]}
            for index, text in enumerate(inputs)
        ]
        return {
            "object": "list",
            "data": data,
            "model": body["model"],
            "usage": {"prompt_tokens": 1, "total_tokens": 1},
        }

    return app


def _prompt_words(messages: list[dict[str, Any]], seen: set[bytes]) -> tuple[int, int]:
    """(words in the prompt, words of its longest leading run of messages seen before); remembers them all."""
    words = [len(str(message["content"]).split()) for message in messages]
    cached = 0
    digest = hashlib.sha256()
    for count, message in enumerate(messages, start=1):
        digest.update(json.dumps([message["role"], message["content"]]).encode())
        key = digest.digest()
        if key in seen and count < len(messages):
            cached = sum(words[:count])
        seen.add(key)
    return sum(words), cached


def _whole(model: str, text: str, usage: dict[str, Any]) -> dict[str, Any]:
    return {
        "id": "chatcmpl-fleet",
        "object": "chat.completion",
        "created": 1_700_000_000,
        "model": model,
        "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
        "usage": usage,
    }


async def _chunks(model: str, pieces: list[str], usage: dict[str, Any], delay: float) -> AsyncIterator[str]:
    base = {
        "id": "chatcmpl-fleet",
        "object": "chat.completion.chunk",
        "created": 1_700_000_000,
        "model": model,
    }
    yield _sse(
        base
        | {"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}]}
    )
    for piece in pieces:
        await asyncio.sleep(delay)
        yield _sse(base | {"choices": [{"index": 0, "delta": {"content": piece}, "finish_reason": None}]})
    yield _sse(base | {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]})
    yield _sse(base | {"choices": [], "usage": usage})
    yield "data: [DONE]\n\n"


def _sse(payload: dict[str, Any]) -> str:
    return f"data: {json.dumps(payload)}\n\n"


@dataclass
class ModelServer:
    """One server process: started, killed (SIGKILL: no goodbye to its clients) and started again on its port."""

    port: int
    models: list[str]
    process: subprocess.Popen[bytes] | None = field(default=None, repr=False)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    @property
    def name(self) -> str:
        """Its member name in the gateway."""
        return f"127.0.0.1:{self.port}"

    def start(self) -> None:
        command = [
            sys.executable,
            "-m",
            "tests.gateway.fleet.fleet_upstream",
            str(self.port),
            ",".join(self.models),
        ]
        self.process = subprocess.Popen(command)

    def wait_ready(self, timeout_s: float = 30.0) -> None:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                httpx.get(f"http://127.0.0.1:{self.port}/control/calls", timeout=1.0).raise_for_status()
                return
            except httpx.HTTPError:
                if self.process is None or self.process.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"the model server on port {self.port} did not start") from None
                time.sleep(0.05)

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait(timeout=10)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            self.process.wait(timeout=10)

    def calls(self) -> dict[str, Any]:
        answer: dict[str, Any] = httpx.get(f"http://127.0.0.1:{self.port}/control/calls", timeout=5.0).json()
        return answer


if __name__ == "__main__":
    uvicorn.run(build(sys.argv[2].split(",")), host="127.0.0.1", port=int(sys.argv[1]), log_level="warning")
