"""Which failed upstream attempts may be sent again, and how long to wait first.

An attempt is retried only where the upstream cannot have acted on it, or where acting twice costs
nothing the client can see:

- `NOT_SENT`: the connection was never made (refused, reset or timed out while connecting:
  `httpx.ConnectError`, `httpx.ConnectTimeout`). Nothing went out, so any request may go again, a stream
  or a passthrough whose body was not read yet included.
- `NO_ANSWER`: the connection broke before the first byte of the answer (`httpx.ReadError`,
  `httpx.WriteError`, `httpx.RemoteProtocolError` raised while waiting for the status line). This is how a
  server drops a connection it never accepted (a full listen backlog) or closes a keep-alive connection
  kvgate was just reusing. The upstream may have begun the work, so only a JSON (non-streaming) request,
  whose whole body kvgate holds, is sent again: the client has received nothing, a second generation costs
  tokens, not correctness.

Anything else (a timeout waiting for the answer, an error once the answer began) fails the request at once.

Retries are bounded by time, not by a count: jittered exponential back-off ("full jitter": a uniform wait
up to a doubling ceiling, so clients that failed together do not come back together) until the request's
connect deadline. A fixed count (two, before) gave up within about 0.3 s, shorter than a burst of
refusals under load lasts; a deadline absorbs the burst and still fails a dead upstream in bounded time,
so the breaker sees it. The next attempt is built afresh, so it could go to another pool member (issue 47).
"""

from __future__ import annotations

import enum
import random
import time
from dataclasses import dataclass, field

import httpx

BACKOFF_BASE_S = 0.02  # the first wait is up to this
BACKOFF_CAP_S = 1.0  # no wait is longer than this
# The first attempt's connect timeout, doubled for each retry: just past the kernel's first SYN
# retransmission (1 s), so an attempt whose SYN and its retransmission a full accept queue dropped starts
# over with a fresh SYN instead of waiting 2 s, then 4 s, for the kernel's next ones (with one attempt given
# the whole deadline, a few misses in a thousand timed out so through tests/gateway/backlog_upstream.py);
# doubling still lets a slow handshake complete.
FIRST_CONNECT_S = 1.5
# A refused connection (nothing listens on the port: a restart's gap, or a server that is down) is tried
# again for this long at most, not for the whole deadline: a full accept queue drops connections rather
# than refusing them (Linux), so refusals mean down, and a dead upstream answers 502 within a second
# instead of holding every miss for the deadline before the breaker sees a failure.
REFUSED_BUDGET_S = 1.0


class Unsent(enum.Enum):
    """How much of a failed attempt the upstream may have seen."""

    NOT_SENT = "not_sent"
    NO_ANSWER = "no_answer"


def unsent(error: httpx.TransportError) -> Unsent | None:
    """What a transport error raised before the answer's status line says was sent; None: not retryable."""
    if isinstance(error, httpx.ConnectError | httpx.ConnectTimeout):
        return Unsent.NOT_SENT
    if isinstance(error, httpx.ReadError | httpx.WriteError | httpx.RemoteProtocolError):
        return Unsent.NO_ANSWER
    return None


def refused(error: BaseException) -> bool:
    """Was the connection refused (nothing listening), by its cause or, failing that, its message?"""
    seen: BaseException | None = error
    while seen is not None:
        if isinstance(seen, ConnectionRefusedError):
            return True
        seen = seen.__cause__ or seen.__context__
    return "refused" in str(error).lower()


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """`budget_s`: how long one request may keep trying to get through; `max_retries`: an optional cap."""

    budget_s: float
    max_retries: int | None = None

    def start(self, *, replayable: bool, retry: bool = True) -> Attempts:
        """The attempts of one request. `replayable`: its whole body is in hand and it is not a stream;
        `retry=False`: one attempt only (a half-open breaker's probe asks once)."""
        return Attempts(self, replayable, retry)


@dataclass(slots=True)
class Attempts:
    """One request's attempts: the time left for them, and whether a failure gets another."""

    policy: RetryPolicy
    replayable: bool
    retry: bool
    started_at: float = field(default_factory=time.monotonic)
    retries: int = 0

    def left_s(self) -> float:
        return self.policy.budget_s - (time.monotonic() - self.started_at)

    def connect_timeout_s(self) -> float:
        """The next attempt's connect timeout: `FIRST_CONNECT_S` doubled per retry, within the deadline."""
        return max(0.001, min(self.left_s(), FIRST_CONNECT_S * 2.0**self.retries))

    def backoff_s(self, error: httpx.TransportError, *, body_untouched: bool = True) -> float | None:
        """How long to wait before the next attempt after `error`, or None to give up and raise it."""
        seen = unsent(error)
        if not self.retry or seen is None:
            return None
        if seen is Unsent.NOT_SENT and not body_untouched:
            return None
        if seen is Unsent.NO_ANSWER and not self.replayable:
            return None
        if self.policy.max_retries is not None and self.retries >= self.policy.max_retries:
            return None
        left = self.left_s()
        if refused(error):
            left = min(left, REFUSED_BUDGET_S - (time.monotonic() - self.started_at))
        wait = random.uniform(0, min(BACKOFF_CAP_S, BACKOFF_BASE_S * 2.0**self.retries))
        if wait >= left:
            return None
        self.retries += 1
        return wait
