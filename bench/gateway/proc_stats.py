"""CPU time and memory of a server's processes, read from /proc (Linux only).

A server is a process tree: `process_tree` lists it once, after start; `cpu_seconds` and `rss_mb` sum over
the pids given. `split_store` sets a Redis-like child (kvgate's embedded valkey-server) apart from the
gateway's own processes, so that each can be charged separately.
"""

from __future__ import annotations

import os
from pathlib import Path

STORE_NAMES = ("valkey-server", "redis-server")


def process_tree(pid: int) -> list[int]:
    """`pid` and its descendants."""
    found = [pid]
    for task in Path(f"/proc/{pid}/task").iterdir():
        for child in (task / "children").read_text().split():
            found += process_tree(int(child))
    return found


def split_store(pids: list[int]) -> tuple[list[int], list[int]]:
    """(the gateway's processes, its store's), told apart by the command name."""
    store = [pid for pid in pids if Path(f"/proc/{pid}/comm").read_text().strip() in STORE_NAMES]
    return [pid for pid in pids if pid not in store], store


def cpu_seconds(pids: list[int]) -> float:
    """utime + stime of these processes so far, in seconds."""
    ticks = 0
    for pid in pids:
        # The command name (field 2) may hold spaces; the fields after its closing parenthesis do not.
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        ticks += int(fields[11]) + int(fields[12])  # utime, stime: fields 14 and 15 of stat
    return ticks / os.sysconf("SC_CLK_TCK")


def rss_mb(pids: list[int]) -> float:
    """VmRSS of these processes, summed, in MiB."""
    total_kb = 0
    for pid in pids:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                total_kb += int(line.split()[1])
    return total_kb / 1024
