"""Real apps' requests through kvgate, side by side in one run (reverse-proxy mode, default settings).

    .venv/bin/python bench/gateway/bench_real_apps.py [--seconds 8] [--rounds 3] [--per-input-ms 20]

kvgate runs as `kvgate serve` over the test upstream that speaks OpenAI's APIs (tests/gateway/openai_upstream.py,
in this process). Measured:

- exact hits/s with `wrk -t1 -c32` (a compiled load generator: a Python client saturates first) on one body
  each: a plain chat request, a chat request with tools (its stored answer a tool call), and a Responses request;
  the ratios tools / plain and Responses / plain (issue 33: each at least 0.90);
- embeddings against an upstream that spends a fixed time per input: a 100-input batch of which 90 inputs were
  seen, through kvgate, against the same 100 inputs sent to the upstream directly (issue 33: under a fifth),
  and how many inputs reached the upstream.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.gateway.bench_hit_path import running  # noqa: E402
from bench.gateway.wrk_scripts import fixed_body_script  # noqa: E402
from tests.gateway.live_server import serve  # noqa: E402
from tests.gateway.openai_upstream import EMBEDDING_MODEL, MODEL, build_openai_upstream  # noqa: E402
from tests.reliability.redis_proc import free_port  # noqa: E402

TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}
BODIES: dict[str, tuple[str, dict[str, Any]]] = {
    "plain chat": (
        "/v1/chat/completions",
        {"model": MODEL, "messages": [{"role": "user", "content": "Hi there"}]},
    ),
    "chat with tools": (
        "/v1/chat/completions",
        {"model": MODEL, "messages": [{"role": "user", "content": "Weather in Paris?"}], "tools": [TOOL]},
    ),
    "responses": ("/v1/responses", {"model": MODEL, "input": "What is the Responses API?"}),
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seconds", type=int, default=8, help="wrk duration per body and round")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved runs of each body")
    parser.add_argument(
        "--per-input-ms", type=float, default=20.0, help="the upstream's time per embeddings input"
    )
    args = parser.parse_args(argv)
    calls: list[dict[str, Any]] = []
    upstream_app = build_openai_upstream(calls, seconds_per_input=args.per_input_ms / 1000)
    with serve(upstream_app) as upstream, tempfile.TemporaryDirectory() as scratch:
        folder = Path(scratch)
        port = free_port()
        env = os.environ | {
            "PYTHONPATH": str(ROOT),
            "KVGATE_PORT": str(port),
            "KVGATE_DATA_DIR": str(folder / "data"),
            "KVGATE_UPSTREAM_URL": f"{upstream}/v1",
        }
        base = f"http://127.0.0.1:{port}"
        command = [sys.executable, "-c", "from gateway.cli import app; app()", "serve"]
        with running(command, env, ROOT, base + "/readyz", folder / "kvgate.log"):
            exact_hits(base, *BODIES["plain chat"], folder, args)  # warm-up, discarded
            runs: dict[str, list[dict[str, Any]]] = {name: [] for name in BODIES}
            for _ in range(args.rounds):  # interleaved, so that a drift of the machine touches every kind
                for name, (path, body) in BODIES.items():
                    runs[name].append(exact_hits(base, path, body, folder, args))
            hits = {
                name: {"hits_per_s": sum(run["hits_per_s"] for run in rows) / len(rows), "runs": rows}
                for name, rows in runs.items()
            }
            embeddings = embeddings_batch(base, upstream, calls)
    plain = hits["plain chat"]["hits_per_s"]
    print("\n## real apps through kvgate (bench/gateway/bench_real_apps.py)\n")
    print(
        f"| request | exact hits/s (wrk -c32, mean of {args.rounds} interleaved runs) | runs | / plain chat |"
    )
    print("|---|---|---|---|")
    for name, row in hits.items():
        each = " / ".join(f"{run['hits_per_s']:.0f}" for run in row["runs"])
        print(f"| {name} | {row['hits_per_s']:.0f} | {each} | {row['hits_per_s'] / plain:.2f} |")
    print(
        f"\nembeddings, 100 inputs of which 90 stored, upstream {args.per_input_ms:.0f} ms an input: kvgate "
        f"{embeddings['kvgate_s'] * 1000:.0f} ms ({embeddings['sent_upstream']} inputs reached the upstream), the "
        f"upstream alone for all 100 {embeddings['direct_s'] * 1000:.0f} ms: "
        f"{embeddings['kvgate_s'] / embeddings['direct_s']:.3f} of it"
    )
    print(json.dumps({"exact_hits": hits, "embeddings": embeddings}))
    return 0


def exact_hits(
    base: str, path: str, body: dict[str, Any], folder: Path, args: argparse.Namespace
) -> dict[str, Any]:
    """Store the answer once, check the repeat is an exact hit, then wrk the same body."""
    with httpx.Client(timeout=60) as client:
        client.post(base + path, json=body).raise_for_status()
        again = client.post(base + path, json=body)
        if again.headers.get("x-kvgate-cache") != "exact-hit":
            raise RuntimeError(
                f"{path}: the repeat was {again.headers.get('x-kvgate-cache')}, not an exact hit"
            )
    script = fixed_body_script(folder, path, body, "kvgate")
    command = ["wrk", "-t1", "-c32", f"-d{args.seconds}s", "--timeout", "10s", "-s", str(script), base]
    output = subprocess.run(command, capture_output=True, text=True, check=True).stdout
    line = next(line for line in output.splitlines() if line.startswith("WRK_RESULT "))
    result: dict[str, Any] = json.loads(line.removeprefix("WRK_RESULT "))
    hits = result.get("kinds", {}).get("exact-hit", 0)
    result["hits_per_s"] = hits / args.seconds
    return result


def embeddings_batch(base: str, upstream: str, calls: list[dict[str, Any]]) -> dict[str, Any]:
    inputs = [f"document number {index} about subject {index % 7}" for index in range(100)]
    with httpx.Client(timeout=120) as client:
        seen = [text for index, text in enumerate(inputs) if index % 10 != 0]  # 90 of them
        client.post(
            base + "/v1/embeddings", json={"model": EMBEDDING_MODEL, "input": seen}
        ).raise_for_status()
        before = len(calls)
        started = time.perf_counter()
        answer = client.post(base + "/v1/embeddings", json={"model": EMBEDDING_MODEL, "input": inputs})
        kvgate_s = time.perf_counter() - started
        answer.raise_for_status()
        sent = sum(len(call["input"]) for call in calls[before:])
        started = time.perf_counter()
        client.post(
            upstream + "/v1/embeddings", json={"model": EMBEDDING_MODEL, "input": inputs}
        ).raise_for_status()
        direct_s = time.perf_counter() - started
    if len(answer.json()["data"]) != 100:
        raise RuntimeError("kvgate did not answer every input")
    return {
        "kvgate_s": kvgate_s,
        "direct_s": direct_s,
        "sent_upstream": sent,
        "cached": answer.headers["x-kvgate-cached-inputs"],
    }


if __name__ == "__main__":
    raise SystemExit(main())
