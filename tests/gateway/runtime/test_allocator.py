"""The allocator's upkeep: freed heap memory is handed back periodically, off the event loop."""

from __future__ import annotations

import asyncio
import platform

import pytest

from gateway.runtime.allocator import HeapTrimmer, limit_arenas

on_glibc = pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="malloc_trim and mallopt are glibc's")


@on_glibc
async def test_the_trimmer_trims_every_interval_and_stops() -> None:
    trimmer = HeapTrimmer(interval_s=0.05)
    assert trimmer.available
    trimmer.start()
    await asyncio.sleep(0.4)
    await trimmer.stop()
    trims = trimmer.trims
    assert 3 <= trims <= 8 and trimmer.last_duration_s > 0
    await asyncio.sleep(0.15)
    assert trimmer.trims == trims  # stopped means stopped


@on_glibc
def test_arenas_are_limited_unless_the_environment_says_otherwise(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MALLOC_ARENA_MAX", raising=False)
    assert limit_arenas(2)
    monkeypatch.setenv("MALLOC_ARENA_MAX", "4")
    assert not limit_arenas(2)


def test_a_non_positive_interval_is_refused() -> None:
    with pytest.raises(ValueError, match="interval_s"):
        HeapTrimmer(interval_s=0)
