"""The stream chunks of an engine answer with several choices, logprobs or tool calls, as OpenAI sends them.

A plain engine answer (one choice of text, no logprobs) is rendered from text by `http/rendering.py`; any
other is built here as whole `chat.completion.chunk` / `text_completion` chunk dicts, so that it travels
like an upstream's stream: relayed to a streaming client, folded (`chunks.accumulate_chat` /
`accumulate_text`) into the JSON answer and the stored object. Chunks carry their choice's `index`; every
choice's finish comes at the end, then one usage chunk (dropped for a client that did not ask for it). In a
tool-call answer each choice's text is a call, turned into `tool_calls` deltas by its own
`ToolCallDeltas`; a choice finished by its grammar finishes with "tool_calls".

Logprobs, per token: chat's `{token, logprob, bytes, top_logprobs: [{token, logprob, bytes}]}` under
`logprobs.content`, and legacy completions' `{tokens, token_logprobs, top_logprobs: [{token: logprob}],
text_offset}`. `bytes` are the UTF-8 bytes of `token`, the text the token added to the answer (a token that
ends inside a character adds "" and the next one the whole character), so the tokens join to the text.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from gateway.api.ids import random_hex
from gateway.api.tool_call_deltas import ToolCallDeltas

Payload = dict[str, Any]


class ScoredToken(Protocol):
    """One token of an answer with its log-probability and the most likely alternatives' (the engine's)."""

    @property
    def token(self) -> str: ...
    @property
    def logprob(self) -> float: ...
    @property
    def top(self) -> Sequence[tuple[str, float]]: ...


@dataclass(slots=True)
class ChoiceChunks:
    """Builds the chunks of one answer: chat or legacy completion, one id and timestamp. `tool_calls`: every
    choice is a tool call (chat only)."""

    chat: bool
    model: str
    n: int
    tool_calls: bool = False
    id: str = ""
    created: int = field(default_factory=lambda: int(time.time()))
    _offsets: dict[int, int] = field(default_factory=dict)  # legacy: characters sent per choice
    _calls: dict[int, ToolCallDeltas] = field(default_factory=dict)  # tool calls: one per choice

    def __post_init__(self) -> None:
        if not self.id:
            self.id = ("chatcmpl-" if self.chat else "cmpl-") + random_hex(12)
        if self.tool_calls:
            if not self.chat:
                raise ValueError("only chat answers have tool calls")
            self._calls = {index: ToolCallDeltas() for index in range(self.n)}

    def opening(self) -> list[Payload]:
        """Chat's first chunk per choice carries the role; legacy completions have none."""
        if not self.chat:
            return []
        role: Payload = {"role": "assistant", "content": None if self.tool_calls else ""}
        return [self._choice(index, role) for index in range(self.n)]

    def text(self, index: int, text: str, logprobs: Sequence[ScoredToken] | None) -> list[Payload]:
        """A choice's new text with its tokens' logprobs (None when the request asked for none): the chunks
        to send, none when there is nothing yet."""
        if self.tool_calls:
            return [self._choice(index, delta) for delta in self._calls[index].add(text)]
        if not text and not logprobs:
            return []
        if self.chat:
            scored = None if logprobs is None else {"content": chat_logprobs(logprobs), "refusal": None}
            return [self._choice(index, {"content": text}, scored)]
        offset = self._offsets.get(index, 0)
        self._offsets[index] = offset + len(text)
        legacy = None if logprobs is None else completion_logprobs(logprobs, offset)
        return [self._chunk({"index": index, "text": text, "logprobs": legacy, "finish_reason": None})]

    def finish(self, finish_reasons: Sequence[str]) -> list[Payload]:
        """Each choice's last chunks: the rest of a tool call's arguments, then its finish reason ("stop"
        becomes "tool_calls" in a tool-call answer)."""
        if not self.chat:
            return [
                self._chunk({"index": index, "text": "", "logprobs": None, "finish_reason": reason})
                for index, reason in enumerate(finish_reasons)
            ]
        chunks: list[Payload] = []
        for index, reason in enumerate(finish_reasons):
            if self.tool_calls:
                complete = reason == "stop"
                chunks.extend(self._choice(index, delta) for delta in self._calls[index].finish(complete))
                reason = "tool_calls" if complete else reason
            chunks.append(self._choice(index, {}, finish_reason=reason))
        return chunks

    def usage(self, usage: Mapping[str, Any]) -> Payload:
        return {**self._chunk(None), "choices": [], "usage": dict(usage)}

    def _choice(
        self, index: int, delta: Payload, logprobs: Payload | None = None, finish_reason: str | None = None
    ) -> Payload:
        """A chat chunk of one choice."""
        return self._chunk(
            {"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": finish_reason}
        )

    def _chunk(self, choice: Payload | None) -> Payload:
        kind = "chat.completion.chunk" if self.chat else "text_completion"
        head: Payload = {"id": self.id, "object": kind, "created": self.created, "model": self.model}
        return {**head, "choices": [] if choice is None else [choice]}


def chat_logprobs(tokens: Sequence[ScoredToken]) -> list[Payload]:
    """Chat's `logprobs.content` entries."""
    return [
        {
            "token": entry.token,
            "logprob": entry.logprob,
            "bytes": list(entry.token.encode()),
            "top_logprobs": [
                {"token": token, "logprob": logprob, "bytes": list(token.encode())}
                for token, logprob in entry.top
            ],
        }
        for entry in tokens
    ]


def completion_logprobs(tokens: Sequence[ScoredToken], offset: int) -> Payload:
    """Legacy completions' `logprobs` for tokens whose text starts `offset` characters into the answer."""
    text_offset = []
    for entry in tokens:
        text_offset.append(offset)
        offset += len(entry.token)
    return {
        "tokens": [entry.token for entry in tokens],
        "token_logprobs": [entry.logprob for entry in tokens],
        "top_logprobs": [dict(entry.top) for entry in tokens],
        "text_offset": text_offset,
    }
