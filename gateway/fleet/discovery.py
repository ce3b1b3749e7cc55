"""Where the members are: a `dns+` name resolved to every address behind it, and the file watched.

**DNS.** `dns+http://vllm-headless:8000/v1` stands for every address `vllm-headless` resolves to (a
Kubernetes headless service lists one per ready pod): each becomes a member named `vllm-headless/ADDRESS:8000`,
reached at `http://ADDRESS:8000/v1`. The name is resolved again every `KVGATE_FLEET_DNS_REFRESH_S`; an
address that appears joins (after its first passing check, with slow start), one that disappears is
drained (it gets no new request and is closed once its last answer ends). A resolution that fails keeps
the addresses of the last one that worked: a DNS hiccup must not empty a pool. Opt-in by the prefix
because a public API's name also resolves to several addresses, which must not become members (TLS and
virtual hosting need the name).

**The file.** `KVGATE_UPSTREAMS_FILE` is read again on SIGHUP, or when its modification time or size
changes (checked every `WATCH_S`; SIGHUP reaches only a process that runs the gateway in its main thread,
the file check reaches every one, `--workers` included). A file that does not parse is logged and the
fleet keeps serving as it was; one that does is applied without dropping a request (fleet.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import socket
from collections.abc import Awaitable, Callable
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

from gateway.fleet.config import DISCOVERED, FleetConfig, MemberSpec
from gateway.fleet.member import member_name

logger = logging.getLogger("kvgate.fleet")

WATCH_S = 1.0

Target = tuple[str, str]
"""(member name, URL) of one address."""
Targets = dict[MemberSpec, list[Target]]


async def resolve_targets(config: FleetConfig, previous: Targets | None = None) -> Targets:
    """Every member spec's addresses now (a failed resolution keeps `previous`'s for that spec)."""
    targets: Targets = {}
    for pool in config.pools:
        for spec in pool.members:
            if spec in targets:
                continue
            if not spec.discovered:
                targets[spec] = [(member_name(spec.api_base), spec.api_base)]
                continue
            try:
                targets[spec] = await resolve(spec.api_base)
            except OSError as error:
                kept = (previous or {}).get(spec, [])
                logger.warning(
                    "cannot resolve %s (%s); keeping %d address(es)", spec.api_base, error, len(kept)
                )
                targets[spec] = kept
    return targets


async def resolve(api_base: str) -> list[Target]:
    """A `dns+` URL's addresses, each as a member name and URL, sorted (stable across refreshes)."""
    parts = urlsplit(api_base.removeprefix(DISCOVERED))
    host = parts.hostname or ""
    port = parts.port or (443 if parts.scheme == "https" else 80)
    found = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
    addresses = sorted({str(address[4][0]) for address in found})
    targets = []
    for address in addresses:
        netloc = f"[{address}]:{port}" if ":" in address else f"{address}:{port}"
        url = urlunsplit((parts.scheme, netloc, parts.path, parts.query, ""))
        targets.append((member_name(url, host=host), url))
    return targets


class FileWatch:
    """Calls `reload` when the file changes or the process gets SIGHUP."""

    def __init__(self, path: Path, reload: Callable[[], Awaitable[None]]) -> None:
        self.path = path
        self._reload = reload
        self._wake = asyncio.Event()
        self._seen = _stamp(path)
        self._task: asyncio.Task[None] | None = None
        self._signal = False

    def start(self) -> None:
        loop = asyncio.get_running_loop()
        # Only the main thread may take signals (tests run the app in a thread: the file check suffices).
        with contextlib.suppress(ValueError, RuntimeError, NotImplementedError):
            loop.add_signal_handler(signal.SIGHUP, self._wake.set)
            self._signal = True
        self._task = loop.create_task(self._watch(), name="fleet-file-watch")

    async def stop(self) -> None:
        if self._signal:
            with contextlib.suppress(ValueError, RuntimeError):
                asyncio.get_running_loop().remove_signal_handler(signal.SIGHUP)
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def _watch(self) -> None:
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), WATCH_S)
            signalled = self._wake.is_set()
            self._wake.clear()
            stamp = _stamp(self.path)
            if signalled or stamp != self._seen:
                self._seen = stamp
                logger.info("re-reading %s (%s)", self.path, "SIGHUP" if signalled else "changed")
                try:
                    await self._reload()
                except Exception:  # a bad file is logged; the fleet keeps serving as it was
                    logger.exception("%s not applied; the fleet is unchanged", self.path)


def _stamp(path: Path) -> tuple[float, int] | None:
    try:
        status = path.stat()
    except OSError:
        return None
    return (status.st_mtime, status.st_size)
