"""Anthropic's Messages API objects as plain dicts: a stream's events folded into the whole `message`, the
whole message unfolded into events again, an engine's text as a message, and what the cache may do with one.

Folded as the official `anthropic` SDK's stream helper folds them (`message_start`, then per content block
`content_block_start`, its deltas and `content_block_stop`, then `message_delta` and `message_stop`), so a
stored message replays into the same object. Knows dicts only.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from gateway.api.chunks import replay_pieces

Payload = dict[str, Any]
# Stop reasons of an answer that may be replayed; "refusal" (and anything unknown) is never stored.
STORABLE_STOPS = frozenset({"end_turn", "stop_sequence", "max_tokens", "tool_use", "pause_turn"})


def accumulate_message(events: Sequence[Mapping[str, Any]]) -> Payload:
    """The `message` a stream of events adds up to ({} when it never started)."""
    whole: Payload = {}
    partial_json: dict[int, str] = {}
    for event in events:
        kind = event.get("type")
        if kind == "message_start":
            whole = copy.deepcopy(dict(event.get("message") or {}))
            whole["content"] = list(whole.get("content") or [])
        elif kind == "content_block_start":
            index = int(event.get("index", len(whole.get("content", []))))
            block = copy.deepcopy(dict(event.get("content_block") or {}))
            content = whole.setdefault("content", [])
            while len(content) <= index:
                content.append({})
            content[index] = block
        elif kind == "content_block_delta":
            index = int(event.get("index", 0))
            block = whole["content"][index]
            delta = event.get("delta") or {}
            if delta.get("type") == "text_delta":
                block["text"] = block.get("text", "") + str(delta.get("text", ""))
            elif delta.get("type") == "input_json_delta":
                partial_json[index] = partial_json.get(index, "") + str(delta.get("partial_json", ""))
            elif delta.get("type") == "thinking_delta":
                block["thinking"] = block.get("thinking", "") + str(delta.get("thinking", ""))
            elif delta.get("type") == "signature_delta":
                block["signature"] = str(delta.get("signature", ""))
            elif delta.get("type") == "citations_delta":
                block.setdefault("citations", []).append(delta.get("citation"))
        elif kind == "content_block_stop":
            index = int(event.get("index", 0))
            if index in partial_json:
                whole["content"][index]["input"] = json.loads(partial_json.pop(index) or "{}")
        elif kind == "message_delta":
            whole.update(event.get("delta") or {})
            usage = event.get("usage") or {}
            whole["usage"] = {
                **(whole.get("usage") or {}),
                **{k: v for k, v in usage.items() if v is not None},
            }
    return whole


def message_events(whole: Mapping[str, Any]) -> Iterator[Payload]:
    """The events of a stream that folds (`accumulate_message`, or the SDK) into `whole`."""
    usage = dict(whole.get("usage") or {})
    started = {**whole, "content": [], "stop_reason": None, "stop_sequence": None}
    started["usage"] = {**usage, "output_tokens": 0}
    yield {"type": "message_start", "message": started}
    for index, block in enumerate(whole.get("content") or []):
        kind = block.get("type")
        if kind == "text":
            yield {"type": "content_block_start", "index": index, "content_block": {**block, "text": ""}}
            for piece in replay_pieces(str(block.get("text") or "")):
                yield _delta(index, {"type": "text_delta", "text": piece})
        elif kind == "tool_use":
            yield {"type": "content_block_start", "index": index, "content_block": {**block, "input": {}}}
            for piece in replay_pieces(json.dumps(block.get("input") or {})):
                yield _delta(index, {"type": "input_json_delta", "partial_json": piece})
        elif kind == "thinking":
            yield {
                "type": "content_block_start",
                "index": index,
                "content_block": {**block, "thinking": "", "signature": ""},
            }
            for piece in replay_pieces(str(block.get("thinking") or "")):
                yield _delta(index, {"type": "thinking_delta", "thinking": piece})
            yield _delta(index, {"type": "signature_delta", "signature": str(block.get("signature") or "")})
        else:
            yield {"type": "content_block_start", "index": index, "content_block": dict(block)}
        yield {"type": "content_block_stop", "index": index}
    delta = {"stop_reason": whole.get("stop_reason"), "stop_sequence": whole.get("stop_sequence")}
    yield {"type": "message_delta", "delta": delta, "usage": {"output_tokens": usage.get("output_tokens", 0)}}
    yield {"type": "message_stop"}


def message_from_text(
    *, model: str, text: str, finish_reason: str, input_tokens: int, output_tokens: int, message_id: str
) -> Payload:
    """The engine's answer as a Messages `message`."""
    return {
        "id": message_id,
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": [{"type": "text", "text": text}],
        "stop_reason": "max_tokens" if finish_reason == "length" else "end_turn",
        "stop_sequence": None,
        "usage": {"input_tokens": input_tokens, "output_tokens": output_tokens},
    }


def storable_message(whole: Mapping[str, Any]) -> bool:
    return (
        whole.get("type") == "message"
        and whole.get("stop_reason") in STORABLE_STOPS
        and bool(whole.get("content"))
    )


def plain_text_message(whole: Mapping[str, Any]) -> bool:
    """Text blocks only (thinking beside them allowed), ended by the model: what a semantic hit may serve."""
    blocks = whole.get("content") or []
    return whole.get("stop_reason") in ("end_turn", "stop_sequence") and all(
        block.get("type") in ("text", "thinking", "redacted_thinking") for block in blocks
    )


def message_text(whole: Mapping[str, Any]) -> str:
    return "".join(
        str(block.get("text") or "") for block in whole.get("content") or [] if block.get("type") == "text"
    )


def _delta(index: int, delta: Payload) -> Payload:
    return {"type": "content_block_delta", "index": index, "delta": delta}
