"""Canaries: a sticky split of a pool between its stable and canary members, and shadow traffic.

**The split.** A pool's members are on one of two sides: stable, or canary (`canary: true`). A side's
weight is the sum of its members' weights, so 99:1 sends 1% of the traffic to the canary side. The side is
chosen by hashing who asks, not per request: the tenant, and the request's `user` when it names one, fall
on a point in [0, 1); stable owns [0, stable share) and the canary the rest. The same tenant is always on
the same side, so one conversation never alternates between two model versions, and raising the canary's
weight (1% -> 10% -> 50%) only moves the boundary down: every tenant already on the canary stays there.
Within a side the pool's routing policy chooses among the side's members by their weights. A side with no
routable member hands its tenants to the other side rather than failing them.

**Shadow traffic.** A `shadow: true` member never serves. Once a request's answer is complete, a copy of
it (as a JSON request, whatever the client asked for) goes to each shadow member in the background; its
answer is compared with the one served, word by word (the same measure as the cache's shadow mode,
gateway/observability/shadow.py), and counted per shadow member. At most `SHADOW_IN_FLIGHT` copies are in
flight per member: past that a copy is skipped, so a slow candidate never piles up work in the gateway.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import logging
from collections.abc import Sequence
from typing import Any, Protocol, TypeVar

from gateway.api.chunks import accumulate_chat, accumulate_text, answer_text
from gateway.backends.protocol import Chunk, GenerationEvent, GenerationRequest, TextDelta, Whole
from gateway.fleet.member import Member
from gateway.observability.shadow import ShadowStats

logger = logging.getLogger("kvgate.fleet")

SHADOW_IN_FLIGHT = 4


class Sided(Protocol):
    @property
    def weight(self) -> float: ...

    @property
    def canary(self) -> bool: ...


S = TypeVar("S", bound=Sided)


def sticky_point(pool: str, tenant: str, user: str | None) -> float:
    """Where a tenant (and user) falls in [0, 1) for `pool`: the same every time, on every replica."""
    key = f"{pool}\x00{tenant}\x00{user or ''}".encode()
    return int.from_bytes(hashlib.blake2b(key, digest_size=8).digest(), "big") / 2**64


def on_canary_side(point: float, members: Sequence[Sided]) -> bool:
    """Does `point` fall on the canary side, given the configured weights of both sides?"""
    canary = sum(member.weight for member in members if member.canary)
    stable = sum(member.weight for member in members if not member.canary)
    if canary <= 0 or stable <= 0:
        return canary > 0
    return point >= stable / (stable + canary)


def split(point: float, members: Sequence[S], routable: Sequence[S]) -> tuple[list[S], list[S]]:
    """(the routable members of the point's side, those of the other side). Sides are weighed on every
    configured member, ejected ones included, so that health never moves a tenant's side."""
    canary = on_canary_side(point, members)
    own = [member for member in routable if member.canary == canary]
    other = [member for member in routable if member.canary != canary]
    return (own, other) if own else (other, [])


def request_user(request: GenerationRequest) -> str | None:
    """The end user a request names: OpenAI's `user`, or Anthropic's `metadata.user_id`."""
    user = request.body.get("user")
    if user is None:
        user = (request.body.get("metadata") or {}).get("user_id")
    return None if user is None else str(user)


class ShadowMirror:
    """Copies finished requests to shadow members and compares their answers with the served ones."""

    def __init__(self) -> None:
        self._tasks: set[asyncio.Task[None]] = set()

    def mirror(
        self, shadows: Sequence[Member], request: GenerationRequest, served: list[GenerationEvent]
    ) -> None:
        """Send `request` to each shadow member in the background (a no-op with none)."""
        if not shadows:
            return
        text = served_text(served)
        for shadow in shadows:
            if shadow.in_flight >= SHADOW_IN_FLIGHT or not shadow.health.routable:
                continue
            task = asyncio.get_running_loop().create_task(self._compare(shadow, request, text))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _compare(self, shadow: Member, request: GenerationRequest, served: str) -> None:
        copy = dataclasses.replace(
            shadow.request_for(request),
            request_id=request.request_id + "-shadow",
            stream=False,
            body={**shadow.request_for(request).body, "stream": False},
        )
        stats = shadow.stats.shadow or ShadowStats()
        shadow.stats.shadow = stats
        shadow.began()
        events: list[GenerationEvent] = []
        try:
            async for event in shadow.client.generate(copy):
                events.append(event)
        except Exception as error:  # a candidate's failure is counted, never anyone's problem
            shadow.stats.shadow_errors += 1
            logger.info("shadow request to %s failed: %s", shadow.name, error)
            return
        finally:
            shadow.ended()
        stats.record_candidate()
        stats.record_comparison(served, served_text(events), request.request_id, shadow.name)


def served_text(events: Sequence[GenerationEvent]) -> str:
    """The answer's text, whatever form the backend sent it in."""
    chunks: list[dict[str, Any]] = []
    text: list[str] = []
    for event in events:
        if isinstance(event, Whole):
            return answer_text(event.payload)
        if isinstance(event, Chunk):
            chunks.append(event.payload)
        elif isinstance(event, TextDelta):
            text.append(event.text)
    if chunks:
        first = chunks[0].get("object")
        return answer_text(accumulate_text(chunks) if first == "text_completion" else accumulate_chat(chunks))
    return "".join(text)
