"""The engine's text of a tool call, `{"name": "f", "arguments": {...}}`, as the `chat.completion.chunk`s of
OpenAI's tool-call stream: the role, then the call (its id, type and name) once the name is generated, then
its arguments in pieces as they are generated, the finish reason ("tool_calls", or "length" when cut), and
the usage. Folded (the SDK's stream helper, `gateway.api.chunks.accumulate_chat`) they make the message
`{"role": "assistant", "content": null, "tool_calls": [{"id", "type": "function", "function": {"name",
"arguments": <JSON text>}}]}`.

The grammar generates the call without free whitespace and with `name` first, so the arguments are the text
between `"arguments": ` and the call's closing brace, which is held back until the call is complete.
"""

from __future__ import annotations

import json
import re
import time
from typing import Any

from gateway.api.ids import random_hex

_HEAD = re.compile(r'\{\s*"name"\s*:\s*("(?:[^"\\]|\\.)*")\s*,\s*"arguments"\s*:\s*')

Payload = dict[str, Any]


class ToolCallChunks:
    """Folds one generation's text deltas into tool-call chunks."""

    def __init__(self, model: str) -> None:
        self.model = model
        self.id = "chatcmpl-" + random_hex(12)
        self.call_id = "call_" + random_hex(12)
        self.created = int(time.time())
        self._text = ""
        self._arguments_start: int | None = None
        self._sent = 0  # characters of the arguments already sent
        self._opened = False

    def add(self, text: str) -> list[Payload]:
        """Chunks for newly generated text (none while the name is still being written)."""
        chunks = [] if self._opened else [self._chunk({"role": "assistant", "content": None})]
        self._opened = True
        self._text += text
        if self._arguments_start is None:
            head = _HEAD.match(self._text)
            if head is None:
                return chunks
            self._arguments_start = head.end()
            name = json.loads(head.group(1))
            call = {
                "index": 0,
                "id": self.call_id,
                "type": "function",
                "function": {"name": name, "arguments": ""},
            }
            chunks.append(self._chunk({"tool_calls": [call]}))
        # Hold back the last character: it may be the call's own closing brace.
        chunks.extend(self._arguments(len(self._text) - 1))
        return chunks

    def finish(self, complete: bool, usage: Payload) -> list[Payload]:
        """The last chunks: the rest of the arguments, the finish reason, the usage. `complete`: the call was
        generated whole (else max_tokens cut it, and what there is of it is sent)."""
        chunks = self.add("")
        if self._arguments_start is not None:
            end = len(self._text) - 1 if complete else len(self._text)
            chunks.extend(self._arguments(end))
        chunks.append(self._chunk({}, "tool_calls" if complete else "length"))
        chunks.append({**self._head(), "choices": [], "usage": usage})
        return chunks

    def _arguments(self, end: int) -> list[Payload]:
        assert self._arguments_start is not None
        piece = self._text[self._arguments_start + self._sent : end]
        if not piece:
            return []
        self._sent += len(piece)
        return [self._chunk({"tool_calls": [{"index": 0, "function": {"arguments": piece}}]})]

    def _chunk(self, delta: Payload, finish_reason: str | None = None) -> Payload:
        return {
            **self._head(),
            "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}],
        }

    def _head(self) -> Payload:
        return {
            "id": self.id,
            "object": "chat.completion.chunk",
            "created": self.created,
            "model": self.model,
        }
