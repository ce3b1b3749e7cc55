"""Circuit breakers: stop calling a dependency that keeps failing, probe it again after a cool-down.

    closed  --failure rate over the window-->  open  --cool-down elapsed-->  half-open (one probe at a time)
    half-open --probe succeeds--> closed;  half-open --probe fails--> open (a new cool-down)

The rule is resilience4j's (and Envoy outlier detection's success-rate check): the breaker opens when, over
the last `window_s` seconds, at least `failure_threshold` calls failed *and* they were at least
`failure_rate` of the calls. A count of consecutive failures (the old rule) opened on a burst: 32 clients
missing at once through an upstream whose accept queue overflowed for a moment made five failures in a
row among thousands of answers, and the breaker turned a 1% wobble into a 100% outage. A rate over a
window needs the failures to be sustained and to outweigh the successes; a dependency that is down fails
every call, so it still opens after `failure_threshold` of them. LiteLLM's cooldowns follow the same idea
(a deployment cools down past 50% failures in the current minute, with a minimum number of requests).

A call is one caller-level request: a caller that retries (the upstream backend retries refused and reset
connections) records the outcome once, after its retries, so a request whose retry succeeded is a
success. Outcomes recorded while the breaker is open (calls let through before it opened) are ignored:
the cool-down runs from the opening, and only the half-open probe decides what comes next.

The breaker only counts; callers decide what a failure is (an upstream 5xx or a lost connection, a Redis
error) and what shedding means (a fast 503, or a cache that fails open). Transitions are logged and
exported as a gauge (`kvgate_breaker_state`: 0 closed, 1 half-open, 2 open).
"""

from __future__ import annotations

import collections
import enum
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from gateway.api.errors import ServiceUnavailable

logger = logging.getLogger("kvgate.breaker")

WINDOW_SLICES = 10  # the window moves a tenth of its span at a time


class BreakerState(enum.Enum):
    CLOSED = "closed"
    HALF_OPEN = "half_open"
    OPEN = "open"

    @property
    def gauge_value(self) -> int:
        return {BreakerState.CLOSED: 0, BreakerState.HALF_OPEN: 1, BreakerState.OPEN: 2}[self]


OnChange = Callable[[str, BreakerState], None]


@dataclass(slots=True)
class _Slice:
    index: int  # which `width`-long stretch of the clock it counts
    calls: int = 0
    failures: int = 0


class SlidingWindow:
    """Calls and failures over the last `span_s` seconds, kept in slices that drop off whole (memory does
    not grow with traffic)."""

    def __init__(self, span_s: float) -> None:
        self.span_s = span_s
        self._width = span_s / WINDOW_SLICES
        self._slices: collections.deque[_Slice] = collections.deque()
        self.calls = 0
        self.failures = 0

    def add(self, now: float, *, failed: bool) -> None:
        index = int(now // self._width)
        self.expire(now)
        if not self._slices or self._slices[-1].index != index:
            self._slices.append(_Slice(index))
        last = self._slices[-1]
        last.calls += 1
        self.calls += 1
        if failed:
            last.failures += 1
            self.failures += 1

    def expire(self, now: float) -> None:
        oldest = int(now // self._width) - WINDOW_SLICES + 1
        while self._slices and self._slices[0].index < oldest:
            gone = self._slices.popleft()
            self.calls -= gone.calls
            self.failures -= gone.failures

    def clear(self) -> None:
        self._slices.clear()
        self.calls = self.failures = 0


class CircuitBreaker:
    """Failure-rate breaker over a sliding window, with a cool-down and a single half-open probe."""

    def __init__(
        self,
        name: str,
        *,
        failure_threshold: int,
        cooldown_s: float,
        failure_rate: float = 0.5,
        window_s: float = 10.0,
        on_change: OnChange | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if failure_threshold < 1 or cooldown_s <= 0 or window_s <= 0 or not 0 < failure_rate <= 1:
            raise ValueError(
                "failure_threshold must be >= 1, cooldown_s and window_s > 0, failure_rate in (0, 1]"
            )
        self.name = name
        self.failure_threshold = failure_threshold
        self.failure_rate = failure_rate
        self.cooldown_s = cooldown_s
        self._window = SlidingWindow(window_s)
        self._on_change = on_change
        self._clock = clock
        self._state = BreakerState.CLOSED
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
        if self._state is BreakerState.OPEN:
            return  # let through before it opened: the probe decides
        self._probe_started_at = None
        if self._state is BreakerState.HALF_OPEN:
            self._window.clear()  # a fresh window: the failures that opened it are history
            self._transition(BreakerState.CLOSED)
            return
        self._window.add(self._clock(), failed=False)

    def record_failure(self) -> None:
        if self._state is BreakerState.OPEN:
            return  # let through before it opened: the cool-down runs from the opening
        self._probe_started_at = None
        if self._state is BreakerState.HALF_OPEN:
            self._open()
            return
        self._window.add(self._clock(), failed=True)
        if self._sustained():
            self._open()

    def describe(self) -> dict[str, object]:
        """What `/readyz` shows for this breaker: its state and the window that decides it."""
        self._window.expire(self._clock())
        described: dict[str, object] = {
            "state": self._state.value,
            "window_s": self._window.span_s,
            "calls": self._window.calls,
            "failures": self._window.failures,
        }
        if self._state is BreakerState.OPEN:
            described["retry_after_s"] = round(self.retry_after_s(), 3)
        return described

    def _sustained(self) -> bool:
        """Enough failures, and a large enough share of the calls, in the window."""
        failures = self._window.failures
        return failures >= self.failure_threshold and failures >= self.failure_rate * self._window.calls

    def _open(self) -> None:
        self._opened_at = self._clock()
        self._transition(BreakerState.OPEN)
        self._window.clear()

    def _transition(self, state: BreakerState) -> None:
        previous, self._state = self._state, state
        log = logger.warning if state is BreakerState.OPEN else logger.info
        log(
            "circuit breaker %s: %s -> %s",
            self.name,
            previous.value,
            state.value,
            extra={
                "breaker": self.name,
                "breaker_state": state.value,
                "calls": self._window.calls,
                "failures": self._window.failures,
            },
        )
        if self._on_change is not None:
            self._on_change(self.name, state)
