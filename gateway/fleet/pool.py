"""A pool: the members that serve one model, the order a request tries them in, and what routing learns.

    route(request)  ->  the members that may serve its model (not draining, not shadows)
                    ->  the routable ones (all of them if none is: Envoy's "panic" routing, so a pool whose
                        every member was ejected still tries them rather than refusing outright)
                    ->  the request's side of the canary split (canary.py)
                    ->  the pool's policy orders that side (routing.py); the other side follows, last
    sent(member)    ->  the policy counts it and learns where the prefix now is
    failed(member)  ->  it failed the request before answering: the prefix is not there
    finished(...)   ->  what the member said it reused: a prefix it no longer holds is forgotten there

A pool from `KVGATE_UPSTREAM_URL` serves whatever each member lists (`models` None); a member that lists
nothing is sent any model. A pool from the upstreams file serves its `model_name` on every member.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from gateway.backends.protocol import GenerationRequest
from gateway.fleet.canary import request_user, split, sticky_point
from gateway.fleet.config import PoolSpec
from gateway.fleet.member import Member
from gateway.fleet.prefix_keys import PrefixChain, prefix_chain
from gateway.fleet.routing import RoutingPolicy


@dataclass(frozen=True, slots=True)
class Route:
    """One request's way through a pool: the members to try, in order, and its prefix chain."""

    members: list[Member]
    chain: PrefixChain
    prefix_holders: tuple[str, ...] = ()
    """Who the table said holds its longest known prefix (a reuse of 0 from one of them is news)."""


class Pool:
    def __init__(self, spec: PoolSpec, policy: RoutingPolicy, members: Sequence[Member]) -> None:
        self.spec = spec
        self.policy = policy
        self.members: list[Member] = [member for member in members if not member.spec.shadow]
        self.shadows: list[Member] = [member for member in members if member.spec.shadow]

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def everyone(self) -> list[Member]:
        return self.members + self.shadows

    def serves(self, model: str) -> bool:
        if self.spec.models is not None:
            return model in self.spec.models
        return any(member.serves(model) for member in self.members)

    def listed_models(self) -> list[str]:
        """What `GET /v1/models` shows for this pool."""
        if self.spec.models is not None:
            return list(self.spec.models)
        names: dict[str, None] = {}
        for member in self.members:
            names.update(dict.fromkeys(member.models or ()))
        return list(names)

    def route(self, request: GenerationRequest) -> Route:
        listed = self.spec.models is None  # a URL-list pool: each member serves what it lists
        eligible = [
            member
            for member in self.members
            if not member.draining and (not listed or member.serves(request.model))
        ]
        routable = [member for member in eligible if member.health.routable] or eligible
        own, other = split(sticky_point(self.name, request.tenant, request_user(request)), eligible, routable)
        chain = prefix_chain(request) if self.policy.name == "prefix" else PrefixChain()
        holders = tuple(self.policy.holders(chain)) if chain.links else ()
        ordered = self.policy.order(own, chain) if own else []
        return Route(ordered + self.policy.order(other, chain) if other else ordered, chain, holders)

    def sent(self, member: Member, route: Route) -> None:
        self.policy.routed(member.name, route.chain)

    def failed(self, member: Member, route: Route) -> None:
        """`member` failed the request before answering: it holds none of its prompt."""
        self.policy.missed(member.name, route.chain)

    def finished(self, member: Member, route: Route, prompt_tokens: int, cached_tokens: int | None) -> None:
        """A reply's reuse: a member that reports reuse, and reused nothing of a prefix the table placed on
        it, has evicted that prefix."""
        if cached_tokens == 0 and prompt_tokens > 0 and member.name in route.prefix_holders:
            self.policy.missed(member.name, route.chain)
