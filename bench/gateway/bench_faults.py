"""Redis killed in the middle of a full load run against one real kvgate process, then restarted.

The long form of tests/reliability/test_redis_faults.py: 50 clients for 60 s (`bench_reliability`'s
mix of exact hits, near-duplicates and new prompts), Redis (AOF, `appendfsync always`) SIGKILLed at
20 s and started again on the same port and files at 35 s. Reports the statuses of the whole run
(every request must still get an answer: the cache fails open to the backend), what `/readyz` said
before, during and after the outage, how many error lines kvgate logged, how long after the restart
the first new prompt was stored again (goal: < 5 s, no kvgate restart; probes are sent every
0.25 s and the moment their miss completed counts), and whether every entry acknowledged
before the kill is still an exact hit afterwards. Raises (so `python -m bench` fails) when a goal is
not met.

    python -m bench faults
    python bench/gateway/bench_faults.py --clients 20 --duration 20 --kill-at 4 --restart-at 8
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.gateway.bench_reliability import HEADERS, LoadReport, body, run_load  # noqa: E402
from tests.reliability.kvgate_runner import KvgateProcess  # noqa: E402
from tests.reliability.prompts import TOPICS  # noqa: E402
from tests.reliability.redis_proc import RedisProcess  # noqa: E402

OUTAGE_LOG = "cache store unavailable"
ACKNOWLEDGED = [f"{topic} (acknowledged before the outage)" for topic in TOPICS[:24]]


@dataclass
class FaultReport:
    readyz: Counter[str] = field(default_factory=Counter)  # "<phase>: <status>/<store>" -> polls
    resumed_after_s: float | None = None  # when the first probe whose answer was stored completed
    cached_probes: list[float] = field(default_factory=list)
    survived: int = 0
    error_lines: int = 0


async def cache_class(client: httpx.AsyncClient, prompt: str) -> str:
    response = await client.post("/v1/chat/completions", json=body(prompt), headers=HEADERS)
    return response.headers.get("x-kvgate-cache", str(response.status_code))


async def inject(
    base: str, redis_server: RedisProcess, kill_at: float, restart_at: float, report: FaultReport
) -> None:
    """Kill Redis at `kill_at`, restart it at `restart_at`, poll /readyz throughout, time the resume."""
    started = time.monotonic()
    async with httpx.AsyncClient(base_url=base, timeout=30.0) as client:

        async def poll_until(moment: float, phase: str) -> None:
            while time.monotonic() - started < moment:
                ready = (await client.get("/readyz")).json()
                report.readyz[f"{phase}: {ready['status']}/{ready['store']}"] += 1
                await asyncio.sleep(0.5)

        await poll_until(kill_at, "before")
        await asyncio.to_thread(redis_server.kill)
        await poll_until(restart_at, "outage")
        await asyncio.to_thread(redis_server.start)
        restarted = time.monotonic()

        async def probe(number: int) -> None:
            # A fresh prompt: a miss whose answer is stored if the store is back by the time it completes.
            prompt = f"Is caching back yet? Probe {number}."
            if await cache_class(client, prompt) == "miss":
                completed = time.monotonic() - restarted
                if await cache_class(client, prompt) == "exact-hit":
                    report.cached_probes.append(completed)

        # One probe every 0.25 s for 10 s, concurrently: a slow answer under load does not delay the next.
        probes = []
        for number in range(40):
            probes.append(asyncio.create_task(probe(number)))
            await asyncio.sleep(0.25)
        await asyncio.gather(*probes)
        if report.cached_probes:
            report.resumed_after_s = min(report.cached_probes)
        await poll_until(time.monotonic() - started + 2.0, "after")


async def seed(base: str) -> None:
    async with httpx.AsyncClient(base_url=base, timeout=30.0) as client:
        for prompt in ACKNOWLEDGED:
            if await cache_class(client, prompt) != "miss":
                raise RuntimeError(f"seeding: {prompt!r} was not a fresh miss")


async def count_survivors(base: str) -> int:
    async with httpx.AsyncClient(base_url=base, timeout=30.0) as client:
        return sum([await cache_class(client, prompt) == "exact-hit" for prompt in ACKNOWLEDGED])


async def run(
    args: argparse.Namespace, kvgate: KvgateProcess, redis_server: RedisProcess
) -> tuple[LoadReport, FaultReport]:
    report = FaultReport()
    await seed(kvgate.base)
    assert kvgate.process is not None
    load, _ = await asyncio.gather(
        run_load(kvgate.base, args.clients, args.duration, kvgate.process.pid),
        inject(kvgate.base, redis_server, args.kill_at, args.restart_at, report),
    )
    report.survived = await count_survivors(kvgate.base)
    print("\n".join(load.lines(args.duration)))
    return load, report


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--clients", type=int, default=50)
    parser.add_argument("--duration", type=float, default=60.0)
    parser.add_argument("--kill-at", type=float, default=20.0, help="seconds into the run")
    parser.add_argument("--restart-at", type=float, default=35.0, help="seconds into the run")
    parser.add_argument("--max-pending", type=int, default=16)
    parser.add_argument("--delay", type=float, default=0.02, help="scripted backend seconds per word")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as scratch:
        redis_server = RedisProcess(Path(scratch) / "redis", appendfsync="always")
        redis_server.start()
        env = {"KVGATE_MAX_PENDING": str(args.max_pending), "KVGATE_TEST_DELAY_S": str(args.delay)}
        log = Path(scratch) / "kvgate.stderr"
        kvgate = KvgateProcess(redis_server.url, Path(scratch) / "kvgate", env=env, stderr_path=log)
        try:
            kvgate.launch()
            kvgate.wait_ready()
            print(
                f"{args.clients} clients, {args.duration:.0f} s; Redis SIGKILLed at {args.kill_at:.0f} s, "
                f"restarted at {args.restart_at:.0f} s",
                flush=True,
            )
            load, report = asyncio.run(run(args, kvgate, redis_server))
        finally:
            kvgate.kill()
            redis_server.kill()
        report.error_lines = sum(OUTAGE_LOG in line for line in log.read_text(errors="replace").splitlines())
    print("/readyz polls: " + ", ".join(f"{key} × {count}" for key, count in report.readyz.items()))
    resumed = f"{report.resumed_after_s:.2f} s" if report.resumed_after_s is not None else "not within 30 s"
    print(
        f"caching resumed {resumed} after the restart; {report.error_lines} '{OUTAGE_LOG}' log line(s) for a "
        f"{args.restart_at - args.kill_at:.0f} s outage; {report.survived}/{len(ACKNOWLEDGED)} entries "
        "acknowledged before the kill are exact hits after it"
    )
    failures = load.failures()
    if report.resumed_after_s is None or report.resumed_after_s > 5.0:
        failures.append(f"caching resumed {resumed} after the restart (goal: within 5 s)")
    if report.survived < len(ACKNOWLEDGED):
        failures.append(f"only {report.survived}/{len(ACKNOWLEDGED)} acknowledged entries survived")
    if not any(key.startswith("outage: degraded") for key in report.readyz):
        failures.append(f"/readyz never said degraded during the outage: {dict(report.readyz)}")
    if not 1 <= report.error_lines <= 2:  # one at the failure; the 60 s interval allows one more at most
        failures.append(f"{report.error_lines} error log lines for one outage")
    if failures:
        raise RuntimeError("fault goals not met: " + "; ".join(failures))


if __name__ == "__main__":
    main(sys.argv[1:])
