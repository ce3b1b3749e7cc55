"""The LiteLLM proxy as bench_vs_litellm's opponent: installed in a venv of its own, run with one worker and
its Redis exact cache on, in front of an OpenAI-compatible upstream.

It knows how to install LiteLLM (`python3 -m venv` + `pip install 'litellm[proxy]==VERSION'`, once), write
its config (one model routed to `openai/<model>` at the upstream; `cache: true` over a redis-server started
for it on a free port, AOF fsync every second as kvgate's embedded store does), run it quietly
(`LITELLM_LOG=ERROR`, which also turns uvicorn's access log off) and check that its cache answers. It does
not measure anything.
"""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from bench.gateway.bench_hit_path import running
from tests.reliability.redis_proc import RedisProcess, free_port

LITELLM_VERSION = "1.108.7"
MASTER_KEY = "sk-bench"
DEFAULT_VENV = Path.home() / ".cache" / "kvgate-bench" / "litellm-venv"
CACHE_KEY_HEADER = "x-litellm-cache-key"  # set on a response served from LiteLLM's cache


@dataclass(frozen=True, slots=True)
class LiteLLMProxy:
    base: str
    headers: dict[str, str]
    pid: int
    redis_pid: int


def ensure_litellm(venv: Path) -> Path:
    """The `litellm` executable of `venv`, created with LiteLLM's proxy extra the first time."""
    executable = venv / "bin" / "litellm"
    if executable.exists():
        return executable
    print(f"installing litellm[proxy]=={LITELLM_VERSION} into {venv} (a few minutes, once)", flush=True)
    venv.parent.mkdir(parents=True, exist_ok=True)
    log = venv.parent / "litellm-install.log"
    with log.open("wb") as output:
        subprocess.run(["python3", "-m", "venv", str(venv)], check=True, stdout=output, stderr=output)
        installed = subprocess.run(
            [str(venv / "bin" / "pip"), "install", f"litellm[proxy]=={LITELLM_VERSION}"],
            stdout=output,
            stderr=output,
        )
    if installed.returncode != 0 or not executable.exists():
        raise SystemExit(f"installing LiteLLM failed; see {log}")
    return executable


@contextmanager
def litellm_proxy(executable: Path, upstream: str, model: str, folder: Path) -> Iterator[LiteLLMProxy]:
    """LiteLLM on a free port with one worker, `model` routed to `upstream`; its log is folder/litellm.log."""
    folder.mkdir(parents=True)
    redis_server = RedisProcess(folder / "redis", appendfsync="everysec")
    redis_server.start()
    config = folder / "litellm.yaml"
    config.write_text(litellm_config(upstream, model, redis_server.port), encoding="utf-8")
    port = free_port()
    env = os.environ | {
        "LITELLM_MASTER_KEY": MASTER_KEY,
        "LITELLM_LOCAL_MODEL_COST_MAP": "True",  # the cost map shipped in the wheel, no download at start
        "LITELLM_LOG": "ERROR",
    }
    env.pop("DATABASE_URL", None)  # no database: the master key alone authenticates
    command = [str(executable), "--config", str(config), "--port", str(port), "--num_workers", "1"]
    base = f"http://127.0.0.1:{port}"
    try:
        with running(command, env, folder, base + "/health/liveliness", folder / "litellm.log") as process:
            assert redis_server.process is not None
            headers = {"authorization": f"Bearer {MASTER_KEY}"}
            yield LiteLLMProxy(base, headers, process.pid, redis_server.process.pid)
    finally:
        redis_server.shutdown()


def litellm_config(upstream: str, model: str, redis_port: int) -> str:
    return f"""\
model_list:
  - model_name: {model}
    litellm_params:
      model: openai/{model}
      api_base: {upstream}/v1
      api_key: x
litellm_settings:
  cache: true
  cache_params:
    type: redis
    host: 127.0.0.1
    port: {redis_port}
  set_verbose: false
general_settings:
  master_key: {MASTER_KEY}
"""


def check_cache(
    url: str, headers: dict[str, str], body: dict[str, Any], upstream_calls: Callable[[], int]
) -> dict[str, Any]:
    """POST a new `body` to LiteLLM twice: the repeat must be answered without the upstream (from Redis)."""
    answers = []
    with httpx.Client(timeout=60, headers=headers) as client:
        for _ in range(2):
            calls_before = upstream_calls()
            started = time.perf_counter()
            response = client.post(url, json=body)
            answers.append(
                {
                    "status": response.status_code,
                    "ms": (time.perf_counter() - started) * 1000,
                    "upstream_calls": upstream_calls() - calls_before,
                    "cache_key_header": bool(response.headers.get(CACHE_KEY_HEADER)),
                }
            )
            time.sleep(0.5)  # LiteLLM writes its cache after answering
    first, second = answers
    hit = second["status"] == 200 and second["upstream_calls"] == 0
    verdict = (
        f"hit (the repeat answered without the upstream in {second['ms']:.1f} ms, the first in "
        f"{first['ms']:.1f} ms; {CACHE_KEY_HEADER} {'present' if second['cache_key_header'] else 'ABSENT'})"
        if hit
        else f"NOT WORKING: the repeat reached the upstream or failed ({answers})"
    )
    return {"hit": hit, "verdict": verdict, "answers": answers}
