"""The hit path through HTTP, kvgate next to GPTCache, in one run: semantic and exact hits, 1 and 32 clients.

    .venv/bin/python bench/gateway/bench_hit_path.py                     # kvgate (this tree) and GPTCache
    .venv/bin/python bench/gateway/bench_hit_path.py --before ../old     # plus kvgate from another checkout
                                                                         # (near-duplicate and verified runs)

kvgate runs as `kvgate serve` with its default settings (embedded store, the shipped rule at its default
target) in reverse-proxy mode over an instant local upstream (tests/gateway/upstream_server.py); GPTCache
runs its own HTTP server (`gptcache_server`) with the same MiniLM, FAISS and sqlite (bench/gateway/gptcache_http.py).
Both are filled with the same prompts, then measured one after the other on the same machine:

- 1 client (Python, sequential): p50 / p99 of exact hits and of semantic hits;
- 32 connections (`wrk -t1 -c32`, a compiled load generator: a Python client saturates first): exact
  hits/s (one body) and semantic hits/s (a fresh variant of a stored prompt per request, so that kvgate's
  remembered wordings never turn them into exact hits; only responses the server marked as hits count).

A case variant is a near-duplicate wording, served without the verifier. A second kvgate run sends the
variants with filler words around them ("hey, ... thanks!"), so that the verifier runs on each lookup: a
verified hit. It runs at the default target too (the shipped rule serves those variants since the
rewordings work: 199 of 200 sequential ones on 2026-12-05); `--verified-target` sets another. The last
lines compare both kinds of semantic hit with GPTCache's. RSS of the kvgate process is read after warm-up.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.gateway.wrk_scripts import fixed_body_script, variant_script  # noqa: E402
from tests.gateway.upstream_server import upstream_process  # noqa: E402
from tests.reliability.redis_proc import free_port  # noqa: E402

MODEL = "up-small"
SUBJECTS = [
    "the capital of France", "photosynthesis", "the speed of light", "black holes", "the French Revolution",
    "machine learning", "the water cycle", "volcanoes", "the Roman Empire", "quantum computing",
    "the human heart", "climate change", "the stock market", "DNA replication", "the moon landing",
    "plate tectonics", "the printing press", "vaccines", "the Great Wall of China", "electric cars",
    "honey bees", "the Olympic Games", "the Internet", "coral reefs", "the Renaissance", "jet engines",
    "the immune system", "rainbows", "chess openings", "the Silk Road", "glaciers", "the periodic table",
]  # fmt: skip
FRAMES = [
    "Explain {} in simple terms.", "What should a beginner know about {}?", "Give me three facts about {}.",
    "Why does {} matter?", "Write a short paragraph about {}.", "What is the history of {}?",
    "How would you teach {} to a child?", "What are common myths about {}?",
]  # fmt: skip
VERIFIED = "kvgate, verifier on every lookup"
GPTCACHE_COSINE = 0.9  # GPTCache's cosine threshold: its variants (case flips) score ~0.95-1.0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seconds", type=int, default=10, help="wrk duration per throughput row")
    parser.add_argument("--requests", type=int, default=200, help="sequential requests per latency row")
    parser.add_argument("--before", type=Path, help="also measure kvgate from this checkout (same venv)")
    parser.add_argument(
        "--verified-target",
        type=float,
        help="target of the verified-hit run (default: the shipped default target)",
    )
    parser.add_argument("--no-gptcache", action="store_true")
    args = parser.parse_args(argv)
    if shutil.which("wrk") is None:
        print("wrk is not installed: apt-get install wrk (make bench does)", file=sys.stderr)
        return 2
    prompts = [frame.format(subject) for subject in SUBJECTS for frame in FRAMES]  # 256 stored prompts
    results: dict[str, dict[str, Any]] = {}
    folder = Path(tempfile.mkdtemp(prefix="kvgate-hitpath-"))
    with upstream_process() as upstream:
        target = "" if args.verified_target is None else f", target {args.verified_target}"
        if args.before is not None:
            results["kvgate before"] = measure_kvgate(args.before, upstream, prompts, folder / "before", args)
            results[f"kvgate before, verifier on every lookup{target}"] = measure_kvgate(
                args.before, upstream, prompts, folder / "before-verified", args, args.verified_target, True
            )
        results["kvgate"] = measure_kvgate(ROOT, upstream, prompts, folder / "now", args)
        results[f"{VERIFIED}{target}"] = measure_kvgate(
            ROOT, upstream, prompts, folder / "verified", args, target=args.verified_target, verified=True
        )
    if not args.no_gptcache:
        results["GPTCache"] = measure_gptcache(prompts, folder / "gptcache", args)
    report(results)
    shutil.rmtree(folder, ignore_errors=True)
    return 0


def measure_kvgate(
    tree: Path,
    upstream: str,
    prompts: list[str],
    folder: Path,
    args: argparse.Namespace,
    target: float | None = None,
    verified: bool = False,
) -> dict[str, Any]:
    port = free_port()
    env = os.environ | {
        "PYTHONPATH": str(tree),
        "KVGATE_PORT": str(port),
        "KVGATE_DATA_DIR": str(folder / "data"),
        "KVGATE_UPSTREAM_URL": f"{upstream}/v1",
    }
    if target is not None:
        env["KVGATE_TARGET_FALSE_HIT_RATE"] = str(target)
    command = [sys.executable, "-c", "from gateway.cli import app; app()", "serve"]
    base = f"http://127.0.0.1:{port}"
    folder.mkdir(parents=True)
    with running(command, env, tree, base + "/readyz", folder / "kvgate.log") as process:
        path = "/v1/chat/completions"
        # `no-cache`: stored without a lookup, so that stored prompts never answer one another.
        fill(base + path, [chat(prompt) for prompt in prompts], "x-kvgate-cache", "bypass")
        result: dict[str, Any] = {}
        result["exact 1"] = sequential(base + path, [chat(prompts[i % 32]) for i in range(args.requests)])
        variants = variant_prompts(prompts, args.requests, verified)
        result["semantic 1"] = sequential(base + path, [chat(text) for text in variants], "semantic-hit")
        result["rss_mb"] = rss_mb(process.pid)
        result["exact 32"] = wrk(fixed_body_script(folder, path, chat(prompts[0]), "kvgate"), base, args)
        script = variant_script(folder, path, prompts, "kvgate", MODEL, verified, seed=7)
        result["semantic 32"] = wrk(script, base, args)
        result["rss_mb_after"] = rss_mb(process.pid)
    print(json.dumps({str(tree): result}), flush=True)
    return result


def measure_gptcache(prompts: list[str], folder: Path, args: argparse.Namespace) -> dict[str, Any]:
    port = free_port()
    folder.mkdir(parents=True)
    command = [
        sys.executable,
        str(ROOT / "bench" / "gateway" / "gptcache_http.py"),
        str(port),
        str(folder),
        str(GPTCACHE_COSINE),
    ]
    env = os.environ | {"PYTHONPATH": str(ROOT)}
    base = f"http://127.0.0.1:{port}"
    with running(command, env, ROOT, base + "/", folder / "gptcache.log") as process:
        with httpx.Client(timeout=60) as client:
            for prompt in prompts:
                client.post(
                    base + "/put", json={"prompt": prompt, "answer": f"answer to {prompt}"}
                ).raise_for_status()
        result: dict[str, Any] = {}
        variants = variant_prompts(prompts, args.requests, False)
        result["semantic 1"] = sequential(base + "/get", [{"prompt": text} for text in variants], "hit")
        result["rss_mb"] = rss_mb(process.pid)
        result["semantic 32"] = wrk(variant_script(folder, "/get", prompts, "gptcache", seed=7), base, args)
    return result


@contextmanager
def running(
    command: list[str], env: dict[str, str], cwd: Path, ready: str, log: Path
) -> Iterator[subprocess.Popen[bytes]]:
    with log.open("wb") as output:
        process = subprocess.Popen(command, env=env, cwd=cwd, stdout=output, stderr=subprocess.STDOUT)
        try:
            deadline = time.monotonic() + 300
            while True:
                try:
                    if httpx.get(ready, timeout=2).status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                if process.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"{command} did not become ready; see {log}")
                time.sleep(0.2)
            yield process
        finally:
            process.terminate()
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()


def fill(url: str, bodies: list[dict[str, Any]], header: str, expected: str) -> None:
    with httpx.Client(timeout=60, headers={"cache-control": "no-cache"}) as client:
        for body in bodies:
            response = client.post(url, json=body)
            response.raise_for_status()
            if response.headers.get(header) != expected:
                raise RuntimeError(f"filling: expected {expected}, got {response.headers.get(header)}")


def sequential(url: str, bodies: list[dict[str, Any]], expected: str | None = None) -> dict[str, Any]:
    """One client, one request at a time: latencies of the responses of the expected kind."""
    timings: list[float] = []
    kinds: dict[str, int] = {}
    with httpx.Client(timeout=60) as client:
        client.post(url, json=bodies[0])  # warm the connection
        for body in bodies:
            started = time.perf_counter()
            response = client.post(url, json=body)
            elapsed = (time.perf_counter() - started) * 1000
            response.raise_for_status()
            kind = response.headers.get("x-kvgate-cache") or (
                "hit" if response.json().get("answer") else "miss"
            )
            kinds[kind] = kinds.get(kind, 0) + 1
            if expected is None or kind == expected:
                timings.append(elapsed)
    timings.sort()
    return {
        "p50_ms": statistics.median(timings) if timings else float("nan"),
        "p99_ms": timings[min(len(timings) - 1, int(0.99 * len(timings)))] if timings else float("nan"),
        "kinds": kinds,
    }


def wrk(script: Path, base: str, args: argparse.Namespace) -> dict[str, Any]:
    command = ["wrk", "-t1", "-c32", f"-d{args.seconds}s", "--timeout", "10s", "-s", str(script), base]
    output = subprocess.run(command, capture_output=True, text=True, check=True).stdout
    line = next(line for line in output.splitlines() if line.startswith("WRK_RESULT "))
    result: dict[str, Any] = json.loads(line.removeprefix("WRK_RESULT "))
    return result


def variant_prompts(prompts: list[str], count: int, verified: bool) -> list[str]:
    """Fresh case variants of stored prompts (with filler words when `verified`), none sent twice."""
    rng = random.Random(3)
    fillers = ["please", "quick question:", "hey,", "hi,", "thanks!", "thank you", "so", "ok"]
    seen: set[str] = set()
    while len(seen) < count:
        text = "".join(
            char.swapcase() if char.isalpha() and rng.random() < 0.3 else char for char in rng.choice(prompts)
        )
        if verified:
            text = f"{rng.choice(fillers)} {text} {rng.choice(fillers)}"
        seen.add(text)
    return sorted(seen, key=lambda _: rng.random())


def chat(prompt: str) -> dict[str, Any]:
    return {"model": MODEL, "messages": [{"role": "user", "content": prompt}]}


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def report(results: dict[str, dict[str, Any]]) -> None:
    print("\n## hit path through HTTP (bench/gateway/bench_hit_path.py)\n")
    print(f"cpu: {os.cpu_count()} cores; wrk -t1 -c32")
    names = list(results)
    print("| | " + " | ".join(names) + " |")
    print("|---|" + "---|" * len(names))
    rows = [
        ("semantic hit, 1 client, p50 / p99 ms", lambda r: _latency(r.get("semantic 1"))),
        ("semantic hits/s, 32 connections (p99 ms)", lambda r: _rate(r.get("semantic 32"), ("semantic-hit", "hit"))),
        ("exact hit, 1 client, p50 / p99 ms", lambda r: _latency(r.get("exact 1"))),
        ("exact hits/s, 32 connections (p50 / p99 ms)", lambda r: _rate(r.get("exact 32"), ("exact-hit",), both=True)),
        ("RSS after warm-up / after the run, MB", lambda r: f"{r.get('rss_mb', 0):.0f} / {r.get('rss_mb_after', 0):.0f}" if "rss_mb_after" in r else f"{r.get('rss_mb', 0):.0f}"),
        ("kinds seen (semantic 1 / semantic 32)", lambda r: f"{r.get('semantic 1', {}).get('kinds')} / {r.get('semantic 32', {}).get('kinds')}"),
    ]  # fmt: skip
    for label, cell in rows:
        print(f"| {label} | " + " | ".join(cell(results[name]) for name in names) + " |")
    theirs = results.get("GPTCache")
    verified = next((name for name in names if name.startswith(VERIFIED)), None)
    for kind, name in (("near-duplicate", "kvgate"), ("verified", verified)):
        ours = results.get(name) if name else None
        if ours and theirs:
            p50 = ours["semantic 1"]["p50_ms"] / theirs["semantic 1"]["p50_ms"]
            rate = _hits_per_s(ours["semantic 32"], ("semantic-hit",)) / max(
                _hits_per_s(theirs["semantic 32"], ("hit",)), 1e-9
            )
            print(
                f"\n{kind} semantic hit: p50 kvgate / GPTCache = {p50:.2f}; "
                f"hits/s at 32 kvgate / GPTCache = {rate:.2f}x"
            )
    before = {
        "near-duplicate": "kvgate before",
        "verified": next((n for n in names if n.startswith("kvgate before, verifier")), None),
    }
    for kind, name in (("near-duplicate", "kvgate"), ("verified", verified)):
        then = results.get(before[kind] or "")
        now = results.get(name) if name else None
        if then and now:
            ratio = now["semantic 1"]["p50_ms"] / then["semantic 1"]["p50_ms"]
            print(f"\n{kind} semantic hit: p50 kvgate / kvgate before = {ratio:.2f}")
    print("\n" + json.dumps(results))


def _latency(row: dict[str, Any] | None) -> str:
    return "—" if row is None else f"{row['p50_ms']:.2f} / {row['p99_ms']:.2f}"


def _hits_per_s(row: dict[str, Any], kinds: tuple[str, ...]) -> float:
    hits = sum(row["kinds"].get(kind, 0) for kind in kinds)
    return float(hits / row["seconds"])


def _rate(row: dict[str, Any] | None, kinds: tuple[str, ...], both: bool = False) -> str:
    if row is None:
        return "—"
    latency = f"{row['p50_ms']:.1f} / {row['p99_ms']:.1f}" if both else f"{row['p99_ms']:.1f}"
    return f"{_hits_per_s(row, kinds):,.0f} ({latency})"


if __name__ == "__main__":
    sys.exit(main())
