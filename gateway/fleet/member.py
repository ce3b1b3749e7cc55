"""One backend of a pool: where it is, the client that reaches it, its health and its counters.

A member's client is the single upstream's own (`gateway/backends/upstream.py`: the body forwarded as sent,
the answer relayed whole, errors in OpenAI's shape) with its own retries off: a fleet does not retry a
refused connection on the member that refused it, it sends the request to the next member at once, and
backs off only when every member has failed it (backend.py). The member has no breaker of its own inside
the client: its health (health.py) owns the breaker, so that requests and checks count in one place.
"""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any
from urllib.parse import urlsplit

from gateway.backends.protocol import GenerationRequest
from gateway.backends.upstream import UpstreamBackend
from gateway.fleet.config import MemberSpec
from gateway.fleet.health import HealthPolicy, MemberHealth
from gateway.fleet.metrics import MemberStats


@dataclasses.dataclass(frozen=True, slots=True)
class ClientOptions:
    """How a member's HTTP client is built (the `upstream_*` settings)."""

    timeout_s: float = 120.0
    connect_timeout_s: float = 10.0
    max_connections: int = 100
    keepalive_s: float = 4.0


class Member:
    """A backend in a pool, with what routing reads (`in_flight`, `weight`) and what checks write."""

    def __init__(
        self,
        spec: MemberSpec,
        url: str,
        name: str,
        options: ClientOptions,
        policy: HealthPolicy,
        *,
        admitted: bool,
    ) -> None:
        self.spec = spec
        self.url = url
        self.name = name
        self.client = UpstreamBackend(
            url,
            spec.api_key,
            [],
            options.timeout_s,
            connect_retries=0,
            connect_timeout_s=options.connect_timeout_s,
            max_connections=options.max_connections,
            keepalive_s=options.keepalive_s,
        )
        self.health = MemberHealth(name, policy, admitted=admitted)
        self.stats = MemberStats()
        self.models: list[str] | None = None
        """What its `GET /models` listed last (None: nothing listed; it gets any model its pool serves)."""
        self.draining = False
        self._idle = asyncio.Event()
        self._idle.set()

    @property
    def in_flight(self) -> int:
        return self.stats.in_flight

    @property
    def weight(self) -> float:
        """Its configured weight (what consistent hashing and the canary split read)."""
        return self.spec.weight

    @property
    def canary(self) -> bool:
        return self.spec.canary

    @property
    def share(self) -> float:
        """Its weight now: less while it warms up after coming back (what the load bounds read)."""
        return self.spec.weight * self.health.warmth()

    def serves(self, model: str) -> bool:
        return self.models is None or model in self.models

    def request_for(self, request: GenerationRequest) -> GenerationRequest:
        """The request as this member takes it: the model renamed to what the server knows, if it differs."""
        model = self.spec.model
        if model is None or model == request.model:
            return request
        return dataclasses.replace(request, model=model, body={**request.body, "model": model})

    def began(self) -> None:
        self.stats.in_flight += 1
        self._idle.clear()

    def ended(self) -> None:
        self.stats.in_flight -= 1
        if self.stats.in_flight == 0:
            self._idle.set()

    async def drain_and_close(self) -> None:
        """Out of every pool already: wait for what it is answering, then close its connections."""
        self.draining = True
        await self._idle.wait()
        await self.client.close()

    def describe(self) -> dict[str, Any]:
        described: dict[str, Any] = {
            "name": self.name,
            "url": self.url,
            "weight": self.spec.weight,
            **self.health.describe(),
            "in_flight": self.in_flight,
            **self.stats.describe(),
        }
        if self.spec.canary:
            described["canary"] = True
        if self.spec.shadow:
            described["shadow"] = True
        if self.spec.model is not None:
            described["model"] = self.spec.model
        if self.models is not None:
            described["models"] = list(self.models)
        return described


def member_name(url: str, host: str | None = None) -> str:
    """`host:port` of its URL (a discovered one: `name/address:port`): short, stable, a bounded label."""
    parts = urlsplit(url)
    port = parts.port or (443 if parts.scheme == "https" else 80)
    address = parts.hostname or ""
    if ":" in address:  # IPv6
        address = f"[{address}]"
    return f"{host}/{address}:{port}" if host else f"{address}:{port}"
