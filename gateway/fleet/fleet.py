"""The fleet now: its pools and members, checked in the background and rebuilt when the world changes.

    start()   resolve every member's addresses -> build the pools -> check every member once (those that
              pass serve at once; what each lists is known before the first request) -> background tasks:
              active checks every `health_interval_s`, DNS every `dns_refresh_s` (when a `dns+` member is
              configured), the upstreams file (when there is one)
    apply()   a new configuration or new addresses: members that stay are kept as they are (their health,
              counters, connections and requests in flight), with their new weight and side; new ones join
              after their first passing check; the others are drained. Pools that keep their routing keep
              their policy (the prefix table). The new pools replace the old in one assignment, so a request
              routes on either the old or the new fleet, never a mix, and requests in flight finish where
              they are.

This module owns members' lifetimes and checks; routing is the pools', failover the backend's.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from gateway.fleet.config import FleetConfig, read_upstreams_file
from gateway.fleet.discovery import FileWatch, Targets, resolve_targets
from gateway.fleet.health import HealthPolicy, probe
from gateway.fleet.member import ClientOptions, Member
from gateway.fleet.pool import Pool
from gateway.fleet.routing import make_policy
from gateway.runtime.background import cancel_and_wait
from gateway.runtime.settings import Settings

logger = logging.getLogger("kvgate.fleet")


@dataclass(frozen=True, slots=True)
class FleetOptions:
    """The `KVGATE_FLEET_*`, `upstream_*` and `breaker_*` settings a fleet runs with."""

    health: HealthPolicy = field(default_factory=HealthPolicy)
    client: ClientOptions = field(default_factory=ClientOptions)
    load_bound: float = 1.25
    health_interval_s: float = 2.0
    health_timeout_s: float = 2.0
    dns_refresh_s: float = 10.0
    connect_budget_s: float = 10.0
    """How long one request may keep trying members that have not begun answering it."""
    watched_file: Path | None = None

    @classmethod
    def from_settings(cls, settings: Settings) -> FleetOptions:
        return cls(
            health=HealthPolicy(
                eject_failures=settings.fleet_eject_failures,
                unhealthy_checks=settings.fleet_unhealthy_checks,
                slow_start_s=settings.fleet_slow_start_s,
                breaker_failures=settings.breaker_failures,
                breaker_failure_rate=settings.breaker_failure_rate,
                breaker_window_s=settings.breaker_window_s,
                breaker_cooldown_s=settings.breaker_cooldown_s,
            ),
            client=ClientOptions(
                timeout_s=settings.upstream_timeout_s,
                connect_timeout_s=settings.upstream_connect_timeout_s,
                max_connections=settings.upstream_max_connections,
                keepalive_s=settings.upstream_keepalive_s,
            ),
            load_bound=settings.fleet_load_bound,
            health_interval_s=settings.fleet_health_interval_s,
            health_timeout_s=settings.fleet_health_timeout_s,
            dns_refresh_s=settings.fleet_dns_refresh_s,
            connect_budget_s=min(settings.upstream_connect_timeout_s, settings.upstream_timeout_s),
            watched_file=settings.upstreams_file,
        )


class Fleet:
    def __init__(self, config: FleetConfig, options: FleetOptions) -> None:
        self.config = config
        self.options = options
        self.pools: tuple[Pool, ...] = ()
        self._targets: Targets = {}
        self._checks: httpx.AsyncClient | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._draining: set[asyncio.Task[None]] = set()
        self._watch: FileWatch | None = None
        self._applying = asyncio.Lock()

    # --- lifetime -----------------------------------------------------------------------------------------

    async def start(self) -> None:
        self._checks = httpx.AsyncClient(limits=httpx.Limits(max_keepalive_connections=0))
        self._targets = await resolve_targets(self.config)
        self._rebuild(self.config, self._targets)
        await self.check_all(first=True)
        loop = asyncio.get_running_loop()
        self._tasks.append(loop.create_task(self._check_forever(), name="fleet-checks"))
        if any(spec.discovered for pool in self.config.pools for spec in pool.members):
            self._tasks.append(loop.create_task(self._resolve_forever(), name="fleet-dns"))
        if self.options.watched_file is not None:
            self._watch = FileWatch(self.options.watched_file, self.reload)
            self._watch.start()
        described = ", ".join(
            f"{pool.name}: {len(pool.members)} ({pool.spec.routing})" for pool in self.pools
        )
        logger.info("fleet from %s: %s", self.config.source, described)

    async def close(self) -> None:
        if self._watch is not None:
            await self._watch.stop()
        for task in self._tasks:
            await cancel_and_wait(task)
        for task in list(self._draining):
            await cancel_and_wait(task)
        for member in self.members():
            await member.client.close()
        if self._checks is not None:
            await self._checks.aclose()

    # --- what the backend asks ----------------------------------------------------------------------------

    def pool_for(self, model: str) -> Pool | None:
        """The first pool that serves `model` (None: no pool does: a 404)."""
        return next((pool for pool in self.pools if pool.serves(model)), None)

    def members(self) -> Iterator[Member]:
        for pool in self.pools:
            yield from pool.everyone

    def models(self) -> list[str]:
        """The union of what the pools serve, in their order."""
        names: dict[str, None] = {}
        for pool in self.pools:
            names.update(dict.fromkeys(pool.listed_models()))
        return list(names)

    # --- change -------------------------------------------------------------------------------------------

    async def reload(self) -> None:
        """Read the upstreams file again and apply it (raises, changing nothing, if it does not parse)."""
        assert self.options.watched_file is not None
        routing = self.pools[0].spec.routing if self.pools else "prefix"
        config = await asyncio.to_thread(read_upstreams_file, self.options.watched_file, routing)
        await self.apply(config)

    async def apply(self, config: FleetConfig) -> None:
        async with self._applying:
            targets = await resolve_targets(config, self._targets)
            joined = self._rebuild(config, targets)
            self.config, self._targets = config, targets
            await asyncio.gather(*(self._check(member) for member in joined))

    async def check_all(self, *, first: bool = False) -> None:
        await asyncio.gather(*(self._check(member, first=first) for member in self.members()))

    # --- private ------------------------------------------------------------------------------------------

    def _rebuild(self, config: FleetConfig, targets: Targets) -> list[Member]:
        """Swap in the pools `config` describes; returns the members that joined."""
        kept = {
            (pool.name, member.spec.identity, member.url): member
            for pool in self.pools
            for member in pool.everyone
        }
        old_pools = {pool.name: pool for pool in self.pools}
        pools, joined, staying = [], [], set()
        for spec in config.pools:
            old = old_pools.get(spec.name)
            policy = old.policy if old is not None and old.spec.routing == spec.routing else None
            members: list[Member] = []
            names: set[str] = set()
            for member_spec in dict.fromkeys(spec.members):
                for name, url in targets.get(member_spec, []):
                    key = (spec.name, member_spec.identity, url)
                    member = kept.get(key)
                    if member is None or key in staying:
                        unique = name if name not in names else f"{name}#{len(members) + 1}"
                        member = Member(
                            member_spec, url, unique, self.options.client, self.options.health, admitted=False
                        )
                        joined.append(member)
                    else:
                        member.spec = member_spec  # a new weight or side takes effect now
                    staying.add(key)
                    names.add(member.name)
                    members.append(member)
            pools.append(Pool(spec, policy or make_policy(spec.routing, self.options.load_bound), members))
        self.pools = tuple(pools)
        for key, member in kept.items():
            if key not in staying:
                self._drain(member)
        return joined

    def _drain(self, member: Member) -> None:
        logger.info("backend %s left its pool; draining %d request(s)", member.name, member.in_flight)
        task = asyncio.get_running_loop().create_task(member.drain_and_close())
        self._draining.add(task)
        task.add_done_callback(self._draining.discard)

    async def _check(self, member: Member, *, first: bool = False) -> None:
        assert self._checks is not None
        seen = await probe(self._checks, member.url, member.spec.api_key, self.options.health_timeout_s)
        if not seen.alive:
            member.health.check_failed(seen.reason)
            return
        if seen.models is not None:
            member.models = seen.models
        if first:
            member.health.admit_now()
        else:
            member.health.check_passed()

    async def _check_forever(self) -> None:
        while True:
            await asyncio.sleep(self.options.health_interval_s)
            await self.check_all()

    async def _resolve_forever(self) -> None:
        while True:
            await asyncio.sleep(self.options.dns_refresh_s)
            targets = await resolve_targets(self.config, self._targets)
            if targets != self._targets:
                logger.info("fleet addresses changed; rebuilding the pools")
                await self.apply(self.config)
