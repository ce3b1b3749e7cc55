"""Is a member fit to serve: passive ejection, active checks, its breaker, and slow start on the way back.

    healthy --N failed requests in a row, or its breaker opens (failure rate)--> ejected (passive)
    healthy --M failed active checks in a row-----------------------------------> ejected (active)
    ejected --a passing check (and, if its breaker opened, the breaker's cool-down over)--> slow start
    slow start --`slow_start_s`--> healthy          (its share grows linearly from a tenth to all of it)

A failed request is one the member failed, not the client: a connection refused or reset, a timeout, a
5xx. Two passive rules, as Envoy's outlier detection has: N consecutive failures eject a member that is
down at once (every request to it fails, so N arrive within milliseconds under load), and the member's own
failure-rate breaker (gateway/traffic/breaker.py, the one the single upstream has) ejects one that fails
often without failing every time. The breaker's half-open probe is the active check: a member it ejected
comes back only after a check passes once the cool-down is over, never on a live request.

Slow start (Envoy's slow_start_window): a server that just came back has a cold KV cache and warming
kernels, and prefix routing would at once hand it every prompt it owns. Its weight in the load bounds
grows from `SLOW_START_FLOOR` to 1 over `slow_start_s`. A member that joins a running pool (discovery, a
reload) starts ejected as `new` and joins the same way after its first passing check; the members a fleet
starts with join at once after theirs.

This module knows states and checks; it never routes and never sends a completion.
"""

from __future__ import annotations

import enum
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import httpx

from gateway.traffic.breaker import BreakerState, CircuitBreaker

SLOW_START_FLOOR = 0.1


class Ejection(enum.Enum):
    """Why a member does not serve."""

    FAILURES = "failures"  # requests failed (in a row, or at the breaker's rate)
    CHECKS = "checks"  # active checks failed in a row
    NEW = "new"  # joined a running pool, not checked yet


@dataclass(frozen=True, slots=True)
class HealthPolicy:
    eject_failures: int = 5
    unhealthy_checks: int = 2
    slow_start_s: float = 10.0
    breaker_failures: int = 5
    breaker_failure_rate: float = 0.5
    breaker_window_s: float = 10.0
    breaker_cooldown_s: float = 2.0


@dataclass(frozen=True, slots=True)
class Probe:
    """What one active check saw."""

    alive: bool
    models: list[str] | None = None
    """The ids its `GET /models` listed (None: it did not list any)."""
    reason: str = ""


class MemberHealth:
    """One member's state, from its requests (passive) and its checks (active)."""

    def __init__(
        self,
        name: str,
        policy: HealthPolicy,
        *,
        admitted: bool = True,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.policy = policy
        self._clock = clock
        self.breaker = CircuitBreaker(
            f"backend {name}",
            failure_threshold=policy.breaker_failures,
            cooldown_s=policy.breaker_cooldown_s,
            failure_rate=policy.breaker_failure_rate,
            window_s=policy.breaker_window_s,
            clock=clock,
        )
        self.ejection: Ejection | None = None if admitted else Ejection.NEW
        self.ejections = 0
        self.failures_in_a_row = 0
        self.failed_checks = 0
        self.last_check: str = "not checked yet"
        self._admitted_at: float | None = None  # the slow start runs from here
        self._since = clock()  # when it last left or came back

    @property
    def routable(self) -> bool:
        return self.ejection is None

    @property
    def state(self) -> str:
        """`healthy`, `slow_start` or `ejected` (what `/healthz` shows)."""
        if self.ejection is not None:
            return "ejected"
        return "slow_start" if self.warmth() < 1.0 else "healthy"

    def warmth(self) -> float:
        """The share of its weight a member takes now: 1 once warm, from `SLOW_START_FLOOR` just after it
        came back."""
        if self._admitted_at is None or self.policy.slow_start_s <= 0:
            return 1.0
        ramp = (self._clock() - self._admitted_at) / self.policy.slow_start_s
        if ramp >= 1.0:
            self._admitted_at = None
            return 1.0
        return SLOW_START_FLOOR + (1.0 - SLOW_START_FLOOR) * max(0.0, ramp)

    # --- passive: what requests saw -----------------------------------------------------------------------

    def record_success(self) -> None:
        self.failures_in_a_row = 0
        self.breaker.record_success()

    def record_failure(self) -> None:
        self.failures_in_a_row += 1
        self.breaker.record_failure()
        if self.failures_in_a_row >= self.policy.eject_failures or self.breaker.state is BreakerState.OPEN:
            self._eject(Ejection.FAILURES)

    # --- active: what checks saw --------------------------------------------------------------------------

    def check_passed(self) -> None:
        self.failed_checks = 0
        self.last_check = "passed"
        if self.ejection is None:
            return
        if self.breaker.state is not BreakerState.CLOSED:
            if not self.breaker.allow():  # its cool-down is not over: stay out a little longer
                return
            self.breaker.record_success()  # the check was the half-open probe
        self._admit(slow=True)

    def check_failed(self, reason: str) -> None:
        self.failed_checks += 1
        self.last_check = f"failed: {reason}"
        if self.failed_checks >= self.policy.unhealthy_checks:
            self._eject(Ejection.CHECKS)

    def admit_now(self) -> None:
        """A member the fleet started with: it serves from its first passing check, without slow start."""
        self.failed_checks = 0
        self.last_check = "passed"
        if self.ejection is Ejection.NEW:
            self._admit(slow=False)

    def describe(self) -> dict[str, Any]:
        described: dict[str, Any] = {
            "state": self.state,
            "ejections": self.ejections,
            "failures_in_a_row": self.failures_in_a_row,
            "breaker": self.breaker.state.value,
            "last_check": self.last_check,
            "for_s": round(self._clock() - self._since, 3),
        }
        if self.ejection is not None:
            described["ejected_for"] = self.ejection.value
        elif self.state == "slow_start":
            described["warmth"] = round(self.warmth(), 3)
        return described

    def _eject(self, why: Ejection) -> None:
        if self.ejection is None:
            self.ejections += 1
            self._since = self._clock()
        self.ejection = why
        self._admitted_at = None

    def _admit(self, *, slow: bool) -> None:
        self._since = self._clock()
        self.ejection = None
        self.failures_in_a_row = 0
        self._admitted_at = self._clock() if slow else None


async def probe(client: httpx.AsyncClient, base_url: str, api_key: str | None, timeout_s: float) -> Probe:
    """`GET {base_url}/models`: any answer under 500 means the server is up (one that cannot list its
    models answers 404 and is still alive); a list, when it gives one, says what it serves."""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        response = await client.get(f"{base_url.rstrip('/')}/models", headers=headers, timeout=timeout_s)
    except httpx.TimeoutException:
        return Probe(False, reason="timed out")
    except httpx.HTTPError as error:
        return Probe(False, reason=type(error).__name__)
    if response.status_code >= 500:
        return Probe(False, reason=f"HTTP {response.status_code}")
    if response.status_code != 200:
        return Probe(True)
    try:
        data = response.json().get("data")
    except (ValueError, AttributeError):
        return Probe(True)
    if not isinstance(data, list):
        return Probe(True)
    names = [str(card["id"]) for card in data if isinstance(card, dict) and card.get("id")]
    return Probe(True, names or None)
