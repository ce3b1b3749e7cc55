"""Load against one real kvgate process: many concurrent clients on a mix of exact hits, semantic hits
and misses, with a backend slow enough (and `KVGATE_MAX_PENDING` small enough) that misses overload it.

Starts its own redis-server on a free loopback port and one kvgate process (`create_app` with the
scripted backend, tests/reliability/kvgate_proc.py). Reports requests and p50 / p99 latency per class
(classes as the gateway answered them: `exact-hit`, `semantic-hit`, `miss`, `429`), transport errors
(dropped connections), 5xx, whether every 429 carried `Retry-After`, and the process RSS before / after.

    python -m bench reliability              # 200 clients, 60 s
    python bench/gateway/bench_reliability.py --clients 50 --duration 10
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import sys
import tempfile
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import psutil

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tests.reliability.kvgate_runner import KvgateProcess  # noqa: E402
from tests.reliability.prompts import TOPICS  # noqa: E402
from tests.reliability.redis_proc import RedisProcess  # noqa: E402

HEADERS = {"Authorization": "Bearer key-alpha"}
MODEL = "fake-model"
SEEDED = TOPICS[:12]
MAX_GROWTH_AFTER_WARMUP = 0.05  # of the RSS at the start of the second round


@dataclass
class LoadReport:
    latencies: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))
    statuses: Counter[str] = field(default_factory=Counter)
    errors: Counter[str] = field(default_factory=Counter)
    missing_retry_after: int = 0
    rss_before_mb: float = 0.0
    rss_after_mb: float = 0.0
    rss_samples_mb: list[float] = field(default_factory=list)  # one a second while the load runs

    @property
    def requests(self) -> int:
        return sum(self.statuses.values()) + sum(self.errors.values())

    def failures(self) -> list[str]:
        """What this run breaks of the issue's load goals (memory is judged across rounds, in `main`)."""
        failures = []
        if self.errors:
            failures.append(f"dropped connections {dict(self.errors)}")
        if self.server_errors:
            failures.append(f"{self.server_errors} 5xx")
        if self.missing_retry_after:
            failures.append(f"{self.missing_retry_after} 429s without Retry-After")
        missing = {"exact-hit", "semantic-hit", "miss"} - set(self.latencies)
        if missing:
            failures.append(f"no {sorted(missing)} answers")
        return failures

    @property
    def server_errors(self) -> int:
        return sum(count for status, count in self.statuses.items() if status.startswith("5"))

    def lines(self, duration_s: float) -> list[str]:
        out = [f"{'class':<14}{'requests':>10}{'p50 ms':>10}{'p99 ms':>10}"]
        for name, values in sorted(self.latencies.items()):
            ordered = sorted(values)
            p99 = ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]
            out.append(
                f"{name:<14}{len(values):>10}{statistics.median(values) * 1000:>10.1f}{p99 * 1000:>10.1f}"
            )
        out.append(
            f"total {self.requests} requests in {duration_s:.0f} s ({self.requests / duration_s:.0f}/s); "
            f"statuses {dict(self.statuses)}; transport errors {dict(self.errors) or 0}; "
            f"5xx {self.server_errors}; 429 without Retry-After {self.missing_retry_after}"
        )
        out.append(f"RSS before {self.rss_before_mb:.0f} MB, after {self.rss_after_mb:.0f} MB")
        if len(self.rss_samples_mb) >= 4:
            quarters = [self.rss_samples_mb[len(self.rss_samples_mb) * q // 4] for q in range(4)]
            out.append(
                "RSS by quarter of the run: " + " / ".join(f"{value:.0f}" for value in quarters) + " MB"
            )
        return out


def body(prompt: str) -> dict[str, object]:
    return {"model": MODEL, "messages": [{"role": "user", "content": prompt}]}


def pick_prompt(rng: random.Random, counter: list[int]) -> str:
    """A third exact repeats, a third near-paraphrases of stored prompts, a third new prompts."""
    roll = rng.random()
    topic = rng.choice(SEEDED)
    if roll < 1 / 3:
        return topic
    if roll < 2 / 3:
        # Same meaning, another exact key; a wording a semantic hit served is remembered (an exact hit
        # next time), so each near-paraphrase is new: letters upper-cased at random.
        return "".join(char.upper() if rng.random() < 0.2 else char for char in topic)
    counter[0] += 1
    return f"{rng.choice(TOPICS[12:])} Variant {counter[0]} of {rng.randrange(10**9)}"


async def run_load(base: str, clients: int, duration_s: float, pid: int | None = None) -> LoadReport:
    """Drive `base` with `clients` concurrent clients for `duration_s`; seeds the stored prompts first."""
    report = LoadReport()
    process = psutil.Process(pid) if pid is not None else None
    limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)
    async with httpx.AsyncClient(base_url=base, timeout=60.0, limits=limits) as client:
        for prompt in SEEDED:
            await client.post("/v1/chat/completions", json=body(prompt), headers=HEADERS)
        if process is not None:
            report.rss_before_mb = process.memory_info().rss / 2**20
        deadline = time.monotonic() + duration_s
        counter = [0]

        async def one_client(seed: int) -> None:
            rng = random.Random(seed)
            while time.monotonic() < deadline:
                started = time.monotonic()
                try:
                    response = await client.post(
                        "/v1/chat/completions", json=body(pick_prompt(rng, counter)), headers=HEADERS
                    )
                except httpx.HTTPError as error:
                    report.errors[type(error).__name__] += 1
                    continue
                elapsed = time.monotonic() - started
                report.statuses[str(response.status_code)] += 1
                if response.status_code == 429:
                    report.latencies["429"].append(elapsed)
                    report.missing_retry_after += "retry-after" not in response.headers
                    await asyncio.sleep(float(response.headers.get("retry-after", "1")) * rng.random())
                elif response.status_code == 200:
                    report.latencies[response.headers["x-kvgate-cache"]].append(elapsed)

        async def sample_rss() -> None:
            while process is not None and time.monotonic() < deadline:
                report.rss_samples_mb.append(process.memory_info().rss / 2**20)
                await asyncio.sleep(1.0)

        await asyncio.gather(sample_rss(), *(one_client(seed) for seed in range(clients)))
        if process is not None:
            report.rss_after_mb = process.memory_info().rss / 2**20
    return report


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--clients", type=int, default=200)
    parser.add_argument("--duration", type=float, default=60.0)
    parser.add_argument("--max-pending", type=int, default=16)
    parser.add_argument("--delay", type=float, default=0.02, help="scripted backend seconds per word")
    parser.add_argument(
        "--rounds",
        type=int,
        default=2,
        help="load runs back to back on the same process: the first warms it up (model buffers, "
        "allocator arenas, connection pools), later ones show whether memory keeps growing",
    )
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as scratch:
        redis_server = RedisProcess(Path(scratch) / "redis", appendfsync="everysec")
        redis_server.start()
        env = {"KVGATE_MAX_PENDING": str(args.max_pending), "KVGATE_TEST_DELAY_S": str(args.delay)}
        kvgate = KvgateProcess(redis_server.url, Path(scratch) / "kvgate", env=env)
        try:
            kvgate.launch()
            kvgate.wait_ready()
            assert kvgate.process is not None
            print(
                f"{args.clients} clients, {args.duration:.0f} s, max_pending {args.max_pending}, "
                f"delay {args.delay} s/word, {args.rounds} rounds on one process",
                flush=True,
            )
            reports = []
            for round_number in range(1, args.rounds + 1):
                report = asyncio.run(run_load(kvgate.base, args.clients, args.duration, kvgate.process.pid))
                reports.append(report)
                print(f"round {round_number}:")
                print("\n".join(report.lines(args.duration)), flush=True)
        finally:
            kvgate.kill()
            redis_server.kill()
    failures = [
        f"round {number}: {failure}" for number, r in enumerate(reports, 1) for failure in r.failures()
    ]
    if len(reports) >= 2:
        # Stable: after the first round (the warm-up), RSS may move by noise, not keep climbing.
        growth = reports[-1].rss_after_mb - reports[1].rss_before_mb
        if growth > MAX_GROWTH_AFTER_WARMUP * reports[1].rss_before_mb:
            failures.append(f"RSS grew {growth:.0f} MB after the warm-up round")
    if failures:
        raise RuntimeError("load goals not met: " + "; ".join(failures))


if __name__ == "__main__":
    main(sys.argv[1:])
