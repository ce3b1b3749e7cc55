"""Background tasks the gateway owns for its lifetime (refreshers, watchers, trimmers)."""

from __future__ import annotations

import asyncio
import contextlib


async def cancel_and_wait(task: asyncio.Task[None] | None) -> None:
    """Cancel `task` (if any) and wait until it has stopped; a no-op for None or a finished task."""
    if task is None:
        return
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
