"""The wire format between the engine process and the gateway's workers: one JSON object per line.

A local unix socket carries few, small messages (a request, then one message per step with new text), so
newline-delimited JSON over asyncio streams is enough: no framing library, readable with `socat` when
debugging. `EngineStats` travels as a plain dict (`stats_to_wire` / `stats_from_wire`).
"""

from __future__ import annotations

import asyncio
import json
import socket
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

from engine.metrics import EngineStats, Histogram

if TYPE_CHECKING:  # torch: the supervisor imports this module for `ask_blocking` and must stay light
    from engine.logprobs import TokenLogprob
    from engine.sampler import SamplingParams

MAX_LINE_BYTES = 64 * 1024 * 1024  # a 32k-token prompt as JSON ids is ~200 kB; chat text can be larger

Message = dict[str, Any]


class ConnectionClosed(ConnectionError):
    """The other side went away (its process exited, or it closed the socket)."""


async def send(writer: asyncio.StreamWriter, message: Message) -> None:
    writer.write(json.dumps(message, separators=(",", ":")).encode() + b"\n")
    await writer.drain()


async def receive(reader: asyncio.StreamReader) -> Message:
    """The next message; raises `ConnectionClosed` at the end of the stream."""
    try:
        line = await reader.readline()
    except (ConnectionError, asyncio.IncompleteReadError) as error:
        raise ConnectionClosed(str(error)) from error
    if not line:
        raise ConnectionClosed("the peer closed the connection")
    message = json.loads(line)
    if not isinstance(message, dict):
        raise ValueError(f"expected a JSON object, got {type(message).__name__}")
    return message


async def open_connection(path: str) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    return await asyncio.open_unix_connection(path, limit=MAX_LINE_BYTES)


def ask_blocking(path: Path, message: Message, timeout_s: float = 5.0) -> Message | None:
    """One request and its reply on a fresh connection, without an event loop (the supervisor's probes);
    None when nothing answers."""
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as peer:
            peer.settimeout(timeout_s)
            peer.connect(str(path))
            peer.sendall(json.dumps(message).encode() + b"\n")
            reply = json.loads(peer.makefile("rb").readline())
    except (OSError, ValueError):
        return None
    return reply if isinstance(reply, dict) else None


def sampling_to_wire(sampling: SamplingParams) -> Message:
    return asdict(sampling)


def sampling_from_wire(data: Message) -> SamplingParams:
    from engine.sampler import SamplingParams

    return SamplingParams(
        temperature=float(data["temperature"]),
        top_k=None if data.get("top_k") is None else int(data["top_k"]),
        top_p=float(data["top_p"]),
        seed=None if data.get("seed") is None else int(data["seed"]),
        max_tokens=int(data["max_tokens"]),
        stop_token_ids=tuple(int(token) for token in data.get("stop_token_ids", ())),
        stop=tuple(str(text) for text in data.get("stop", ())),
        ignore_eos=bool(data.get("ignore_eos", False)),
        n=int(data.get("n", 1)),
        logprobs=None if data.get("logprobs") is None else int(data["logprobs"]),
        presence_penalty=float(data.get("presence_penalty", 0.0)),
        frequency_penalty=float(data.get("frequency_penalty", 0.0)),
        logit_bias=tuple((int(token), float(bias)) for token, bias in data.get("logit_bias", ())),
        grammar=None if data.get("grammar") is None else str(data["grammar"]),
    )


def logprobs_to_wire(logprobs: tuple[TokenLogprob, ...]) -> list[Any]:
    """[[token, logprob, [[token, logprob], ...]], ...]: compact, as a step sends one per token."""
    return [[entry.token, entry.logprob, [list(pair) for pair in entry.top]] for entry in logprobs]


def logprobs_from_wire(data: list[Any]) -> tuple[TokenLogprob, ...]:
    from engine.logprobs import TokenLogprob

    return tuple(
        TokenLogprob(str(token), float(logprob), tuple((str(alt), float(value)) for alt, value in top))
        for token, logprob, top in data
    )


def stats_to_wire(stats: EngineStats) -> Message:
    return asdict(stats)


def stats_from_wire(data: Message) -> EngineStats:
    def histogram(raw: Message) -> Histogram:
        return Histogram(tuple(raw["buckets"]), list(raw["counts"]), float(raw["total"]), int(raw["count"]))

    return EngineStats(
        num_running=int(data["num_running"]),
        num_waiting=int(data["num_waiting"]),
        kv_cache_usage=float(data["kv_cache_usage"]),
        prefix_cache_queries=int(data["prefix_cache_queries"]),
        prefix_cache_hits=int(data["prefix_cache_hits"]),
        num_preemptions=int(data["num_preemptions"]),
        prompt_tokens=int(data["prompt_tokens"]),
        generation_tokens=int(data["generation_tokens"]),
        finished={str(key): int(value) for key, value in data["finished"].items()},
        time_to_first_token=histogram(data["time_to_first_token"]),
        inter_token_latency=histogram(data["inter_token_latency"]),
    )
