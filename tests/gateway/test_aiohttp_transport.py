"""The upstream's transport (aiohttp under httpx's API): answers pass through as sent, a stream's bytes as they
arrive, and each failure is the httpx exception that tells the retry policy how much the upstream may have
seen (`gateway/backends/upstream_retry.py`)."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

import httpx
import pytest

from gateway.backends.aiohttp_transport import AiohttpTransport
from gateway.backends.upstream import UpstreamBackend
from gateway.backends.upstream_retry import Unsent, refused, unsent

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


@asynccontextmanager
async def raw_server(handler: Handler) -> AsyncIterator[str]:
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            await handler(reader, writer)
        finally:
            writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.close()
        await server.wait_closed()


async def read_request(reader: asyncio.StreamReader) -> bytes:
    head = await reader.readuntil(b"\r\n\r\n")
    length = next(
        (
            int(line.split(b":")[1])
            for line in head.split(b"\r\n")
            if line.lower().startswith(b"content-length")
        ),
        0,
    )
    return head + (await reader.readexactly(length) if length else b"")


def chunk(data: bytes) -> bytes:
    return f"{len(data):x}\r\n".encode() + data + b"\r\n"


def http_answer(status: str, headers: bytes, body: bytes) -> bytes:
    """An HTTP/1.1 answer as bytes: the status, the given header lines (each ending CRLF), its length, its body."""
    return (
        b"HTTP/1.1 "
        + status.encode()
        + b"\r\n"
        + headers
        + b"Content-Length: "
        + str(len(body)).encode()
        + b"\r\n\r\n"
        + body
    )


def client(timeout: httpx.Timeout | None = None) -> httpx.AsyncClient:
    transport = AiohttpTransport(httpx.Limits(max_connections=4, keepalive_expiry=4.0))
    return httpx.AsyncClient(transport=transport, timeout=timeout or httpx.Timeout(5.0))


async def test_an_answer_and_its_headers_pass_through_unchanged() -> None:
    seen: list[bytes] = []

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        seen.append(await read_request(reader))
        body = b'{"id": "x", "gzip-looking": "\\u00e9"}'
        headers = b"Content-Type: application/json\r\nX-Upstream: a\r\nX-Upstream: b\r\n"
        writer.write(http_answer("201 Created", headers, body))
        await writer.drain()

    async with raw_server(answer) as base, client() as http:
        response = await http.post(base + "/v1/chat/completions?x=1", json={"a": 1}, headers={"X-Mine": "m"})
    assert response.status_code == 201 and response.reason_phrase == "Created"
    assert response.headers.get_list("x-upstream") == ["a", "b"]
    assert response.json() == {"id": "x", "gzip-looking": "é"}
    request = seen[0].lower()
    assert request.startswith(b"post /v1/chat/completions?x=1 http/1.1")
    assert b"x-mine: m" in request and request.endswith(b'{"a":1}')


async def test_a_stream_arrives_as_it_is_sent() -> None:
    release = asyncio.Event()

    async def stream(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(
            b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
        )
        writer.write(chunk(b"data: first\n\n"))
        await writer.drain()
        await release.wait()  # the second event only once the client has the first
        writer.write(chunk(b"data: second\n\n") + chunk(b""))
        await writer.drain()

    async with (
        raw_server(stream) as base,
        client() as http,
        http.stream("POST", base + "/v1/chat/completions", json={}) as response,
    ):
        chunks = response.aiter_bytes()
        assert await asyncio.wait_for(anext(chunks), 5) == b"data: first\n\n"
        release.set()
        assert b"".join([piece async for piece in chunks]) == b"data: second\n\n"


async def test_a_refused_connection_is_a_connect_error_that_says_refused() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]  # closed again: nothing listens there
    async with client() as http:
        with pytest.raises(httpx.ConnectError) as failure:
            await http.post(f"http://127.0.0.1:{port}/v1/chat/completions", json={})
    assert unsent(failure.value) is Unsent.NOT_SENT and refused(failure.value)


async def test_a_connection_closed_before_the_answer_is_no_answer() -> None:
    async def hang_up(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)  # and closes the connection without a word

    async with raw_server(hang_up) as base, client() as http:
        with pytest.raises(httpx.TransportError) as failure:
            await http.post(base + "/v1/chat/completions", json={})
    assert unsent(failure.value) is Unsent.NO_ANSWER and not refused(failure.value)


async def test_silence_past_the_read_timeout_is_a_read_timeout() -> None:
    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        await asyncio.sleep(1)

    async with raw_server(silent) as base, client(httpx.Timeout(0.3, connect=2.0)) as http:
        with pytest.raises(httpx.ReadTimeout) as failure:
            await http.post(base + "/v1/chat/completions", json={})
    assert unsent(failure.value) is None  # the upstream may be working on it: never sent again


def test_the_environment_proxy_is_read_once_and_no_proxy_is_honoured(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HTTPS_PROXY", "http://proxy.internal:3128")
    monkeypatch.setenv("NO_PROXY", "models.internal")
    transport = AiohttpTransport(httpx.Limits())
    assert transport._proxy_for(httpx.URL("https://api.example.com/v1")) == "http://proxy.internal:3128"
    assert transport._proxy_for(httpx.URL("https://models.internal/v1")) is None
    assert transport._proxy_for(httpx.URL("http://api.example.com/v1")) is None  # no HTTP_PROXY set


async def test_no_upstream_cookie_is_kept_or_sent_for_anyone() -> None:
    """One tenant's answer setting a cookie (a CDN's, say) must not put it on the next tenant's request."""
    seen: list[bytes] = []

    async def set_cookie(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        for _ in range(2):  # two requests on one kept-alive connection
            seen.append(await read_request(reader))
            body = b'{"data": [], "model": "m"}'
            headers = b"Content-Type: application/json\r\nSet-Cookie: __cf_bm=tenant-a; Path=/\r\n"
            writer.write(http_answer("200 OK", headers, body))
            await writer.drain()

    async with raw_server(set_cookie) as base:
        # A host name, not an address: aiohttp's default jar takes no cookie from a bare IP address.
        upstream = UpstreamBackend(base.replace("127.0.0.1", "localhost") + "/v1", None, ["m"])
        try:
            for _ in range(2):
                await upstream.embed({"model": "m", "input": "x"})
        finally:
            await upstream.close()
    assert len(seen) == 2 and all(b"cookie" not in request.lower() for request in seen)
