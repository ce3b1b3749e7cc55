"""The Redis Stream of changes to the store, which every kvgate process tails to keep its index in sync.

Each add carries the new entry's vector, so a follower can index it without reading the entry back;
each delete names its scope and up to a batch of entry ids. The stream is capped (approximate
MAXLEN); a follower that fell behind the cap, or that finds the stream gone (Redis restarted without
persistence), is told so by `missed_since` and must rebuild its index from the store.

Knows the stream's key and wire format; knows nothing about entries' other fields, FAISS or HTTP.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import numpy.typing as npt
import redis.asyncio as aioredis
from redis.exceptions import ResponseError
from redis.typing import EncodableT, FieldT

Vectors = npt.NDArray[np.float32]
RedisClient = aioredis.Redis | aioredis.RedisCluster
StreamId = str

START: StreamId = "0-0"


@dataclass(frozen=True, slots=True)
class Change:
    """One event: `add` (one entry, with its vector) or `delete` (one or more entries of a scope)."""

    stream_id: StreamId
    op: Literal["add", "delete"]
    scope_id: str
    entry_ids: tuple[str, ...]
    vector: Vectors | None = None  # (dimension,) for an add
    expires: float | None = None  # epoch seconds for an add with a TTL


class ChangeFeed:
    """Publish and read the change stream at `key` (one key: in a cluster it lives on one slot)."""

    def __init__(self, client: RedisClient, key: str, maxlen: int = 10_000) -> None:
        self.client = client
        self.key = key
        self.maxlen = maxlen

    async def publish_add(
        self, scope_id: str, entry_id: str, vector: Vectors, expires: float | None
    ) -> StreamId:
        fields: dict[FieldT, EncodableT] = {
            "op": "add",
            "scope": scope_id,
            "ids": entry_id,
            "vec": np.ascontiguousarray(vector, dtype=np.float32).tobytes(),
            "exp": repr(expires or 0.0),
        }
        return await self._xadd(fields)

    async def publish_delete(self, scope_id: str, entry_ids: list[str]) -> StreamId:
        # Entry ids are URL-safe base64: a comma never occurs in one.
        delete: dict[FieldT, EncodableT] = {"op": "delete", "scope": scope_id, "ids": ",".join(entry_ids)}
        return await self._xadd(delete)

    async def last_id(self) -> StreamId:
        """The id of the newest event, or `START` for an empty stream: follow from here."""
        newest = await self.client.xrevrange(self.key, count=1)
        return START if not newest else _text(newest[0][0])

    async def read(self, after: StreamId, *, block_ms: int = 1000, count: int = 512) -> list[Change]:
        """Events newer than `after`, waiting up to `block_ms` for the first one."""
        reply = await self.client.xread({self.key: after}, count=count, block=block_ms)
        if not reply:
            return []
        changes: list[Change] = []
        for stream_id, fields in _entries(reply):
            changes.append(_decode(_text(stream_id), fields))
        return changes

    async def missed_since(self, after: StreamId) -> bool:
        """Whether events newer than `after` are gone (trimmed, or the stream vanished with Redis).

        Trimming only drops the oldest events, so nothing after `after` is lost while `after` itself is
        still there or still newer than the first event. (When `after` was trimmed but its successor was
        not, this says True: a needless rebuild, never a silent gap.)
        """
        try:
            info = await self.client.xinfo_stream(self.key)
        except ResponseError:  # no such key
            return after != START
        if after == START:
            return int(info.get("entries-added", 0)) > int(info.get("length", 0))
        first = info.get("first-entry")
        if not first or _order(_text(first[0])) <= _order(after):
            return False
        return not await self.client.xrange(self.key, min=after, max=after, count=1)

    async def _xadd(self, fields: dict[FieldT, EncodableT]) -> StreamId:
        stream_id = await self.client.xadd(self.key, fields, maxlen=self.maxlen, approximate=True)
        return _text(stream_id)


def _entries(reply: Any) -> list[tuple[Any, dict[Any, Any]]]:
    # RESP2 gives [[key, [(id, fields), ...]]], RESP3 gives {key: [[(id, fields), ...]]}.
    if isinstance(reply, dict):
        streams = list(reply.values())
        return [entry for stream in streams for batch in stream for entry in batch]
    return [entry for _, batch in reply for entry in batch]


def _decode(stream_id: StreamId, fields: dict[Any, Any]) -> Change:
    values = {_text(name): value for name, value in fields.items()}
    op = _text(values["op"])
    entry_ids = tuple(_text(values["ids"]).split(","))
    scope_id = _text(values["scope"])
    if op == "add":
        vector = np.frombuffer(values["vec"], dtype=np.float32).copy()
        expires = float(_text(values["exp"])) or None
        return Change(stream_id, "add", scope_id, entry_ids, vector, expires)
    if op == "delete":
        return Change(stream_id, "delete", scope_id, entry_ids)
    raise ValueError(f"unknown change op {op!r} at {stream_id}")


def _order(stream_id: StreamId) -> tuple[int, int]:
    milliseconds, _, sequence = stream_id.partition("-")
    return int(milliseconds), int(sequence or 0)


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
