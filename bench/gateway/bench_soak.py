"""Soak: one kvgate process under sustained load whose stored entries keep growing; does memory follow
the entries, or something else?

The load is bench_reliability's mix (200 clients: exact repeats, near-paraphrases, and new prompts that
each store an entry), run as back-to-back one-minute rounds on one process. It prints RSS after each
minute and the entries in Redis, then the slope after the warm-up minute, the entries stored meanwhile
and the bytes of growth per stored entry. It fails on 5xx, dropped connections, or growth above
`--bytes-per-entry` per stored entry plus `--slack-mb`.

    python -m bench soak                          # 20 minutes after a one-minute warm-up
    python bench/gateway/bench_soak.py --minutes 3 --trace  # and where Python's allocations grew, by line
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path

import numpy as np
import psutil
import redis

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.gateway.bench_reliability import run_load  # noqa: E402
from tests.reliability.kvgate_runner import KvgateProcess  # noqa: E402
from tests.reliability.redis_proc import RedisProcess  # noqa: E402

ROUND_S = 60.0
TOP_LINES = 15


def stored_entries(url: str) -> int:
    """Entries in Redis now: one `e` hash each (`kvgate:sc:{scope}:e:<id>`)."""
    with redis.Redis.from_url(url) as client:
        return sum(1 for _ in client.scan_iter(match="kvgate:sc:{*}:e:*", count=10_000))


def allocation_growth(first: Path, last: Path) -> list[str]:
    """The lines whose live Python allocations grew most between two snapshots."""
    ignore = [tracemalloc.Filter(False, tracemalloc.__file__), tracemalloc.Filter(False, "<frozen *>")]
    before = tracemalloc.Snapshot.load(str(first)).filter_traces(ignore)
    after = tracemalloc.Snapshot.load(str(last)).filter_traces(ignore)
    return [str(stat) for stat in after.compare_to(before, "lineno")[:TOP_LINES]]


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--minutes", type=int, default=20, help="measured minutes after the warm-up minute")
    parser.add_argument("--clients", type=int, default=200)
    parser.add_argument("--max-pending", type=int, default=16)
    parser.add_argument("--delay", type=float, default=0.02, help="scripted backend seconds per word")
    parser.add_argument("--bytes-per-entry", type=float, default=4096.0)
    parser.add_argument("--slack-mb", type=float, default=20.0)
    parser.add_argument("--trace", action="store_true", help="tracemalloc in kvgate (slower): top growth")
    args = parser.parse_args(argv)
    failures: list[str] = []
    with tempfile.TemporaryDirectory() as scratch:
        redis_server = RedisProcess(Path(scratch) / "redis", appendfsync="everysec")
        redis_server.start()
        env = {"KVGATE_MAX_PENDING": str(args.max_pending), "KVGATE_TEST_DELAY_S": str(args.delay)}
        snapshots = Path(scratch) / "snapshot"
        if args.trace:
            env["KVGATE_TEST_TRACEMALLOC"] = str(snapshots)
        kvgate = KvgateProcess(redis_server.url, Path(scratch) / "kvgate", env=env)
        try:
            kvgate.launch()
            kvgate.wait_ready()
            assert kvgate.process is not None
            process = psutil.Process(kvgate.process.pid)
            start_mb = process.memory_info().rss / 2**20
            print(
                f"{args.clients} clients, 1 warm-up + {args.minutes} minutes; RSS at start {start_mb:.0f} MB"
            )
            print(f"{'minute':>6} {'RSS MB':>8} {'entries':>8} {'requests':>9} {'5xx':>4} {'dropped':>8}")
            rows: list[tuple[float, int]] = []
            started = time.monotonic()
            for minute in range(args.minutes + 1):
                report = asyncio.run(run_load(kvgate.base, args.clients, ROUND_S, kvgate.process.pid))
                rss_mb = process.memory_info().rss / 2**20
                entries = stored_entries(redis_server.url)
                rows.append((rss_mb, entries))
                dropped = sum(report.errors.values())
                print(
                    f"{minute:>6} {rss_mb:>8.0f} {entries:>8} {report.requests:>9} "
                    f"{report.server_errors:>4} {dropped:>8}",
                    flush=True,
                )
                failures += [f"minute {minute}: {failure}" for failure in report.failures()]
                if args.trace:
                    process.send_signal(10)  # SIGUSR1: kvgate_proc.py writes snapshot.<minute + 1>
                    time.sleep(3.0)
            elapsed_min = (time.monotonic() - started) / 60
            if args.trace and args.minutes >= 1:
                print(
                    f"\nPython allocations grown from the end of minute 0 to the end of minute {args.minutes}:"
                )
                print(
                    "\n".join(
                        allocation_growth(Path(f"{snapshots}.1"), Path(f"{snapshots}.{args.minutes + 1}"))
                    )
                )
        finally:
            kvgate.kill()
            redis_server.kill()
    (warm_mb, warm_entries), (last_mb, last_entries) = rows[0], rows[-1]
    # RSS swings by tens of MB between two heap trims, so the growth is the least-squares line's rise over
    # the measured minutes (minute 0, the warm-up, included as its start), not the last sample's.
    slope = float(np.polyfit(range(len(rows)), [rss for rss, _ in rows], 1)[0]) if len(rows) > 1 else 0.0
    growth_mb = slope * args.minutes
    stored = last_entries - warm_entries
    per_entry = growth_mb * 2**20 / stored if stored else float("nan")
    allowed_mb = stored * args.bytes_per_entry / 2**20 + args.slack_mb
    band = [rss for rss, _ in rows[1:]] or [warm_mb]
    print(
        f"\nwarm-up: {start_mb:.0f} -> {warm_mb:.0f} MB (+{warm_mb - start_mb:.0f}); after it, {args.minutes} min "
        f"({elapsed_min:.1f} min with sampling): slope {slope:.2f} MB/min, growth {growth_mb:+.1f} MB "
        f"(last sample {last_mb - warm_mb:+.1f} MB; RSS between {min(band):.0f} and {max(band):.0f} MB), "
        f"{stored} entries stored, {per_entry:.0f} B per stored entry; allowed {allowed_mb:.1f} MB "
        f"({args.bytes_per_entry:.0f} B/entry + {args.slack_mb:.0f} MB)"
    )
    if growth_mb > allowed_mb:
        failures.append(f"RSS grew {growth_mb:.1f} MB, more than the {allowed_mb:.1f} MB the entries explain")
    if failures:
        raise RuntimeError("soak goals not met: " + "; ".join(failures))


if __name__ == "__main__":
    main(sys.argv[1:])
