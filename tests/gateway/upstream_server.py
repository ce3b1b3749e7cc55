"""A small OpenAI-compatible upstream, run as its own process: `python -m tests.gateway.upstream_server PORT`.

It serves `GET /v1/models` (or refuses it, as some servers do) and streamed chat completions for the
models it lists; `POST /control/models` changes what it lists (`{"models": [...], "status": 200}`), so a
test can watch kvgate refresh. An unknown model gets the upstream's own 404 in OpenAI's shape.
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import httpx
import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response

from tests.gateway.openai_upstream import reply, text_whole
from tests.reliability.redis_proc import free_port


def build_upstream() -> FastAPI:
    app = FastAPI()
    state: dict[str, Any] = {"models": ["up-small", "up-large"], "status": 200, "calls": 0}

    @app.post("/control/models")
    async def control(request: Request) -> dict[str, Any]:
        state.update(await request.json())
        return {"calls": state["calls"]}

    @app.get("/control/calls")
    async def calls() -> dict[str, Any]:
        return {"calls": state["calls"]}

    @app.get("/v1/models")
    async def models() -> Response:
        if state["status"] != 200:
            return JSONResponse({"error": {"message": "no model list here"}}, status_code=state["status"])
        cards = [{"id": name, "object": "model", "owned_by": "upstream"} for name in state["models"]]
        return JSONResponse({"object": "list", "data": cards})

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> Response:
        body = await request.json()
        state["calls"] += 1
        if body["model"] not in state["models"]:
            error = {
                "message": f"The model `{body['model']}` does not exist.",
                "type": "NotFoundError",
                "param": "model",
                "code": "model_not_found",
            }
            return JSONResponse({"error": error}, status_code=404)
        question = body["messages"][-1]["content"]

        return reply(body, text_whole(body["model"], f"{body['model']} says: {question}"), chat=True)

    return app


@contextmanager
def upstream_process(timeout_s: float = 60.0) -> Iterator[str]:
    """Run the upstream in a child process; yield its base URL (`http://127.0.0.1:PORT`)."""
    port = free_port()
    process = subprocess.Popen([sys.executable, "-m", "tests.gateway.upstream_server", str(port)])
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                httpx.get(base + "/control/calls", timeout=1.0).raise_for_status()
                break
            except httpx.HTTPError:
                if process.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("the upstream process did not start") from None
                time.sleep(0.05)
        yield base
    finally:
        process.terminate()
        process.wait(timeout=10)


if __name__ == "__main__":
    uvicorn.run(build_upstream(), host="127.0.0.1", port=int(sys.argv[1]), log_level="warning")
