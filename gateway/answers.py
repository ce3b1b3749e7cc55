"""What the cache keeps of an answer: the stored format, and the pieces each API's adapter (`gateway/apis/`)
builds its whole object and its storage rule from.

The stored answer is the whole object the backend sent (`StoredAnswer`): OpenAI's `chat.completion` or
`text_completion`, a Responses `response`, an Anthropic `message`. Never stored: a refusal, a `content_filter`
finish, an answer that did not complete; an answer that is not plain text (tool calls, logprobs, several
choices) serves the same request only. The service reads a stored answer on every hit.
"""

from __future__ import annotations

import functools
import json
import time
from typing import Any

import pydantic_core

from gateway.api.anthropic_objects import message_text
from gateway.api.chunks import (
    accumulate_chat,
    accumulate_text,
    answer_text,
    finish_reasons,
    refused,
    whole_from_text,
)
from gateway.api.ids import random_hex
from gateway.api.objects import Usage
from gateway.api.response_objects import response_text
from gateway.backends.protocol import Chunk, Finished, GenerationEvent, TextDelta, Whole

# The stored answer's format: 2 is the whole response object (the first held its text only).
STORED_FORMAT = 2


class StoredAnswer:
    """What the cache keeps for a request: the whole response object as the backend sent it, as JSON text
    (`whole_json`; parsed only when a replay needs it: a Responses hit sends the text as it is), and what the
    hit-rate figures need. Chat, completions and Messages replays get a new `id` (and `created`).

    Entries stored before whole objects were (`{"text", "finish_reason", ...}`) are read as the one-choice
    object kvgate rendered for them."""

    __slots__ = ("__dict__", "completion_tokens", "generation_s", "prompt_tokens", "whole_json")

    def __init__(
        self, whole_json: str, prompt_tokens: int, completion_tokens: int, generation_s: float
    ) -> None:
        self.whole_json = whole_json
        self.prompt_tokens = prompt_tokens
        self.completion_tokens = completion_tokens
        self.generation_s = generation_s

    @classmethod
    def of(
        cls, whole: dict[str, Any], prompt_tokens: int, completion_tokens: int, generation_s: float
    ) -> StoredAnswer:
        return cls(pydantic_core.to_json(whole).decode(), prompt_tokens, completion_tokens, generation_s)

    @functools.cached_property
    def whole(self) -> dict[str, Any]:
        whole: dict[str, Any] = pydantic_core.from_json(self.whole_json)
        return whole

    @property
    def finish_reason(self) -> str:
        reasons = finish_reasons(self.whole)
        return reasons[0] if reasons else "stop"

    @property
    def text(self) -> str:
        return answer_text(self.whole) or message_text(self.whole) or response_text(self.whole)

    def to_json(self) -> str:
        return json.dumps(
            {
                "v": STORED_FORMAT,
                "whole": self.whole_json,
                "prompt_tokens": self.prompt_tokens,
                "completion_tokens": self.completion_tokens,
                "generation_s": round(self.generation_s, 4),
            },
            separators=(",", ":"),
        )

    @classmethod
    def from_json(cls, raw: str, *, chat: bool, model: str) -> StoredAnswer:
        data = pydantic_core.from_json(raw)  # a hit's hot path: Rust's parser, a third of json.loads' time
        prompt_tokens, completion_tokens = int(data["prompt_tokens"]), int(data["completion_tokens"])
        generation_s = float(data.get("generation_s", 0.0))
        if data.get("v") == STORED_FORMAT:
            whole_json = data["whole"]
            if not isinstance(whole_json, str):  # the object itself rather than its text: read it too
                whole_json = pydantic_core.to_json(whole_json).decode()
            return cls(whole_json, prompt_tokens, completion_tokens, generation_s)
        usage = _usage(prompt_tokens, completion_tokens, cached=prompt_tokens).model_dump()
        whole = whole_from_text(  # the first format: the text and its finish reason
            chat=chat,
            model=model,
            text=str(data["text"]),
            finish_reason=str(data["finish_reason"]),
            usage=usage,
            response_id="",
            created=0,
        )
        return cls.of(whole, prompt_tokens, completion_tokens, generation_s)


def storable(whole: dict[str, Any], store_truncated: bool) -> bool:
    """May this answer be replayed to the next identical request? Never a refusal (it reaches the client as
    sent, and the next request asks again: a refusal often follows moderation that changes, and a stored one
    would answer every identical request until it expires), nor an answer a content filter cut or that has
    no choice; a `length` cut only when `store_truncated`."""
    reasons = finish_reasons(whole)
    if not reasons or refused(whole) or "content_filter" in reasons or "None" in reasons:
        return False
    return store_truncated or "length" not in reasons


def sent_whole(events: list[GenerationEvent]) -> dict[str, Any] | None:
    """The upstream's own whole object, when it sent one."""
    for event in events:
        if isinstance(event, Whole):
            return event.payload
    return None


def chunks_of(events: list[GenerationEvent]) -> list[dict[str, Any]]:
    """An upstream stream's chunks, as it sent them."""
    return [event.payload for event in events if isinstance(event, Chunk)]


def text_of(events: list[GenerationEvent]) -> str:
    """The engine's text."""
    return "".join(event.text for event in events if isinstance(event, TextDelta))


def openai_whole(
    events: list[GenerationEvent], finished: Finished, *, chat: bool, model: str
) -> dict[str, Any]:
    """A chat or legacy completion's whole object: the upstream's own, its chunks folded as the SDK folds
    them, or the engine's text as kvgate renders it."""
    sent = sent_whole(events)
    if sent is not None:
        return sent
    chunks = chunks_of(events)
    if chunks:
        return accumulate_chat(chunks) if chat else accumulate_text(chunks)
    return whole_from_text(
        chat=chat,
        model=model,
        text=text_of(events),
        finish_reason=finished.finish_reason,
        usage=usage_of(finished).model_dump(),
        response_id=("chatcmpl-" if chat else "cmpl-") + random_hex(12),
        created=int(time.time()),
    )


def usage_of(finished: Finished) -> Usage:
    return _usage(finished.prompt_tokens, finished.completion_tokens, cached=finished.cached_tokens)


def _usage(prompt: int, completion: int, cached: int) -> Usage:
    return Usage(
        prompt_tokens=prompt,
        completion_tokens=completion,
        total_tokens=prompt + completion,
        prompt_tokens_details={"cached_tokens": cached},
    )
