"""glibc's allocator, kept from growing under sustained load: two arenas, and freed memory handed back.

Under sustained load RSS kept climbing (~40 MB a minute) while Python's live allocations stayed flat: the
memory was free but not returned. Tensors and tokenizer buffers of ever-changing shapes, allocated on
several threads, leave holes in glibc's heaps (one per thread, up to 8 per core), and glibc only gives
back a heap's top. So kvgate caps the heaps at two (`M_ARENA_MAX`) and calls `malloc_trim(0)`, which also
releases free pages inside the heaps, every few seconds, on a worker thread (ctypes releases the GIL).
A fixed mmap threshold stopped the growth too, but slowed the engine's prefill by 10-15% (every large
buffer a fresh mmap, its pages faulted in again). The figures: docs/reliability.md, "Soak".

Only on glibc; elsewhere (musl, macOS) nothing is changed. `MALLOC_ARENA_MAX` in the environment wins.
"""

from __future__ import annotations

import asyncio
import ctypes
import logging
import os
import platform
import time
from collections.abc import Callable

from gateway.runtime.background import cancel_and_wait

logger = logging.getLogger("kvgate.allocator")

M_ARENA_MAX = -8
ARENA_MAX = 2


def limit_arenas(arena_max: int = ARENA_MAX) -> bool:
    """Cap glibc's heaps (call before the worker threads start allocating); False where not applied."""
    libc = _glibc()
    if libc is None or "MALLOC_ARENA_MAX" in os.environ:
        return False
    return bool(libc.mallopt(M_ARENA_MAX, arena_max) == 1)


class HeapTrimmer:
    """Calls `malloc_trim(0)` every `interval_s` seconds on a worker thread."""

    def __init__(self, interval_s: float) -> None:
        if interval_s <= 0:
            raise ValueError("interval_s must be > 0")
        self.interval_s = interval_s
        self.last_duration_s = 0.0
        self.trims = 0
        self._trim = _malloc_trim()
        self._task: asyncio.Task[None] | None = None

    @property
    def available(self) -> bool:
        return self._trim is not None

    def start(self) -> None:
        if self._trim is not None and self._task is None:
            self._task = asyncio.create_task(self._run(self._trim), name="heap-trimmer")

    async def stop(self) -> None:
        await cancel_and_wait(self._task)
        self._task = None

    async def _run(self, trim: Callable[[int], int]) -> None:
        while True:
            await asyncio.sleep(self.interval_s)
            started = time.perf_counter()
            await asyncio.to_thread(trim, 0)
            self.last_duration_s = time.perf_counter() - started
            self.trims += 1
            logger.debug("malloc_trim took %.1f ms", self.last_duration_s * 1000)


def _malloc_trim() -> Callable[[int], int] | None:
    libc = _glibc()
    trim: Callable[[int], int] | None = getattr(libc, "malloc_trim", None) if libc is not None else None
    return trim


def _glibc() -> ctypes.CDLL | None:
    if platform.libc_ver()[0] != "glibc":
        return None
    try:
        return ctypes.CDLL("libc.so.6")
    except OSError:
        return None
