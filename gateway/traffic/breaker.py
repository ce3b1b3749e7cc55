"""Circuit breakers: stop calling a dependency that keeps failing, probe it again after a cool-down.

    closed  --N consecutive failures-->  open  --cool-down elapsed-->  half-open (one probe at a time)
    half-open --probe succeeds--> closed;  half-open --probe fails--> open (a new cool-down)

The breaker only counts; callers decide what a failure is (an upstream 5xx or a lost connection, a Redis
error) and what shedding means (a fast 503, or a cache that fails open). Transitions are logged and
exported as a gauge (`kvgate_breaker_state`: 0 closed, 1 half-open, 2 open).
"""

from __future__ import annotations

import enum
import logging
import time
from collections.abc import Callable

from gateway.api.errors import ServiceUnavailable

logger = logging.getLogger("kvgate.breaker")


class BreakerState(enum.Enum):
    CLOSED = "closed"
    HALF_OPEN = "half_open"
    OPEN = "open"

    @property
    def gauge_value(self) -> int:
        return {BreakerState.CLOSED: 0, BreakerState.HALF_OPEN: 1, BreakerState.OPEN: 2}[self]


OnChange = Callable[[str, BreakerState], None]


class CircuitBreaker:
    """Consecutive-failure breaker with a cool-down and a single half-open probe."""

    def __init__(
        self,
        name: str,
        *,
        failure_threshold: int,
        cooldown_s: float,
        on_change: OnChange | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if failure_threshold < 1 or cooldown_s <= 0:
            raise ValueError("failure_threshold must be >= 1 and cooldown_s > 0")
        self.name = name
        self.failure_threshold = failure_threshold
        self.cooldown_s = cooldown_s
        self._on_change = on_change
        self._clock = clock
        self._state = BreakerState.CLOSED
        self._failures = 0
        self._opened_at = 0.0
        self._probe_started_at: float | None = None

    @property
    def state(self) -> BreakerState:
        return self._state

    def allow(self) -> bool:
        """May a call go through now? In half-open, only one probe at a time (a stuck one expires)."""
        now = self._clock()
        if self._state is BreakerState.CLOSED:
            return True
        if self._state is BreakerState.OPEN:
            if now - self._opened_at < self.cooldown_s:
                return False
            self._transition(BreakerState.HALF_OPEN)
        if self._probe_started_at is not None and now - self._probe_started_at < self.cooldown_s:
            return False
        self._probe_started_at = now
        return True

    def check(self) -> None:
        """Raise a fast 503 (OpenAI's shape, with Retry-After) unless a call may go through."""
        if not self.allow():
            raise ServiceUnavailable(
                f"The {self.name} is failing; kvgate stopped calling it for a moment. Retry shortly.",
                code="circuit_open",
                headers={"Retry-After": str(max(1, round(self.retry_after_s())))},
            )

    def retry_after_s(self) -> float:
        if self._state is not BreakerState.OPEN:
            return 0.0
        return max(0.0, self.cooldown_s - (self._clock() - self._opened_at))

    def record_success(self) -> None:
        self._failures = 0
        self._probe_started_at = None
        if self._state is not BreakerState.CLOSED:
            self._transition(BreakerState.CLOSED)

    def record_failure(self) -> None:
        self._failures += 1
        self._probe_started_at = None
        if self._state is BreakerState.HALF_OPEN or self._failures >= self.failure_threshold:
            self._opened_at = self._clock()
            if self._state is not BreakerState.OPEN:
                self._transition(BreakerState.OPEN)

    def describe(self) -> dict[str, object]:
        """What `/readyz` shows for this breaker."""
        return {"state": self._state.value, "consecutive_failures": self._failures}

    def _transition(self, state: BreakerState) -> None:
        previous, self._state = self._state, state
        log = logger.warning if state is BreakerState.OPEN else logger.info
        log(
            "circuit breaker %s: %s -> %s",
            self.name,
            previous.value,
            state.value,
            extra={"breaker": self.name, "breaker_state": state.value, "failures": self._failures},
        )
        if self._on_change is not None:
            self._on_change(self.name, state)
