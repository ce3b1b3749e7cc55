"""OpenAI's Responses API objects as plain dicts: a stored `response` unfolded into the event sequence a stream
delivers (`response.created` ... `response.completed`), and what the cache may do with one.

A streamed miss needs no folding here: its `response.completed` event carries the whole response. A streamed
hit replays the events the SDK's stream helper reads: each output item added, its text, refusal or function
arguments in deltas, done, and the whole response last. Knows dicts only.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from gateway.api.chunks import replay_pieces

Payload = dict[str, Any]


def response_events(whole: Mapping[str, Any]) -> Iterator[Payload]:
    """The stream of events that ends in `whole` (`response.completed`), numbered from 0."""
    numbers = itertools.count()

    def event(kind: str, **fields: Any) -> Payload:
        return {"type": kind, "sequence_number": next(numbers), **fields}

    pending = {**whole, "status": "in_progress", "output": [], "usage": None}
    yield event("response.created", response=pending)
    yield event("response.in_progress", response=pending)
    for position, item in enumerate(whole.get("output") or []):
        kind = item.get("type")
        item_id = item.get("id", "")
        if kind == "message":
            yield event(
                "response.output_item.added",
                output_index=position,
                item={**item, "status": "in_progress", "content": []},
            )
            for part_index, part in enumerate(item.get("content") or []):
                yield from _part_events(event, item_id, position, part_index, part)
        elif kind == "function_call":
            arguments = str(item.get("arguments") or "")
            yield event(
                "response.output_item.added",
                output_index=position,
                item={**item, "arguments": "", "status": "in_progress"},
            )
            for piece in replay_pieces(arguments):
                yield event(
                    "response.function_call_arguments.delta",
                    item_id=item_id,
                    output_index=position,
                    delta=piece,
                )
            yield event(
                "response.function_call_arguments.done",
                item_id=item_id,
                output_index=position,
                arguments=arguments,
                name=item.get("name"),
            )
        else:  # reasoning and every other item: added and done whole
            yield event("response.output_item.added", output_index=position, item=item)
        yield event("response.output_item.done", output_index=position, item=item)
    yield event("response.completed", response=dict(whole))


def completed_response(events: Sequence[Mapping[str, Any]]) -> Payload | None:
    """The whole response a stream of events ended with, or None when it never completed."""
    for event in reversed(events):
        if event.get("type") == "response.completed" and isinstance(event.get("response"), dict):
            return dict(event["response"])
    return None


def storable_response(whole: Mapping[str, Any]) -> bool:
    """Completed, with output, and no refusal in it."""
    if whole.get("status") != "completed" or not whole.get("output"):
        return False
    return not any(part.get("type") == "refusal" for part in _parts(whole))


def plain_text_response(whole: Mapping[str, Any]) -> bool:
    """Messages of text only (reasoning beside them allowed): no tool call, refusal or logprobs."""
    for item in whole.get("output") or []:
        if item.get("type") not in ("message", "reasoning"):
            return False
    return all(part.get("type") == "output_text" and not part.get("logprobs") for part in _parts(whole))


def response_text(whole: Mapping[str, Any]) -> str:
    return "".join(str(part.get("text") or "") for part in _parts(whole) if part.get("type") == "output_text")


def _parts(whole: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    return [
        part
        for item in whole.get("output") or []
        if item.get("type") == "message"
        for part in item.get("content") or []
    ]


def _part_events(
    event: Any, item_id: str, position: int, part_index: int, part: Mapping[str, Any]
) -> Iterator[Payload]:
    where = {"item_id": item_id, "output_index": position, "content_index": part_index}
    if part.get("type") == "refusal":
        refusal = str(part.get("refusal") or "")
        yield event("response.content_part.added", **where, part={**part, "refusal": ""})
        for piece in replay_pieces(refusal):
            yield event("response.refusal.delta", **where, delta=piece)
        yield event("response.refusal.done", **where, refusal=refusal)
    else:
        text = str(part.get("text") or "")
        yield event("response.content_part.added", **where, part={**part, "text": "", "annotations": []})
        for piece in replay_pieces(text):
            yield event("response.output_text.delta", **where, delta=piece, logprobs=[])
        yield event("response.output_text.done", **where, text=text, logprobs=part.get("logprobs") or [])
    yield event("response.content_part.done", **where, part=dict(part))
