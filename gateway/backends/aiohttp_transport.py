"""httpx's client over aiohttp's connection pool: the upstream's wire at a third of httpcore's CPU.

Measured on 2 cores (issue 46, `bench/gateway/bench_vs_litellm.py` and a client loop against the instant
upstream): a POST and its JSON answer took 1.4 ms of CPU through httpx's own transport (httpcore) at one
request at a time and 2.5 ms at 16 in flight, 0.7-0.8 ms through this transport, 0.25-0.35 ms through aiohttp
alone. The upstream client keeps httpx's API (requests, responses, timeouts, `MockTransport` in the tests);
only the connection pool and the HTTP/1.1 parser are aiohttp's.

Failures are raised as the httpx exception that says how much of the request the upstream may have seen,
which is what `upstream_retry.py` decides on, with aiohttp's error as the cause:

- no connection was made (refused, unreachable, DNS, a connect or pool-wait timeout): `httpx.ConnectError`
  or `httpx.ConnectTimeout`, nothing was sent;
- the connection broke before or while the answer came (a reset, a server that closed a kept-alive
  connection, a malformed or cut answer): `httpx.RemoteProtocolError` or `httpx.ReadError`;
- no byte for the read timeout: `httpx.ReadTimeout`.
"""

from __future__ import annotations

import contextlib
import ssl
import urllib.request
from collections.abc import AsyncIterator, Iterator
from typing import Any

import aiohttp
import httpx


class AiohttpTransport(httpx.AsyncBaseTransport):
    """An `httpx.AsyncBaseTransport` over one `aiohttp.ClientSession` (made on first use, in the running loop)."""

    def __init__(self, limits: httpx.Limits, *, verify: ssl.SSLContext | None = None) -> None:
        self._limits = limits
        # The certificates httpx verifies with (certifi, or SSL_CERT_FILE / SSL_CERT_DIR), not the system's.
        self._ssl = verify or httpx.create_ssl_context()
        self._session: aiohttp.ClientSession | None = None
        # HTTP(S)_PROXY and NO_PROXY, honoured as httpx's own transport honours them.
        self._proxies = urllib.request.getproxies_environment()
        self._proxy_of_host: dict[tuple[str, str], str | None] = {}

    def _client(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            connector = aiohttp.TCPConnector(
                limit=self._limits.max_connections or 0,
                keepalive_timeout=self._limits.keepalive_expiry or 0.0,
                ssl=self._ssl,
            )
            # The environment's proxy settings are read once (`_proxy_for`), not per request: aiohttp's
            # `trust_env` reads them and stats ~/.netrc on every request (0.5 ms of a miss, measured).
            # No cookie jar: a proxy keeps no upstream cookie (one tenant's `Set-Cookie`, a CDN's say, must
            # never ride on another tenant's request); httpx's jar is switched off too (`upstream.py`).
            self._session = aiohttp.ClientSession(
                connector=connector, auto_decompress=False, cookie_jar=aiohttp.DummyCookieJar()
            )
        return self._session

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        timeout: dict[str, float | None] = request.extensions.get("timeout", {})
        try:
            body: Any = request.content or None
        except httpx.RequestNotRead:  # a body still streaming in from the client: sent chunked
            body = _chunks(request.stream)  # type: ignore[arg-type]
            request.headers.pop("transfer-encoding", None)
        with _as_httpx_errors():
            response = await self._client().request(
                request.method,
                str(request.url),
                headers=[
                    (name.decode("latin-1"), value.decode("latin-1")) for name, value in request.headers.raw
                ],
                data=body,
                proxy=self._proxy_for(request.url),
                allow_redirects=False,
                compress=None,
                timeout=aiohttp.ClientTimeout(
                    total=None,
                    connect=timeout.get(
                        "pool"
                    ),  # aiohttp's `connect` is the wait for a pooled connection too
                    sock_connect=timeout.get("connect"),
                    sock_read=timeout.get("read"),
                ),
            )
        extensions: dict[str, Any] = {"http_version": b"HTTP/1.1"}
        if response.reason:
            extensions["reason_phrase"] = response.reason.encode("latin-1", "replace")
        return httpx.Response(
            response.status,
            headers=response.raw_headers,
            stream=_Body(response),
            request=request,
            extensions=extensions,
        )

    def _proxy_for(self, url: httpx.URL) -> str | None:
        key = (url.scheme, url.host)
        if key not in self._proxy_of_host:
            bypass = urllib.request.proxy_bypass_environment(url.host, self._proxies)  # type: ignore[attr-defined]  # in the stdlib, not in typeshed
            self._proxy_of_host[key] = None if bypass else self._proxies.get(url.scheme)
        return self._proxy_of_host[key]

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()


class _Body(httpx.AsyncByteStream):
    """The answer's bytes as they arrive (a stream's events are not held back to fill a buffer)."""

    def __init__(self, response: aiohttp.ClientResponse) -> None:
        self._response = response

    async def __aiter__(self) -> AsyncIterator[bytes]:
        with _as_httpx_errors():
            async for chunk in self._response.content.iter_any():
                yield chunk

    async def aclose(self) -> None:
        # Back to the pool when read to the end; a connection whose answer was not read is closed instead.
        self._response.release()


async def _chunks(stream: httpx.AsyncByteStream) -> AsyncIterator[bytes]:
    async for chunk in stream:
        yield chunk


@contextlib.contextmanager
def _as_httpx_errors() -> Iterator[None]:
    """Re-raise aiohttp's failures as the httpx exception of the same meaning (the module docstring)."""
    try:
        yield
    except (aiohttp.ClientError, TimeoutError) as error:
        raise _httpx_error(error) from error


def _httpx_error(error: BaseException) -> httpx.TransportError:
    message = str(error) or type(error).__name__
    if isinstance(error, aiohttp.ConnectionTimeoutError):  # connecting, or waiting for a pooled connection
        return httpx.ConnectTimeout(message)
    if isinstance(error, aiohttp.ServerTimeoutError | TimeoutError):  # no byte within the read timeout
        return httpx.ReadTimeout(message)
    if isinstance(error, aiohttp.ClientConnectorError):  # never connected: refused, unreachable, DNS
        return httpx.ConnectError(message)
    if isinstance(error, aiohttp.InvalidURL):
        return httpx.UnsupportedProtocol(message)
    if isinstance(
        error, aiohttp.ServerDisconnectedError | aiohttp.ClientPayloadError | aiohttp.ClientResponseError
    ):
        return httpx.RemoteProtocolError(message)
    return httpx.ReadError(message)  # a reset or another broken connection once it was made
