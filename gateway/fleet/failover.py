"""What a failed attempt on one member means: may the request go to another, and is it the member's fault.

                     reached the member?   its fault?   JSON request goes on   stream goes on
    not sent         no                    yes          yes                    yes
    no answer        yes, nothing back     yes          yes                    no
    unavailable      yes, 502/503/504      yes          yes                    no
    rate limited     yes, 429              no           yes                    yes
    timed out        yes                   yes          no                     no
    server error     yes, 500 and others   yes          no                     no
    client error     yes, 4xx              no           no                     no

A request that never reached a member (refused, a connect timeout, an engine that is not running) can go
anywhere. A JSON request whose attempt failed before its answer began can go to another member too: the
client has received nothing and kvgate holds its whole body, so a second generation costs tokens, not
correctness (upstream_retry.py's rule, across members). A stream that was sent is never sent again, and a
started one is never replayed: it ends with an error event (each API's adapter renders it). A 429 served
nothing either way. A timeout is not retried elsewhere: the request has already used its time. A 500 is
the server's own answer to this request and would likely come back from the next one too.
"""

from __future__ import annotations

import enum

import httpx

from gateway.api.errors import KvgateError, UpstreamFailed
from gateway.backends.upstream_retry import Unsent, unsent


class Failure(enum.Enum):
    NOT_SENT = "not_sent"
    NO_ANSWER = "no_answer"
    UNAVAILABLE = "unavailable"
    RATE_LIMITED = "rate_limited"
    TIMED_OUT = "timed_out"
    SERVER_ERROR = "server_error"
    CLIENT_ERROR = "client_error"

    @property
    def members_fault(self) -> bool:
        """Does it count against the member's health?"""
        return self not in (Failure.RATE_LIMITED, Failure.CLIENT_ERROR)

    def may_fail_over(self, *, stream: bool) -> bool:
        """May the request go to another member after this, before its answer began?"""
        if self in (Failure.NOT_SENT, Failure.RATE_LIMITED):
            return True
        return not stream and self in (Failure.NO_ANSWER, Failure.UNAVAILABLE)


def classify(error: BaseException) -> Failure:
    """The failure an attempt's error was (an unexpected error is the server's)."""
    cause = error.__cause__
    if isinstance(cause, httpx.TransportError):
        seen = unsent(cause)
        if seen is Unsent.NOT_SENT:
            return Failure.NOT_SENT
        if isinstance(cause, httpx.TimeoutException):
            return Failure.TIMED_OUT
        return Failure.NO_ANSWER if seen is Unsent.NO_ANSWER else Failure.SERVER_ERROR
    if not isinstance(error, KvgateError):
        return Failure.SERVER_ERROR
    if error.code in ("engine_unavailable", "circuit_open"):
        return Failure.NOT_SENT
    status = error.status_code
    if status == 429:
        return Failure.RATE_LIMITED
    if isinstance(error, UpstreamFailed) and status in (502, 503, 504):
        return Failure.UNAVAILABLE
    return Failure.SERVER_ERROR if status >= 500 else Failure.CLIENT_ERROR


def transport_cause(error: BaseException) -> httpx.TransportError | None:
    """The httpx error behind a failed attempt, when there was one (what the back-off reads)."""
    cause = error.__cause__
    return cause if isinstance(cause, httpx.TransportError) else None
