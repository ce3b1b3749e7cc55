"""Reverse-proxy mode: misses go to an upstream OpenAI-compatible server over httpx.

The client's body is forwarded as it came, unknown fields included: a JSON request gets the upstream's JSON
object (`Whole`), a stream the upstream's chunks (`Chunk`) as they arrive, with usage requested so the
answer can be accounted and stored once complete. Nothing is rebuilt from text: tool calls, refusals,
reasoning, logprobs and every other field reach the client and the cache as sent. Upstream errors keep
their status and, where the upstream sent OpenAI's error shape, its message and type.

Connections are kept alive in one bounded pool (`max_connections`, all of them kept between requests, each
for `keepalive_s`, under the idle timeout of common upstreams so kvgate does not reuse one the upstream is
closing). An attempt refused or reset before the answer began is retried with jittered back-off until the
request's connect deadline (upstream_retry.py says which are safe to send again); once an answer began,
and above all once a stream started, nothing is retried. A circuit breaker (when given) counts each
request once, after its retries, as failed (a lost connection, a timeout, a 5xx) or not; while it is open,
calls fail fast with a 503, and its half-open probe is one attempt. The request's W3C `traceparent` is
forwarded.
"""

from __future__ import annotations

import asyncio
import contextlib
import http.cookiejar
import json
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from typing import Any

import httpx

from gateway.api.errors import UpstreamFailed
from gateway.backends.aiohttp_transport import AiohttpTransport
from gateway.backends.protocol import Chunk, Finished, GenerationEvent, GenerationRequest, Whole
from gateway.backends.upstream_models import UpstreamModels
from gateway.backends.upstream_retry import Attempts, RetryPolicy
from gateway.observability.tracecontext import TRACEPARENT, current_trace
from gateway.traffic.breaker import BreakerState, CircuitBreaker


class UpstreamBackend:
    """An OpenAI-compatible server reached over HTTP."""

    name = "upstream"
    passes_through = True

    def __init__(
        self,
        base_url: str,
        api_key: str | None,
        models: list[str],
        timeout_s: float = 120.0,
        transport: httpx.AsyncBaseTransport | None = None,
        *,
        breaker: CircuitBreaker | None = None,
        connect_retries: int | None = None,
        connect_timeout_s: float = 10.0,
        models_refresh_s: float = 60.0,
        max_connections: int = 100,
        keepalive_s: float = 4.0,
    ) -> None:
        """`connect_timeout_s`: how long one request may keep trying to get through (never past
        `timeout_s`); `connect_retries`: an optional cap on its retries (None: as many as fit)."""
        self.api_key = api_key
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._timeout_s = timeout_s
        limits = httpx.Limits(
            max_connections=max_connections,
            max_keepalive_connections=max_connections,
            keepalive_expiry=keepalive_s,
        )
        self._client = httpx.AsyncClient(
            base_url=base_url.rstrip("/") + "/",
            headers=headers,
            timeout=httpx.Timeout(timeout_s, connect=connect_timeout_s),
            transport=transport or AiohttpTransport(limits),  # aiohttp's pool under httpx's API
        )
        # Nor does httpx's client keep the upstream's cookies: they would be sent for every tenant after.
        self._client.cookies.jar.set_policy(http.cookiejar.DefaultCookiePolicy(allowed_domains=[]))
        self.models = UpstreamModels(models, models_refresh_s)
        self._breaker = breaker
        self._retry = RetryPolicy(min(connect_timeout_s, timeout_s), connect_retries)

    async def generate(self, request: GenerationRequest) -> AsyncIterator[GenerationEvent]:
        path = request.path or ("chat/completions" if request.messages is not None else "completions")
        body = dict(request.body)
        if request.stream and request.path is not None:  # Responses and Messages carry usage in their events
            body["stream"] = True
        elif request.stream:
            body["stream"] = True
            body["stream_options"] = {**(body.get("stream_options") or {}), "include_usage": True}
        finish_reason: str | None = None
        usage: dict[str, Any] = {}
        if self._breaker is not None:
            self._breaker.check()
        headers = request.headers
        if request.path == "messages" and self.api_key:  # Anthropic's API names the key its own way
            headers = headers | {"x-api-key": self.api_key}
        with self._failures():
            response = await self._open(path, body, headers, replayable=not request.stream)
            try:
                if response.status_code >= 400:
                    await response.aread()
                    self._count(failed=response.status_code >= 500)
                    raise _upstream_error(response)
                if request.stream:
                    ended = _Ended()
                    async for data in _sse_data(response, ended):
                        chunk = json.loads(data)
                        if "error" in chunk:
                            raise _error_from_body(chunk, 502)
                        usage = _stream_usage(chunk, usage)
                        finish_reason = _finish_reason(chunk) or finish_reason
                        yield Chunk(chunk)
                    if request.path is None and not ended.done and finish_reason is None:
                        # The connection closed mid-answer (a body delimited by the close, cut): an error,
                        # never a truncated "success".
                        raise UpstreamFailed(
                            "The upstream server's stream ended before its answer did.", status_code=502
                        )
                else:
                    whole = json.loads(await response.aread())
                    if not isinstance(whole, dict):
                        raise UpstreamFailed("The upstream server sent no JSON object.", status_code=502)
                    usage = whole.get("usage") or {}
                    finish_reason = _finish_reason(whole)
                    yield Whole(whole)
            finally:
                await response.aclose()
        self._count(failed=False)
        details = usage.get("prompt_tokens_details") or {}
        yield Finished(
            finish_reason=finish_reason or "stop",
            prompt_tokens=int(usage.get("prompt_tokens") or usage.get("input_tokens") or 0),
            completion_tokens=int(usage.get("completion_tokens") or usage.get("output_tokens") or 0),
            cached_tokens=int(details.get("cached_tokens") or 0),
        )

    async def embed(self, body: dict[str, Any]) -> dict[str, Any]:
        """The upstream's answer to an embeddings request, as sent."""
        if self._breaker is not None:
            self._breaker.check()
        with self._failures():
            response = await self._open("embeddings", body)
            try:
                await response.aread()
                if response.status_code >= 400:
                    self._count(failed=response.status_code >= 500)
                    raise _upstream_error(response)
                whole = response.json()
            finally:
                await response.aclose()
        if not isinstance(whole, dict) or not isinstance(whole.get("data"), list):
            self._count(failed=True)
            raise UpstreamFailed("The upstream server sent no embeddings.", status_code=502)
        self._count(failed=False)
        return whole

    async def forward(
        self, method: str, path: str, query: str, headers: dict[str, str], body: AsyncIterator[bytes]
    ) -> httpx.Response:
        """Send a request on unchanged (its body streamed); the answer's body is left to stream. Transport
        failures answer 502/504 as a completion's would; the caller closes the response."""
        trace = current_trace.get()
        if trace is not None:
            headers = headers | {TRACEPARENT: trace.traceparent}
        url = httpx.URL(path, query=query.encode())
        watched = _WatchedBody(body)
        attempts = self._attempts(replayable=False)
        with self._failures():
            while True:
                request = self._client.build_request(
                    method, url, headers=headers, content=watched, timeout=self._attempt_timeout(attempts)
                )
                try:
                    return await self._client.send(request, stream=True)
                except httpx.TransportError as error:  # retried only while no byte of the body was read
                    wait = attempts.backoff_s(error, body_untouched=not watched.started)
                    if wait is None:
                        raise
                    await asyncio.sleep(wait)
        raise AssertionError("unreachable")

    async def abort(self, request_id: str) -> None:
        # Closing the stream (done by the caller leaving the `async with`) is how HTTP aborts.
        return None

    async def start(self) -> None:
        """Learn the upstream's models when no allow-list was given (and keep them fresh)."""
        await self.models.start(self._client)

    def served_models(self) -> list[str]:
        return self.models.names()

    def serves_model(self, model: str) -> bool:
        return self.models.serves(model)

    @property
    def models_mode(self) -> str:
        return self.models.mode.value

    def max_context_tokens(self) -> int | None:
        return None

    async def close(self) -> None:
        await self.models.stop()
        await self._client.aclose()

    async def _open(
        self, path: str, body: dict[str, Any], extra: dict[str, str] | None = None, *, replayable: bool = True
    ) -> httpx.Response:
        """Send the request until its answer begins: attempts that failed before it began are retried
        while that is safe (`replayable`: a JSON request, not a stream) and the connect deadline allows."""
        trace = current_trace.get()
        headers = {TRACEPARENT: trace.traceparent} if trace is not None else {}
        headers |= extra or {}
        attempts = self._attempts(replayable=replayable)
        while True:
            # Built afresh for each attempt: its connect timeout is its own (and, with pools, its URL could
            # be another member's).
            request = self._client.build_request(
                "POST", path, json=body, headers=headers, timeout=self._attempt_timeout(attempts)
            )
            try:
                return await self._client.send(request, stream=True)
            except httpx.TransportError as error:
                wait = attempts.backoff_s(error)
                if wait is None:
                    raise
                await asyncio.sleep(wait)

    def _attempts(self, *, replayable: bool) -> Attempts:
        """A half-open breaker's probe asks once: one refusal is the answer, and a probe that retried until
        the deadline would keep the breaker half-open (and /readyz vague) for that long."""
        probing = self._breaker is not None and self._breaker.state is not BreakerState.CLOSED
        return self._retry.start(replayable=replayable, retry=not probing)

    def _attempt_timeout(self, attempts: Attempts) -> httpx.Timeout:
        return httpx.Timeout(self._timeout_s, connect=attempts.connect_timeout_s())

    @contextlib.contextmanager
    def _failures(self) -> Iterator[None]:
        """httpx's failures, and a body that is not JSON, as kvgate's errors, each counted by the breaker."""
        try:
            yield
        except httpx.TimeoutException as error:
            self._count(failed=True)
            raise UpstreamFailed(
                "The upstream server timed out.", status_code=504, code="upstream_timeout"
            ) from error
        except httpx.TransportError as error:
            self._count(failed=True)
            raise UpstreamFailed(
                "The upstream server could not be reached.", status_code=502, code="upstream_unreachable"
            ) from error
        except ValueError as error:
            self._count(failed=True)
            raise UpstreamFailed("The upstream server sent a malformed answer.", status_code=502) from error

    def _count(self, *, failed: bool) -> None:
        if self._breaker is None:
            return
        if failed:
            self._breaker.record_failure()
        else:
            self._breaker.record_success()


class _WatchedBody:
    """A streamed request body that remembers whether the transport began reading it."""

    def __init__(self, body: AsyncIterator[bytes]) -> None:
        self._body = body
        self.started = False

    async def __aiter__(self) -> AsyncIterator[bytes]:
        self.started = True
        async for part in self._body:
            yield part


@dataclass(slots=True)
class _Ended:
    """Whether a chat or completions stream ended with its `[DONE]`."""

    done: bool = False


async def _sse_data(response: httpx.Response, ended: _Ended) -> AsyncIterator[str]:
    async for line in response.aiter_lines():
        if not line.startswith("data:"):
            continue
        data = line[len("data:") :].strip()
        if data == "[DONE]":
            ended.done = True
            return
        if data:
            yield data


def _stream_usage(chunk: dict[str, Any], usage: dict[str, Any]) -> dict[str, Any]:
    """The usage known so far: a chat chunk's, a Responses `response.completed`'s, or Anthropic's (input
    tokens in `message_start`, output tokens in `message_delta`)."""
    found = (
        chunk.get("usage")
        or (chunk.get("response") or {}).get("usage")
        or (chunk.get("message") or {}).get("usage")
    )
    return {**usage, **found} if isinstance(found, dict) else usage


def _finish_reason(payload: dict[str, Any]) -> str | None:
    """The first choice's finish reason, as sent (None until a choice has one)."""
    for choice in payload.get("choices") or []:
        if isinstance(choice, dict) and choice.get("finish_reason"):
            return str(choice["finish_reason"])
    return None


def _upstream_error(response: httpx.Response) -> UpstreamFailed:
    try:
        body = response.json()
    except ValueError:
        body = None
    if isinstance(body, dict) and isinstance(body.get("error"), dict):
        return _error_from_body(body, response.status_code)
    return UpstreamFailed(
        f"The upstream server answered {response.status_code}.", status_code=response.status_code
    )


def _error_from_body(body: dict[str, Any], status_code: int) -> UpstreamFailed:
    error = body.get("error") or {}
    return UpstreamFailed(
        str(error.get("message") or "The upstream server returned an error."),
        status_code=status_code,
        error_type=error.get("type"),
        param=error.get("param"),
        code=error.get("code"),
    )
