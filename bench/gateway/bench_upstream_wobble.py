"""32 concurrent misses for 30 s through a real kvgate process to an upstream whose listen backlog is 5.

The long form of tests/gateway/traffic/test_upstream_wobble.py (issue 46, item 5: "stay up when the
upstream wobbles"). The upstream is tests/gateway/backlog_upstream.py: Python's `http.server` with its
default backlog of 5 and an accept loop that pauses 5 ms per connection, so that connections overflow
its accept queue and are reset before any byte of the answer. kvgate runs as `kvgate serve` with its
default settings in reverse-proxy mode; every request is a distinct non-streaming miss
(`Cache-Control: no-store`). Both upstream modes are run: HTTP/1.1 keep-alive, and HTTP/1.0 (a new
connection per request, the most an upstream must accept). Prints the requests, the non-200 answers by
status and error code, and whether the upstream breaker opened (seen by /readyz polls every 50 ms, or a
miss shed with `circuit_open`); raises (so `python -m bench` fails) when any answer was not 200 or the
breaker opened.

    python -m bench upstream_wobble
    python bench/gateway/bench_upstream_wobble.py --duration 10 --mode close
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tests.gateway.backlog_upstream import (  # noqa: E402
    ACCEPT_PAUSE_S,
    MODEL,
    LoadReport,
    backlog_upstream,
    miss_load,
)
from tests.reliability.redis_proc import free_port  # noqa: E402

SERVE = "from gateway.cli import app; app()"


@contextmanager
def kvgate_process(upstream_url: str, data_dir: Path, timeout_s: float = 180.0) -> Iterator[str]:
    """`kvgate serve` on a free port in reverse-proxy mode, default settings otherwise; yields its URL. Its
    stderr goes to `data_dir/kvgate.stderr` (shown if it does not start)."""
    port = free_port()
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    env |= {
        "KVGATE_UPSTREAM_URL": upstream_url + "/v1",
        "KVGATE_UPSTREAM_MODELS": MODEL,
        "KVGATE_DATA_DIR": str(data_dir),
        "KVGATE_PORT": str(port),
        "KVGATE_LOG_LEVEL": "warning",
    }
    for name in ("KVGATE_REDIS_URL", "KVGATE_API_KEYS", "KVGATE_API_KEYS_FILE"):
        env.pop(name, None)
    log = data_dir / "kvgate.stderr"
    with log.open("wb") as stderr:
        process = subprocess.Popen(
            [sys.executable, "-c", SERVE, "serve"],
            cwd=ROOT,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=stderr,
        )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                if httpx.get(base + "/readyz", timeout=1.0).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"kvgate did not become ready:\n{log.read_text()[-4000:]}")
            time.sleep(0.1)
        yield base
    finally:
        process.terminate()
        process.wait(timeout=30)


def run(keep_alive: bool, clients: int, duration_s: float, accept_pause_s: float) -> LoadReport:
    with (
        tempfile.TemporaryDirectory() as scratch,
        backlog_upstream(keep_alive=keep_alive, accept_pause_s=accept_pause_s) as upstream_url,
        kvgate_process(upstream_url, Path(scratch)) as base,
    ):
        return asyncio.run(miss_load(base, clients=clients, duration_s=duration_s))


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--clients", type=int, default=32)
    parser.add_argument("--duration", type=float, default=30.0)
    parser.add_argument("--mode", choices=["keep-alive", "close", "both"], default="both")
    parser.add_argument("--accept-pause", type=float, default=ACCEPT_PAUSE_S, help="seconds per accept()")
    args = parser.parse_args(argv)
    modes = ["keep-alive", "close"] if args.mode == "both" else [args.mode]
    failed = []
    for mode in modes:
        report = run(mode == "keep-alive", args.clients, args.duration, args.accept_pause)
        not_ok = ", ".join(f"{status}: {count}" for status, count in report.not_ok.items()) or "none"
        codes = ", ".join(f"{code}: {count}" for code, count in sorted(report.errors.items()))
        print(
            f"upstream {mode} (backlog 5, {args.accept_pause * 1000:.0f} ms per accept), {args.clients} "
            f"clients, {args.duration:.0f} s: {report.requests} requests "
            f"({report.requests / args.duration:.0f}/s); non-200 by status: {not_ok}"
            + (f" ({codes})" if codes else "")
            + f"; upstream breaker opened: {'yes' if report.breaker_opened else 'no'}",
            flush=True,
        )
        if report.not_ok or report.breaker_opened:
            failed.append(mode)
    if failed:
        raise RuntimeError(f"kvgate did not stay up through the wobble ({', '.join(failed)})")


if __name__ == "__main__":
    main(sys.argv[1:])
