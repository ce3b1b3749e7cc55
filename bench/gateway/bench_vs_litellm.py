"""kvgate beside the LiteLLM proxy, both in front of the same instant upstream, in one run (issue 46's bars).

    .venv/bin/python bench/gateway/bench_vs_litellm.py [--rounds 5] [--seconds 10]

Run from the repository root; needs `wrk` (apt-get install wrk) and, the first time, PyPI (LiteLLM is
installed into a venv of its own, `--litellm-venv`; bench/gateway/litellm_proxy.py). One process each, all
up for the whole run: the instant OpenAI-compatible upstream (tests/gateway/upstream_server.py), kvgate
(`kvgate serve`, default settings, reverse-proxy mode over the upstream) and the LiteLLM proxy (one worker,
its Redis exact cache on, so that the comparison is cache against cache). Each round measures, the
targets' order rotated from round to round so that a busy moment of a shared machine falls on each in turn:

- the latency a miss adds at 1 client, p50 / p99: a fresh prompt at a time to the upstream directly, to
  kvgate and to LiteLLM in turn; a gateway's figure is its percentile less the direct one of that round;
- misses/s at 32 connections (`wrk -t1 -c32`, a fresh prompt per request: bench/gateway/wrk_litellm_scripts.py);
  only misses answered 200 count, other answers are reported;
- exact hits/s at 32 connections (one fixed body, after one warm-up request), their p99 latency, and whether
  every answer was a hit: kvgate's `x-kvgate-cache: exact-hit`, LiteLLM's cache-key header, and for both
  no request reaching the upstream during the run;
- CPU per miss and per exact hit: utime + stime of the gateway's processes over the wrk run (and a second
  after it, for work still in flight), over the misses the upstream saw / the hits answered.

After the rounds: RSS of each gateway process (its Redis apart: not in the bar). Every figure is the median
of the rounds. The table prints kvgate / LiteLLM for each line beside the issue's bar; the figures go to
bench/out/bench_vs_litellm.json and the servers' logs beside it. Before the rounds, a check that LiteLLM's
Redis cache answers a repeated request without the upstream, printed whatever its outcome.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.gateway.bench_hit_path import running, wrk  # noqa: E402
from bench.gateway.litellm_proxy import (  # noqa: E402
    CACHE_KEY_HEADER,
    DEFAULT_VENV,
    LITELLM_VERSION,
    check_cache,
    ensure_litellm,
    litellm_proxy,
)
from bench.gateway.proc_stats import cpu_seconds, process_tree, rss_mb, split_store  # noqa: E402
from bench.gateway.wrk_litellm_scripts import fixed_body_script, fresh_prompt, fresh_prompt_script  # noqa: E402
from tests.gateway.upstream_server import upstream_process  # noqa: E402
from tests.reliability.redis_proc import free_port  # noqa: E402

MODEL = "up-small"  # a model the instant upstream lists
PATH = "/v1/chat/completions"
OUT_FILE = ROOT / "bench" / "out" / "bench_vs_litellm.json"
HIT_PROMPT = "Which is heavier, a kilo of feathers or a kilo of steel?"
SETTLE_S = 1.0  # after a wrk run: requests still in flight finish, LiteLLM writes its cache


@dataclass
class Target:
    """One server under test: where to send, and which processes to charge CPU and memory to."""

    name: str
    base: str
    headers: dict[str, str] = field(default_factory=dict)
    gateway_pids: list[int] = field(default_factory=list)
    store_pids: list[int] = field(default_factory=list)
    miss_kind: str = "200"  # the kind (answer_kind) of a miss answered
    hit_kinds: tuple[str, ...] = ()  # the kinds of a hit answered, the one that proves it first


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=5, help="rounds; every figure is their median")
    parser.add_argument("--seconds", type=int, default=10, help="wrk duration per throughput run")
    parser.add_argument("--requests", type=int, default=200, help="sequential misses per target per round")
    parser.add_argument("--litellm-venv", type=Path, default=DEFAULT_VENV)
    parser.add_argument("--out", type=Path, default=OUT_FILE)
    args = parser.parse_args(argv)
    if shutil.which("wrk") is None:
        print("wrk is not installed: apt-get install wrk (make bench does)", file=sys.stderr)
        return 2
    executable = ensure_litellm(args.litellm_venv)
    folder = Path(tempfile.mkdtemp(prefix="kvgate-vs-litellm-"))
    with ExitStack() as stack:
        upstream = stack.enter_context(upstream_process())
        direct = Target("direct", upstream)
        kvgate = stack.enter_context(kvgate_server(upstream, folder / "kvgate"))
        lite = stack.enter_context(litellm_server(executable, upstream, folder / "litellm"))
        probe = chat(f"cache check {random.random()}")
        cache_check = check_cache(lite.base + PATH, lite.headers, probe, lambda: upstream_calls(upstream))
        print(f"LiteLLM's Redis cache: {cache_check['verdict']}", flush=True)
        rounds = []
        for index in range(args.rounds):
            rounds.append(one_round(index, [direct, kvgate, lite], upstream, folder, args))
            print(json.dumps({"round": index, **rounds[-1]}), flush=True)
        memory = {target.name: memory_mb(target) for target in (kvgate, lite)}
    figures = {target.name: summarise(target, rounds, memory) for target in (kvgate, lite)}
    figures["direct"] = summarise_direct(rounds)
    log_errors = {name: error_lines(folder / name / f"{name}.log") for name in ("kvgate", "litellm")}
    report(figures, cache_check, log_errors, args)
    write_json(args.out, args, figures, rounds, cache_check, log_errors)
    print("server logs kept in " + ", ".join(str(path) for path in keep_logs(folder, args.out)))
    shutil.rmtree(folder, ignore_errors=True)
    return 0


@contextmanager
def kvgate_server(upstream: str, folder: Path) -> Iterator[Target]:
    """`kvgate serve` with its default settings, reverse-proxy mode over `upstream`."""
    port = free_port()
    folder.mkdir(parents=True)
    env = os.environ | {
        "PYTHONPATH": str(ROOT),
        "KVGATE_PORT": str(port),
        "KVGATE_DATA_DIR": str(folder / "data"),
        "KVGATE_UPSTREAM_URL": f"{upstream}/v1",
    }
    command = [sys.executable, "-c", "from gateway.cli import app; app()", "serve"]
    base = f"http://127.0.0.1:{port}"
    with running(command, env, ROOT, base + "/readyz", folder / "kvgate.log") as process:
        gateway, store = split_store(process_tree(process.pid))
        yield Target("kvgate", base, {}, gateway, store, miss_kind="miss", hit_kinds=("exact-hit",))


@contextmanager
def litellm_server(executable: Path, upstream: str, folder: Path) -> Iterator[Target]:
    with litellm_proxy(executable, upstream, MODEL, folder) as proxy:
        pids = process_tree(proxy.pid)
        yield Target("LiteLLM", proxy.base, proxy.headers, pids, [proxy.redis_pid], hit_kinds=("hit", "200"))


def one_round(
    index: int, targets: list[Target], upstream: str, folder: Path, args: argparse.Namespace
) -> dict[str, Any]:
    """Every measurement once, the targets' order rotated by the round's index."""
    order = targets[index % len(targets) :] + targets[: index % len(targets)]
    result: dict[str, Any] = {"miss 1": miss_latencies(order, index, args.requests)}
    for target in order:
        script = fresh_prompt_script(folder, f"r{index}-{target.name}", PATH, MODEL, target.headers)
        result[f"miss 32 {target.name}"] = measured_wrk(target, script, upstream, args)
    for target in order:
        if target.name == "direct":
            continue
        with httpx.Client(timeout=60, headers=target.headers) as client:
            client.post(target.base + PATH, json=chat(HIT_PROMPT)).raise_for_status()  # the warm-up stores it
        time.sleep(SETTLE_S)
        script = fixed_body_script(folder, target.name, PATH, chat(HIT_PROMPT), target.headers)
        result[f"hit 32 {target.name}"] = measured_wrk(target, script, upstream, args)
    return result


def miss_latencies(targets: list[Target], round_index: int, count: int) -> dict[str, dict[str, Any]]:
    """One client: a fresh prompt to each target in turn, `count` times; p50 / p99 and kinds per target."""
    rng = random.Random(round_index)
    timings: dict[str, list[float]] = {target.name: [] for target in targets}
    kinds: dict[str, dict[str, int]] = {target.name: {} for target in targets}
    with ExitStack() as stack:
        clients = {
            target.name: stack.enter_context(httpx.Client(timeout=60, headers=target.headers))
            for target in targets
        }
        for target in targets:  # open each connection
            clients[target.name].post(target.base + PATH, json=chat(fresh_prompt(rng, "w", round_index)))
        for number in range(count):
            for target in targets:
                body = chat(fresh_prompt(rng, f"s{round_index}-{target.name}", number))
                started = time.perf_counter()
                response = clients[target.name].post(target.base + PATH, json=body)
                elapsed = (time.perf_counter() - started) * 1000
                kind = answer_kind(response)
                kinds[target.name][kind] = kinds[target.name].get(kind, 0) + 1
                if kind == target.miss_kind:
                    timings[target.name].append(elapsed)
    return {name: {**percentiles(timings[name]), "kinds": kinds[name]} for name in timings}


def measured_wrk(target: Target, script: Path, upstream: str, args: argparse.Namespace) -> dict[str, Any]:
    """A wrk run, with the CPU time its target's processes spent and the requests the upstream saw."""
    calls_before = upstream_calls(upstream)
    gateway_before, store_before = cpu_seconds(target.gateway_pids), cpu_seconds(target.store_pids)
    result = wrk(script, target.base, args)
    time.sleep(SETTLE_S)
    result["gateway_cpu_s"] = cpu_seconds(target.gateway_pids) - gateway_before
    result["store_cpu_s"] = cpu_seconds(target.store_pids) - store_before
    result["upstream_calls"] = upstream_calls(upstream) - calls_before
    return result


def answer_kind(response: httpx.Response) -> str:
    """As the wrk scripts tally: kvgate's cache header, else `hit` if LiteLLM names a cache key, else the status."""
    if response.status_code == 200 and "x-kvgate-cache" in response.headers:
        return response.headers["x-kvgate-cache"]
    if response.status_code == 200 and response.headers.get(CACHE_KEY_HEADER):
        return "hit"
    return str(response.status_code)


def chat(prompt: str) -> dict[str, Any]:
    return {"model": MODEL, "messages": [{"role": "user", "content": prompt}]}


def upstream_calls(upstream: str) -> int:
    """Chat requests the upstream has answered so far."""
    return int(httpx.get(upstream + "/control/calls", timeout=10).json()["calls"])


def percentiles(timings: list[float]) -> dict[str, float]:
    ordered = sorted(timings)
    if not ordered:
        return {"p50_ms": float("nan"), "p99_ms": float("nan")}
    p99 = ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]
    return {"p50_ms": statistics.median(ordered), "p99_ms": p99}


def memory_mb(target: Target) -> dict[str, float]:
    return {"gateway": rss_mb(target.gateway_pids), "store": rss_mb(target.store_pids)}


def error_lines(log: Path) -> list[str]:
    """The lines of a server's log that report an error (kvgate logs JSON lines with a level; LiteLLM text)."""
    if not log.exists():
        return []
    found = []
    for line in log.read_text(errors="replace").splitlines():
        if line.startswith("{"):
            try:
                level = str(json.loads(line).get("level", "")).lower()
            except json.JSONDecodeError:
                level = ""
            if level in ("error", "critical"):
                found.append(line)
        elif any(word in line for word in ("Traceback", "ERROR", "Exception")):
            found.append(line)
    return found


def keep_logs(folder: Path, out: Path) -> list[Path]:
    """Copy the servers' logs beside the JSON (the scratch folder goes)."""
    kept = []
    for name in ("kvgate", "litellm"):
        log = folder / name / f"{name}.log"
        if log.exists():
            kept.append(Path(shutil.copy(log, out.with_name(f"{out.stem}-{name}.log"))))
    return kept


# --- figures, table, JSON -----------------------------------------------------------------------------


def summarise(
    target: Target, rounds: list[dict[str, Any]], memory: dict[str, dict[str, float]]
) -> dict[str, Any]:
    """One gateway's figures: the median over rounds of each."""
    name = target.name
    single = [r["miss 1"] for r in rounds]
    misses = [r[f"miss 32 {name}"] for r in rounds]
    hits = [r[f"hit 32 {name}"] for r in rounds]
    return {
        "miss_p50_added_ms": median(one[name]["p50_ms"] - one["direct"]["p50_ms"] for one in single),
        "miss_p99_added_ms": median(one[name]["p99_ms"] - one["direct"]["p99_ms"] for one in single),
        "misses_per_s": median(run["kinds"].get(target.miss_kind, 0) / run["seconds"] for run in misses),
        "miss_other_answers": merged_kinds(misses, exclude=(target.miss_kind,)),
        "hits_per_s": median(count(run, target.hit_kinds) / run["seconds"] for run in hits),
        "hit_p99_ms": median(run["p99_ms"] for run in hits),
        "every_answer_a_hit": all(every_answer_a_hit(run, target.hit_kinds[0]) for run in hits),
        "hit_kinds": merged_kinds(hits),
        "hit_upstream_calls": sum(run["upstream_calls"] for run in hits),
        # A miss is charged over the requests the upstream saw: wrk counts none still in flight as it stops.
        "cpu_ms_per_miss": median(cpu_ms(run, "gateway_cpu_s", run["upstream_calls"]) for run in misses),
        "store_cpu_ms_per_miss": median(cpu_ms(run, "store_cpu_s", run["upstream_calls"]) for run in misses),
        "cpu_ms_per_hit": median(cpu_ms(run, "gateway_cpu_s", run["requests"]) for run in hits),
        "store_cpu_ms_per_hit": median(cpu_ms(run, "store_cpu_s", run["requests"]) for run in hits),
        "rss_mb": memory[name]["gateway"],
        "store_rss_mb": memory[name]["store"],
        "single_client_kinds": merged_kinds([one[name] for one in single]),
    }


def summarise_direct(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    runs = [r["miss 32 direct"] for r in rounds]
    return {
        "p50_ms": median(r["miss 1"]["direct"]["p50_ms"] for r in rounds),
        "p99_ms": median(r["miss 1"]["direct"]["p99_ms"] for r in rounds),
        "requests_per_s": median(run["kinds"].get("200", 0) / run["seconds"] for run in runs),
        "other_answers": merged_kinds(runs, exclude=("200",)),
    }


def every_answer_a_hit(run: dict[str, Any], hit_kind: str) -> bool:
    only_hits = run["kinds"] == {hit_kind: run["requests"]}
    return bool(only_hits and run["upstream_calls"] == 0 and run["errors"] == 0)


def count(run: dict[str, Any], kinds: tuple[str, ...]) -> int:
    return sum(run["kinds"].get(kind, 0) for kind in kinds)


def cpu_ms(run: dict[str, Any], key: str, requests: int) -> float:
    return float(run[key] * 1000 / max(requests, 1))


def median(values: Iterable[float]) -> float:
    return float(statistics.median(list(values)))


def merged_kinds(runs: list[dict[str, Any]], exclude: tuple[str, ...] = ()) -> dict[str, int]:
    merged: dict[str, int] = {}
    for run in runs:
        for kind, number in run["kinds"].items():
            if kind not in exclude:
                merged[kind] = merged.get(kind, 0) + number
    return merged


# (label, figure, the bar, whether kvgate meets it given its figure and the ratio kvgate / LiteLLM)
ROWS: list[tuple[str, str, str, Callable[[float, float], bool] | None]] = [
    ("miss adds, 1 client, p50 ms", "miss_p50_added_ms", "≤ 0.3× and ≤ 4 ms", lambda ours, ratio: ratio <= 0.3 and ours <= 4),
    ("miss adds, 1 client, p99 ms", "miss_p99_added_ms", "≤ 0.3×", lambda ours, ratio: ratio <= 0.3),
    ("misses/s, 32 connections", "misses_per_s", "≥ 3×", lambda ours, ratio: ratio >= 3),
    ("exact hits/s, 32 connections", "hits_per_s", "≥ 5,000 and ≥ 40×", lambda ours, ratio: ours >= 5000 and ratio >= 40),
    ("exact hit p99 ms, 32 connections", "hit_p99_ms", "≤ 10 ms", lambda ours, ratio: ours <= 10),
    ("every answer a hit (1 = yes)", "every_answer_a_hit", "yes", lambda ours, ratio: ours == 1),
    ("CPU ms per miss (gateway process)", "cpu_ms_per_miss", "", None),
    ("CPU ms per exact hit (gateway process)", "cpu_ms_per_hit", "", None),
    ("RSS MB after the runs (gateway process)", "rss_mb", "≤ 1.5×", lambda ours, ratio: ratio <= 1.5),
    ("RSS MB of its Redis (not in the bar)", "store_rss_mb", "", None),
]  # fmt: skip


def report(
    figures: dict[str, Any],
    cache_check: dict[str, Any],
    log_errors: dict[str, list[str]],
    args: argparse.Namespace,
) -> None:
    ours, theirs, direct = figures["kvgate"], figures["LiteLLM"], figures["direct"]
    print("\n## kvgate vs the LiteLLM proxy (bench/gateway/bench_vs_litellm.py)\n")
    print(
        f"cpu: {os.cpu_count()} cores; medians of {args.rounds} round(s); wrk -t1 -c32 -d{args.seconds}s; "
        f"{args.requests} sequential misses per target per round; LiteLLM {LITELLM_VERSION}, Redis exact cache"
    )
    print(f"LiteLLM's Redis cache: {cache_check['verdict']}\n")
    print("| | kvgate | LiteLLM | kvgate / LiteLLM | bar | met |")
    print("|---|---|---|---|---|---|")
    for label, figure, bar, meets in ROWS:
        mine, other = float(ours[figure]), float(theirs[figure])
        ratio = mine / other if other else float("inf" if mine else "nan")
        met = "" if meets is None else ("yes" if meets(mine, ratio) else "NO")
        print(f"| {label} | {mine:,.2f} | {other:,.2f} | {ratio:.2f}× | {bar} | {met} |")
    reference = f"{direct['p50_ms']:.2f} / {direct['requests_per_s']:,.0f}"
    print(f"| direct to the upstream: p50 ms, 1 client / req/s, 32 connections | {reference} | | | | |\n")
    print(f"misses at 32 connections, other answers: kvgate {ours['miss_other_answers'] or 'none'}, "
          f"LiteLLM {theirs['miss_other_answers'] or 'none'}, direct {direct['other_answers'] or 'none'}")  # fmt: skip
    print(f"misses at 1 client, kinds: kvgate {ours['single_client_kinds']}, LiteLLM {theirs['single_client_kinds']}")  # fmt: skip
    print(f"exact-hit runs, kinds: kvgate {ours['hit_kinds']}, LiteLLM {theirs['hit_kinds']}; requests reaching "
          f"the upstream during them: kvgate {ours['hit_upstream_calls']}, LiteLLM {theirs['hit_upstream_calls']}")  # fmt: skip
    print(f"CPU ms of the Redis per miss / per hit: kvgate's {ours['store_cpu_ms_per_miss']:.3f} / "
          f"{ours['store_cpu_ms_per_hit']:.3f}, LiteLLM's {theirs['store_cpu_ms_per_miss']:.3f} / "
          f"{theirs['store_cpu_ms_per_hit']:.3f}")  # fmt: skip
    for name, lines in log_errors.items():
        print(f"{name} log, error lines: {len(lines)}" + "".join(f"\n    {line[:300]}" for line in lines[:5]))


def write_json(
    path: Path,
    args: argparse.Namespace,
    figures: dict[str, Any],
    rounds: list[dict[str, Any]],
    cache_check: dict[str, Any],
    log_errors: dict[str, list[str]],
) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    settings = {"rounds": args.rounds, "seconds": args.seconds, "requests": args.requests}
    document = {
        "settings": settings | {"cpu_count": os.cpu_count(), "litellm_version": LITELLM_VERSION},
        "litellm_cache_check": cache_check,
        "figures": figures,
        "rounds": rounds,
        "log_errors": log_errors,
    }
    path.write_text(json.dumps(document, indent=2), encoding="utf-8")
    print(f"\nfigures written to {path}")


if __name__ == "__main__":
    sys.exit(main())
